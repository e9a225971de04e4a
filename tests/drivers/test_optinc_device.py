"""The OptINC device in the testbed: the device, its testbed entry, the optinc collective.

Unit tests drive `OptincDevice` frame by frame; one test runs the agents' executor through the
emulated fabric in-process; the end-to-end test starts the real processes (as test_e2e.py)
from a copy of the emulated testbed with a noiseless device, so every result must equal the
exact quantised expectation.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from core_parts import go_of, ready, register_all, unconnected_core
from helpers import EMULATED, wait_until

from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.optinc import optinc_encode, optinc_expected, optinc_scale, run_optinc
from oddl.agents.links.zeromq import FabricLink
from oddl.agents.slot_gate import SlotGate
from oddl.common.config import load_testbed, parse_testbed
from oddl.common.errors import CollectiveError, ConfigError, OperationRefused
from oddl.controller.optinc_schedule import optinc_schedule
from oddl.controller.testbed_model import timing_from_config
from oddl.drivers.emulators.host import start_emulated_testbed
from oddl.drivers.emulators.optinc import LEVELS_STEP, SCALE_STEP, OptincDevice, startup_phases
from oddl.offline.optinc import model as om

NODES = ("n0", "n1", "n2", "n3")
BITS = 8


@pytest.fixture(scope="module")
def network() -> om.OptincNetwork:
    net = startup_phases(4, BITS, seed=3)
    net.noise_rad = 0.0
    return net


def _device(network: om.OptincNetwork, max_elements: int = 1 << 20) -> OptincDevice:
    return OptincDevice("optinc0", network, max_elements, latency_s=1e-6)


def _head(rank: int, step: int, seq: int = 1, nodes: tuple[str, ...] = NODES,
          **extra: Any) -> dict[str, Any]:
    return {"job": "j", "seq": seq, "step": step, "src": nodes[rank], "dst": "optinc0",
            "net": "optinc", "rank": rank, "nodes": list(nodes), **extra}


def _levels_frames(arrays: list[np.ndarray], scale: float) -> list[tuple[dict, bytes]]:
    out = []
    for r, a in enumerate(arrays):
        lv = optinc_encode(a, BITS, scale)
        out.append((_head(r, LEVELS_STEP, bits=BITS, elems=a.size, scale=scale,
                          dtype=lv.dtype.str), lv.tobytes()))
    return out


# ---- the device, frame by frame ---------------------------------------------------------


def test_device_agrees_the_scale_then_returns_the_exact_quantised_mean(network):
    dev = _device(network)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(50_001).astype(np.float32) * (r + 1) for r in range(4)]
    maxabs = [float(np.max(np.abs(a))) for a in arrays]
    outs: list = []
    for r in range(4):
        outs = dev.offer(NODES[r], _head(r, SCALE_STEP, maxabs=maxabs[r]), b"", 10.0 + r)
        assert (outs == []) == (r < 3)
    assert [o.dst for o in outs] == list(NODES)
    assert all(o.header["maxabs"] == max(maxabs) and o.at == pytest.approx(13.0 + 1e-6)
               for o in outs)
    scale = optinc_scale(max(maxabs), BITS)
    for r, (head, payload) in enumerate(_levels_frames(arrays, scale)):
        outs = dev.offer(NODES[r], head, payload, 20.0)
    levels = np.frombuffer(outs[0].payload, dtype=np.uint8)
    want = om.exact_mean(np.stack([optinc_encode(a, BITS, scale) for a in arrays], axis=1))
    assert np.array_equal(levels, want)
    assert all(o.header["scale"] == scale and o.header["elems"] == 50_001 for o in outs)
    decoded = (levels.astype(np.float32) - 128) * np.float32(scale * 4)
    assert np.array_equal(decoded, optinc_expected(arrays, BITS))
    stats = dev.stats_dict()
    assert stats["passes"] == 1 and stats["elements"] == 50_001
    assert stats["inexact_elements"] == 0 and stats["elements_per_s"] > 0


def test_noisy_optics_miss_some_levels_and_the_device_counts_them():
    net = startup_phases(4, BITS, seed=4)
    net.noise_rad = 0.1  # far above the 0.02 rad trained for: each pass misses some elements
    dev = _device(net)
    rng = np.random.default_rng(2)
    missed = 0
    for seq in range(1, 4):
        arrays = [rng.uniform(-1, 1, 20_000).astype(np.float32) for _ in range(4)]
        outs = [o for r, (h, p) in enumerate(_levels_frames(arrays, 1 / 127))
                for o in dev.offer(NODES[r], {**h, "seq": seq}, p, 1.0)]
        got = np.frombuffer(outs[0].payload, dtype=np.uint8)
        want = om.exact_mean(np.stack([optinc_encode(a, BITS, 1 / 127) for a in arrays], 1))
        missed += int(np.count_nonzero(got != want))
    assert missed > 0
    assert dev.stats_dict()["inexact_elements"] == missed
    dev.close()


def test_nan_in_a_gradient_is_refused_at_every_node_at_once(network):
    dev = _device(network)
    outs = dev.offer("n2", _head(2, SCALE_STEP, bad="its gradient contains NaN (element 7)"),
                     b"", 1.0)
    assert [o.dst for o in outs] == list(NODES)
    assert all("n2: its gradient contains NaN" in o.header["error"]
               and "nothing was averaged" in o.header["error"] for o in outs)
    # the other nodes' frames for that pass are dropped, not answered twice
    assert dev.offer("n0", _head(0, SCALE_STEP, maxabs=1.0), b"", 1.1) == []
    assert dev.stats.refused["nan"] == 1


def test_oversize_bucket_is_refused_to_every_sender(network):
    dev = _device(network, max_elements=1000)
    arrays = [np.ones(1001, np.float32)] * 4
    head, payload = _levels_frames(arrays, optinc_scale(1.0, BITS))[0]
    outs = dev.offer("n0", head, payload, 1.0)
    assert [o.dst for o in outs] == list(NODES)
    assert "max_elements = 1,000" in outs[0].header["error"]
    assert dev.stats.passes == 0


def test_wrong_number_of_nodes_and_wrong_bit_width_are_refused(network):
    dev = _device(network)
    three = NODES[:3]
    outs = dev.offer("n0", _head(0, SCALE_STEP, nodes=three, maxabs=1.0), b"", 1.0)
    assert [o.dst for o in outs] == list(three)
    assert "3 nodes but the device has 4 inputs" in outs[0].header["error"]
    lv = np.zeros(10, np.uint16)
    outs = dev.offer("n0", _head(0, LEVELS_STEP, seq=2, bits=12, elems=10, scale=0.1,
                                 dtype=lv.dtype.str), lv.tobytes(), 2.0)
    assert "12-bit levels" in outs[0].header["error"] and "8-bit" in outs[0].header["error"]


def test_mismatched_lengths_and_scales_are_refused(network):
    dev = _device(network)
    frames = _levels_frames([np.ones(100, np.float32)] * 3 + [np.ones(99, np.float32)], 0.01)
    outs = [o for r, (h, p) in enumerate(frames) for o in dev.offer(NODES[r], h, p, 1.0)]
    assert len(outs) == 4 and "mismatched lengths" in outs[0].header["error"]
    frames = _levels_frames([np.ones(100, np.float32)] * 4, 0.01)
    frames[1][0]["scale"] = 0.02
    outs = [o for r, (h, p) in enumerate(frames) for o in
            dev.offer(NODES[r], {**h, "seq": 2}, p, 2.0)]
    assert len(outs) == 4 and "scale" in outs[0].header["error"]


def test_phase_file_for_another_n_or_bit_width_is_refused(tmp_path, network):
    path = tmp_path / "n3.json"
    om.save_phases(path, om.OptincNetwork.designed(3, BITS))
    cfg = load_testbed(EMULATED)
    dev = replace(cfg.optinc[0], phases=str(path))
    with pytest.raises(om.OptincError, match="trained for N=3 inputs and 8-bit levels"):
        OptincDevice.from_config(dev)
    text = EMULATED.read_text().replace("bits = 8 ", f'phases = "{path}"\nbits = 8 ')
    with pytest.raises(ConfigError, match=r"phases: .*N=3 inputs.*oddl optinc train --nodes 4 "
                                          r"--bits 8"):
        parse_testbed(text, "bench.toml")


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("bits = 8 ", 'phases = "missing.json"\nbits = 8 ', "optinc0).phases: cannot read phase"),
    ("bits = 8 ", "bits = 8\ncolour = 1 ", "optinc0).colour: unknown key"),
    ("inputs = 4 ", "", "optinc0).inputs: missing"),
    ('kind = "optinc"\nresource = "emulated"', 'kind = "optinc"\nresource = "/dev/ttyUSB0"',
     'set resource = "emulated"'),
])
def test_testbed_entry_mistakes_name_the_key_and_fix(old, new, needle):
    text = EMULATED.read_text()
    assert old in text
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parse_testbed(text.replace(old, new), str(EMULATED))


def test_emulator_host_trains_missing_phases_fast_and_writes_them(tmp_path):
    cfg = load_testbed(EMULATED)
    t0 = time.perf_counter()
    tb = start_emulated_testbed(cfg, phases_dir=tmp_path)
    try:
        assert time.perf_counter() - t0 < 5.0
        path = tb.resolved.optinc[0].phases
        assert path == str(tmp_path / "optinc0.phases.json")
        net = om.load_phases(path, 4, 8)
        x = om.sample_inputs(4, 8, 20_000, np.random.default_rng(0))
        assert net.exact_fraction(x, noise_rad=0.0) == 1.0
    finally:
        tb.close()


# ---- the controller's part ---------------------------------------------------------------


def test_admission_needs_a_device_with_as_many_inputs_as_nodes():
    text = EMULATED.read_text()
    without = text[:text.index("# OptINC:")] + text[text.index("[[fibres]]"):]
    with pytest.raises(OperationRefused, match="has no OptINC device.*kind = \"optinc\""):
        unconnected_core(without).admit("x", [], "optinc", "optical", {}, 0)
    core = unconnected_core(text)
    with pytest.raises(OperationRefused, match="has 4 inputs .* the job has 3 nodes"):
        core.admit("x", ["n0", "n1", "n2"], "optinc", "optical", {}, 0)
    with pytest.raises(OperationRefused, match="use network optical"):
        core.admit("x", [], "optinc", "ideal", {}, 0)
    job, target = core.admit("x", [], "optinc", "optical", {}, 0)
    assert not target.channels and not target.wss_tables  # no circuit changes for the device
    register_all(core)
    for n in NODES:
        ready(core, job.id, 1, n, [10], "<i4")
    assert all("floating-point" in go_of(core, n).error for n in NODES)
    for n in NODES:
        ready(core, job.id, 2, n, [1 << 25], "<f4")
    assert all("max_elements = 16,777,216" in go_of(core, n).error for n in NODES)
    for n in NODES:  # a bucket the device takes: its two-slot schedule, no slot executor
        ready(core, job.id, 3, n, [1000], "<f4")
    go = go_of(core, "n0")
    assert not go.error and len(go.schedule.slots) == 2 and not core.slots.retuning()
    assert job.guard_time_s == go.schedule.guard_total_s


def test_schedule_is_one_pass_upload_and_streaming_broadcast():
    cfg = load_testbed(EMULATED)
    timing = timing_from_config(cfg)
    s = optinc_schedule(NODES, cfg.optinc[0], timing, 1_000_000, 4)
    up, down = s.slots
    hold = 8 * 1_000_000 / (cfg.fabric.line_rate_gbps * 1e9)  # one byte per 8-bit level
    assert s.hold_s == pytest.approx(hold)
    assert [f[1] for f in up.flows] == ["optinc0"] * 4 and [f[0] for f in down.flows] == [
        "optinc0"] * 4
    assert up.data_start_s == pytest.approx(timing.skew_s)
    assert down.data_start_s == pytest.approx(up.data_start_s + 1e-6)  # cut-through
    assert s.makespan_s == pytest.approx(timing.skew_s + hold + timing.slot_margin_s + 1e-6)


# ---- the executor through the emulated fabric (in-process) ------------------------------


@pytest.fixture(scope="module")
def fabric(tmp_path_factory) -> Iterator[tuple[Any, list[FabricLink]]]:
    cfg = load_testbed(EMULATED)
    cfg = replace(cfg, optinc=(replace(cfg.optinc[0], noise_rad=0.0, max_elements=200_000),))
    tb = start_emulated_testbed(cfg)
    from oddl.drivers.itla_frames import encode_request

    for laser in ("laser0", "laser1", "laser2", "laser3"):
        emu = tb.lasers[laser]
        emu.handle_frame(encode_request(0x32, 0x08, write=True))  # output on
    deadline = time.monotonic() + 5
    while any(tb.lasers[f"laser{i}"].optical_output() is None for i in range(4)):
        assert time.monotonic() < deadline, "lasers did not light"
        time.sleep(0.01)
    links = [FabricLink(n, tb.fabric.address) for n in NODES]
    yield tb, links
    for link in links:
        link.close()
    tb.close()


def _run_all(links: list[FabricLink], arrays: list[np.ndarray], seq: int) -> list[Any]:
    outs: list[Any] = [None] * 4
    gate = SlotGate()

    def call(r: int) -> None:
        run = CollectiveRun("j", seq, r, NODES, (), network="ideal", receive_timeout_s=5.0)
        try:
            outs[r] = run_optinc(run, arrays[r], links[r], gate, "optinc0", BITS)
        except CollectiveError as exc:
            outs[r] = exc

    threads = [threading.Thread(target=call, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outs


def test_executor_through_the_fabric_returns_n_times_the_quantised_mean(fabric):
    tb, links = fabric
    rng = np.random.default_rng(7)
    for seq, shape in enumerate([(3,), (300, 7), (100_003,)], start=1):
        arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
        want = optinc_expected(arrays, BITS)
        outs = _run_all(links, arrays, seq)
        for out in outs:
            assert isinstance(out, np.ndarray) and out.dtype == np.float32
            assert out.shape == shape and np.array_equal(out, want)
        scale = optinc_scale(max(float(np.abs(a).max()) for a in arrays), BITS)
        assert np.all(np.abs(outs[0] - np.sum(arrays, axis=0)) <= 4 * scale + 1e-6)
    zeros = _run_all(links, [np.zeros(5, np.float64)] * 4, 4)
    assert all(isinstance(z, np.ndarray) and not z.any() and z.dtype == np.float64
               for z in zeros)
    bad = [rng.standard_normal(100).astype(np.float32) for _ in range(4)]
    bad[1][42] = np.nan
    for out in _run_all(links, bad, 5):
        assert isinstance(out, CollectiveError) and "n1: its gradient contains NaN" in str(out)
    big = [np.ones(200_001, np.float32)] * 4
    for out in _run_all(links, big, 6):
        assert isinstance(out, CollectiveError) and "max_elements = 200,000" in str(out)
    stats = tb.optinc["optinc0"].stats_dict()
    assert stats["passes"] == 3 and stats["inexact_elements"] == 0
    assert stats["refused"] == {"nan": 1, "too large": 1}


# ---- end to end with real processes -------------------------------------------------------


def _allreduce_all(clients: list[Any], arrays: list[np.ndarray]) -> list[Any]:
    from oddl.agents.client.every_rank import allreduce_all

    return allreduce_all(clients, arrays)[1]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_optinc_job_end_to_end(tmp_path):
    from oddl.agents.client.agent_client import AgentClient
    from oddl.launch.processes import ProcessGroup
    from oddl.launch.testbed import fabric_stats, launch_emulated
    from oddl.operator.client import OperatorClient

    text = EMULATED.read_text().replace("bits = 8 ", "bits = 8\nnoise_rad = 0.0\n")
    text = text.replace("max_elements = 16777216", "max_elements = 300000")
    config = tmp_path / "optinc.toml"
    config.write_text(text)
    with ProcessGroup(tmp_path) as group:
        tb = launch_emulated(group, config, tmp_path)
        emu = tb.emulators
        assert emu["optinc"]["optinc0"] == str(tmp_path / "optinc0.phases.json")
        clients = [AgentClient(tb.agents[n]["local_api"], timeout_s=30) for n in NODES]
        op = OperatorClient(tb.controller)
        try:
            with pytest.raises(OperationRefused, match="has 4 inputs .* the job has 3 nodes"):
                op.submit("x", ["n0", "n1", "n2"], "optinc", "optical")
            job = op.submit("optinc", [], "optinc", "optical")
            rng = np.random.default_rng(11)
            for shape, dtype in (((1000,), np.float32), ((250_000,), np.float32),
                                 ((30, 70), np.float64)):
                arrays = [rng.standard_normal(shape).astype(dtype) for _ in NODES]
                want = optinc_expected(arrays, BITS)
                for out in _allreduce_all(clients, arrays):
                    assert isinstance(out, np.ndarray), out
                    assert out.dtype == dtype and np.array_equal(out, want)
            bad = [rng.standard_normal(100).astype(np.float32) for _ in NODES]
            bad[2][5] = np.inf
            for out in _allreduce_all(clients, bad):
                assert isinstance(out, CollectiveError) and "n2: its gradient contains NaN or " \
                    "Inf (first at element 5" in str(out)
            for out in _allreduce_all(clients, [np.ones(300_001, np.float32)] * 4):
                assert isinstance(out, CollectiveError) and "max_elements = 300,000" in str(out)
            for out in _allreduce_all(clients, [np.ones(10, np.int32)] * 4):
                assert isinstance(out, CollectiveError) and "use ring for integers" in str(out)
            arrays = [rng.standard_normal(777).astype(np.float32) for _ in NODES]
            for out in _allreduce_all(clients, arrays):  # the job goes on after refusals
                assert isinstance(out, np.ndarray) and np.array_equal(
                    out, optinc_expected(arrays, BITS))
            # the agents report outcomes off the collective's critical path: wait for the four
            wait_until(lambda: _done(op, job["id"]) >= 4, 30, "the controller counting 4 done")
            assert _done(op, job["id"]) == 4
            sched = op.schedule(job["id"], 4096)
            assert sched.collective == "optinc" and len(sched.slots) == 2
            device = fabric_stats(emu["fabric"])["optinc"]["optinc0"]
            assert device["passes"] == 4 and device["inexact_elements"] == 0
            assert device["refused"] == {"nan": 1}
            op.cancel(job["id"])
        finally:
            for c in clients:
                c.close()
            op.close()


def _done(op: Any, job_id: str) -> int:
    """The controller's count of collectives done in `job_id`."""
    return int({j["id"]: j for j in op.jobs()}[job_id]["collectives_done"])
