"""End to end with real processes on loopback: emulators + fabric, controller, four agents.

Every process is the same command a lab runs (`oddl emulate testbed`, `oddl controller serve`,
`oddl agent serve`); the drivers talk to the emulators over their real wire protocols.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from beds import allreduce_all
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import EMULATED

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all as run_on_all
from oddl.common.config import load_testbed
from oddl.common.errors import CollectiveError, OperationRefused
from oddl.launch.processes import oddl_command
from oddl.launch.testbed import RunningTestbed, fabric_stats
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]



@pytest.fixture(scope="module")
def testbed(tmp_path_factory) -> Iterator[RunningTestbed]:
    with RunningTestbed(tmp_path_factory.mktemp("e2e"), EMULATED) as tb:
        yield tb


@pytest.fixture
def job(testbed: RunningTestbed, request) -> Iterator[dict]:
    collective, network, *params = getattr(request, "param", ("ring", "optical"))
    j = testbed.operator.submit(f"test-{collective}", [], collective, network,
                                params[0] if params else None)
    yield j
    testbed.operator.cancel(j["id"])




def _collectives_done(tb: RunningTestbed, job_id: str, expect: int = 4,
                      timeout: float = 30.0) -> int:
    """The job's count of finished collectives once it reaches `expect` (agents report each
    outcome off the collective's critical path, so the last report may still be on its way),
    or whatever it is at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        done = int(next(j for j in tb.operator.jobs() if j["id"] == job_id)["collectives_done"])
        if done >= expect or time.monotonic() > deadline:
            return done
        time.sleep(0.05)


def _ints(seed: int, n: int, count: int = 4) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-2**40, 2**40, n) for _ in range(count)]


@pytest.mark.parametrize("job", [("ring", "optical"), ("halving-doubling", "optical"),
                                 ("ring", "ideal"), ("wrht", "optical", {"wavelengths": "2"}),
                                 ("totientperms", "optical", {"degree": "2"}),
                                 ("parameter-server", "optical"), ("topoopt", "optical")],
                         indirect=True)
def test_allreduce_is_exact(testbed: RunningTestbed, job: dict):
    for seed, n in ((1, 10_007), (2, 3), (3, 200_000)):
        arrays = _ints(seed, n)
        exact = np.sum(arrays, axis=0)
        for out in allreduce_all(testbed.clients, arrays):
            assert isinstance(out, np.ndarray), out
            assert np.array_equal(out, exact)
    floats = [a.astype(np.float32) / 2**30 for a in _ints(4, 50_000)]
    stacked = np.stack(floats).astype(np.float64)
    exact_f = stacked.sum(axis=0)
    # float32 summation in any order is within (N-1)·eps·Σ|x| of the exact sum
    bound = 3 * np.finfo(np.float32).eps * np.abs(stacked).sum(axis=0)
    for out in allreduce_all(testbed.clients, floats):
        assert isinstance(out, np.ndarray) and out.dtype == np.float32
        assert np.all(np.abs(out - exact_f) <= bound + 1e-30)
    assert _collectives_done(testbed, job["id"]) == 4


@pytest.mark.parametrize("job", [("halving-doubling", "optical")], indirect=True)
def test_halving_doubling_retunes_transmitters(testbed: RunningTestbed, job: dict):
    before = int(testbed.operator.status()["reconfigurations"])
    for out in allreduce_all(testbed.clients, _ints(5, 4096)):
        assert isinstance(out, np.ndarray)
    after = testbed.operator.status()
    assert int(after["reconfigurations"]) > before
    listed = {j["id"]: j for j in after["jobs"]}
    assert int(listed[job["id"]]["reconfigurations"]) > 0
    assert float(listed[job["id"]]["guard_time_s"]) > 0


def test_mismatched_arrays_are_refused_and_the_job_goes_on(testbed: RunningTestbed, job: dict):
    arrays = _ints(6, 100)
    arrays[2] = arrays[2][:50]
    outs = allreduce_all(testbed.clients, arrays)
    for out in outs:
        assert isinstance(out, CollectiveError)
        assert "different arrays" in str(out) and "n2: shape [50]" in str(out)
    good = _ints(7, 100)
    exact = np.sum(good, axis=0)
    for out in allreduce_all(testbed.clients, good):
        assert isinstance(out, np.ndarray) and np.array_equal(out, exact)


def test_wrong_route_loses_data_and_is_reported(testbed: RunningTestbed, job: dict):
    # channel 2 is n1's receive channel; send it to n2's port: n0 -> n1 light lands at n2,
    # whose receiver filter (channel 3) rejects it, so n1 gets nothing
    testbed.operator.reconfigure({"set_route": {"wss": "wss0", "channel": 2, "port": 3,
                                                "attenuation_db": 0.0}}, dry_run=False)
    try:
        outs = allreduce_all(testbed.clients, _ints(8, 1000))
        errors = [o for o in outs if isinstance(o, CollectiveError)]
        assert errors, outs
        assert any("lost data" in str(e) and "nothing from n0" in str(e) for e in errors), \
            [str(e) for e in errors]
        status = testbed.clients[1].status()
        assert status["collectives_failed"] >= 1
    finally:
        testbed.operator.reconfigure({"set_route": {"wss": "wss0", "channel": 2, "port": 2,
                                                    "attenuation_db": 0.0}}, dry_run=False)
    # the job recovers once the route is right again
    arrays = _ints(9, 1000)
    exact = np.sum(arrays, axis=0)
    # a failed collective leaves the agents' sequence numbers apart; a fresh job realigns them
    testbed.operator.cancel(job["id"])
    fresh = testbed.operator.submit("after-fix", [], "ring", "optical")
    try:
        for out in allreduce_all(testbed.clients, arrays):
            assert isinstance(out, np.ndarray) and np.array_equal(out, exact)
    finally:
        testbed.operator.cancel(fresh["id"])


def test_refusals_name_the_problem(testbed: RunningTestbed):
    with pytest.raises(OperationRefused, match="unknown collective 'spanning-tree'"):
        testbed.operator.submit("x", [], "spanning-tree", "optical")
    with pytest.raises(OperationRefused, match="unknown node 'n7'"):
        testbed.operator.submit("x", ["n0", "n7"], "ring", "optical")
    with pytest.raises(OperationRefused, match="power-of-two"):
        testbed.operator.submit("x", ["n0", "n1", "n2"], "halving-doubling", "optical")
    with pytest.raises(OperationRefused, match="use wavelengths=8 or fewer"):
        testbed.operator.submit("x", [], "wrht", "optical", {"wavelengths": "16"})
    with pytest.raises(OperationRefused, match="use degree 2"):
        testbed.operator.submit("x", [], "totientperms", "optical", {"degree": "4"})
    with pytest.raises(OperationRefused, match="unknown job 'job-999'"):
        testbed.operator.schedule("job-999", 4096)
    with pytest.raises(OperationRefused, match="channel 40 is outside channels_allowed"):
        testbed.operator.reconfigure({"set_route": {"wss": "wss0", "channel": 40, "port": 1,
                                                    "attenuation_db": 0.0}}, dry_run=True)
    with pytest.raises(OperationRefused, match="no job is assigned"):
        testbed.clients[0].allreduce(np.zeros(3))


def test_unknown_node_cannot_register(testbed: RunningTestbed):
    channel = grpc.insecure_channel(testbed.address)
    stub = pb_grpc.ControllerStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.RegisterAgent(pb.RegisterAgentRequest(node_id="n9"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown node 'n9'" in err.value.details() and "n0, n1, n2, n3" in err.value.details()
    channel.close()
    result = subprocess.run(oddl_command("agent", "serve", "--config", str(testbed.resolved),
                                         "--node", "n9", "--controller", testbed.address),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "unknown node 'n9'" in result.stderr


def test_health_and_status(testbed: RunningTestbed):
    channel = grpc.insecure_channel(testbed.address)
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service="oddl.v1.Controller"), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    reflected = ProtoReflectionDescriptorDatabase(channel)
    assert "oddl.v1.Controller" in reflected.get_services()
    methods = reflected.FindFileContainingSymbol("oddl.v1.Controller")
    assert "SubmitJob" in {m.name for m in methods.service[0].method}
    channel.close()
    status = testbed.operator.status()
    assert [a["node_id"] for a in status["agents"]] == ["n0", "n1", "n2", "n3"]
    assert all(a["alive"] for a in status["agents"])
    devices = {d["id"]: d for d in testbed.operator.devices()["devices"]}
    assert devices["laser0"]["locked"] and devices["laser0"]["output_enabled"]
    assert {r["channel"]: r["port"] for r in devices["wss0"]["routes"]
            if r["port"] not in (0, 99)} == {1: 1, 2: 2, 3: 3, 4: 4}  # 99: blocked


def test_direct_links_on_distinct_loopback_addresses(tmp_path: Path):
    text = EMULATED.read_text().replace('link = "fabric"', 'link = "direct"')
    for i in range(4):
        text = text.replace(f'id = "n{i}"\nhost = "127.0.0.1"', f'id = "n{i}"\nhost = "127.0.0.{i + 1}"')
    config = tmp_path / "direct.toml"
    config.write_text(text)
    tb = RunningTestbed(tmp_path, config)
    try:
        j = tb.operator.submit("direct", [], "ring", "optical")
        addresses = {a["node_id"]: a["data_address"] for a in tb.operator.status()["agents"]}
        assert addresses["n2"].startswith("tcp://127.0.0.3:")
        assert {c.status()["data_path"] for c in tb.clients} == {"tcp streams"}
        arrays = _ints(10, 5000)
        exact = np.sum(arrays, axis=0)
        for out in allreduce_all(tb.clients, arrays):
            assert isinstance(out, np.ndarray) and np.array_equal(out, exact)
        tb.operator.cancel(j["id"])
    finally:
        tb.close()


@pytest.mark.parametrize("job", [("halving-doubling", "optical")], indirect=True)
def test_prometheus_metrics(testbed: RunningTestbed, job: dict):
    import urllib.request

    for out in allreduce_all(testbed.clients, _ints(11, 4096)):
        assert isinstance(out, np.ndarray)

    def scrape(url: str) -> str:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.read().decode()

    controller = scrape(testbed.metrics["controller"])
    assert "oddl_reconfigurations_total" in controller
    assert 'oddl_device_command_seconds_count{device="laser0",op="tune"}' in controller
    assert "oddl_agents_alive 4.0" in controller
    agent = scrape(testbed.metrics["n0"])
    assert "oddl_agent_slot_gate_error_seconds_bucket" in agent
    assert 'oddl_agent_collectives_total{node="n0",outcome="ok"}' in agent
    assert 'oddl_agent_bytes_sent_total{node="n0",peer="n1"}' in agent
    assert 'oddl_agent_late_chunks_total{node="n0"}' in agent


@pytest.mark.parametrize("job", [("ring", "optical")], indirect=True)
def test_the_bucket_stays_out_of_the_local_socket(testbed: RunningTestbed, job: dict):
    rng = np.random.default_rng(21)
    values = [rng.integers(-2**40, 2**40, (3, 50_000)) for _ in testbed.clients]
    shared = [c.shared_array(v.shape, v.dtype) for c, v in zip(testbed.clients, values,
                                                                strict=True)]
    for s, v in zip(shared, values, strict=True):
        s[...] = v
    before = [c.status()["local_api_bytes"] for c in testbed.clients]
    assert testbed.clients[0].status()["data_path"] == "tcp streams on the emulated light"
    # the local API is a Unix socket only this user can open, not a TCP port
    assert all(c.address.startswith("ipc://") for c in testbed.clients)
    outs = allreduce_all(testbed.clients, shared)
    exact = np.sum(values, axis=0)
    for out, s in zip(outs, shared, strict=True):
        assert out is s and np.array_equal(s, exact)  # reduced in place, in shared memory
    # plain arrays, in place (out=): shared memory too; nothing but headers on the socket
    plain = [v.copy() for v in values]
    for out, p in zip(run_on_all(testbed.clients, plain, inplace=True)[1], plain, strict=True):
        assert out is p and np.array_equal(p, exact)
    assert [c.status()["local_api_bytes"] for c in testbed.clients] == before
    # a client that cannot share memory (another host) sends the bytes instead
    status = testbed.clients[0].status()
    fallback = [AgentClient(c.address, timeout_s=30, shared_memory=False)
                for c in testbed.clients]
    try:
        for out in allreduce_all(fallback, values):
            assert isinstance(out, np.ndarray) and np.array_equal(out, exact)
    finally:
        for c in fallback:
            c.close()
    assert testbed.clients[0].status()["local_api_bytes"] == (
        status["local_api_bytes"] + values[0].nbytes)


def test_the_relay_transport_still_carries_every_frame_through_the_fabric(tmp_path: Path):
    text = EMULATED.read_text().replace('link = "fabric"', 'link = "fabric"\ntransport = "relay"')
    config = tmp_path / "relay.toml"
    config.write_text(text)
    tb = RunningTestbed(tmp_path, config)
    try:
        assert {c.status()["data_path"] for c in tb.clients} == {
            "relay through the fabric process"}
        for collective in ("ring", "halving-doubling"):
            j = tb.operator.submit(f"relay-{collective}", [], collective, "optical")
            arrays = _ints(12, 300_001)  # several chunks per transfer
            exact = np.sum(arrays, axis=0)
            for out in allreduce_all(tb.clients, arrays):
                assert isinstance(out, np.ndarray) and np.array_equal(out, exact)
            tb.operator.cancel(j["id"])
        stats = fabric_stats(load_testbed(tb.resolved).fabric.address)
        assert "streams" not in stats and stats["delivered"] > 0  # frames went through it
    finally:
        tb.close()


def test_repeated_collectives_run_without_the_controller_barrier(testbed: RunningTestbed):
    # after the first all-reduce of a size the agents agree on the start among themselves; a
    # schedule that retunes (halving-doubling) is announced to the controller, which still
    # performs every retune
    # a schedule that leaves lasers elsewhere than it starts (WRHT) goes to the barrier each time
    for collective, params, standing in (("ring", None, 2), ("halving-doubling", None, 2),
                                         ("wrht", {"wavelengths": "2"}, 0)):
        j = testbed.operator.submit(f"standing-{collective}", [], collective, "optical", params)
        try:
            before = [c.status()["collectives_on_standing_schedules"] for c in testbed.clients]
            tunes = int(testbed.operator.status()["reconfigurations"])
            for seed in (31, 32, 33):
                arrays = _ints(seed, 40_000)
                exact = np.sum(arrays, axis=0)
                for out in allreduce_all(testbed.clients, arrays):
                    assert isinstance(out, np.ndarray) and np.array_equal(out, exact)
            after = [c.status()["collectives_on_standing_schedules"] for c in testbed.clients]
            assert [a - b for a, b in zip(after, before, strict=True)] == [standing] * 4
            assert _collectives_done(testbed, j["id"], expect=3) == 3
            listed = {x["id"]: x for x in testbed.operator.jobs()}
            retunes = int(listed[j["id"]]["reconfigurations"])
            if collective == "ring":
                assert retunes == 0
            elif collective == "wrht":
                assert retunes > 0
            else:  # two retune slots of four transmitters per all-reduce, all by the controller
                assert retunes == 3 * 8
                assert int(testbed.operator.status()["reconfigurations"]) - tunes == 3 * 8
        finally:
            testbed.operator.cancel(j["id"])
    # a size the agents have not seen goes through the controller again, and still agrees
    j = testbed.operator.submit("standing-sizes", [], "ring", "optical")
    try:
        for n in (1000, 2000, 1000):
            arrays = _ints(n, n)
            for out in allreduce_all(testbed.clients, arrays):
                assert isinstance(out, np.ndarray) and np.array_equal(out, np.sum(arrays, axis=0))
    finally:
        testbed.operator.cancel(j["id"])


def test_a_standing_start_the_devices_no_longer_match_is_refused(testbed: RunningTestbed):
    # an operator retunes a laser by hand between two collectives: the schedule the agents
    # hold no longer starts from the devices' state, so the controller refuses its start
    # and the collective fails with the reason; the next one goes through the barrier
    j = testbed.operator.submit("standing-refused", [], "halving-doubling", "optical")
    try:
        for seed in (41, 42):
            for out in allreduce_all(testbed.clients, _ints(seed, 5000)):
                assert isinstance(out, np.ndarray)
        devices = {d["id"]: d for d in testbed.operator.devices()["devices"]}
        channel = int(devices["laser0"]["channel"])
        testbed.operator.reconfigure(
            {"set_channel": {"transmitter": "laser0", "channel": channel % 4 + 1}},
            dry_run=False)
        outs = allreduce_all(testbed.clients, _ints(43, 5000))
        assert all(isinstance(o, CollectiveError) for o in outs), outs
        assert any("standing start refused" in str(o) for o in outs), outs
        arrays = _ints(44, 5000)
        for out in allreduce_all(testbed.clients, arrays):
            assert isinstance(out, np.ndarray) and np.array_equal(out, np.sum(arrays, axis=0))
    finally:
        testbed.operator.cancel(j["id"])
