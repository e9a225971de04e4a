"""The `oddl` torch.distributed backend against the emulated testbed (extra `oddl[torch]`).

Four rank processes (tests/workers/torch_backend_worker.py, torchrun's environment) join
`init_process_group("oddl")`, each through its own node's agent, run a scenario and print
their results; the checks here compute the expected values from the same inputs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from helpers import EMULATED, run_ranks, train_demo_summary

torch = pytest.importorskip("torch")


WORKER = Path(__file__).resolve().parents[1] / "workers" / "torch_backend_worker.py"
WORLD = 4


# ---- without a testbed ----------------------------------------------------------------------


class _FakeChannel:
    """Answers each sum as `factor` identical ranks would (or as a job of another size)."""

    def __init__(self, factor: int):
        self.factor = factor
        self.job = None

    def sum_(self, array: np.ndarray, in_rank: bool = True) -> np.ndarray:
        assert not in_rank, "a handshake sums through the agent, never a rank path"
        array *= self.factor
        return array


def test_a_missing_agent_address_names_the_variable(monkeypatch):
    import oddl.torch.channel as oc
    from oddl.common.errors import ConfigError

    monkeypatch.delenv("ODDL_LOCAL_API", raising=False)
    monkeypatch.setattr(oc, "_channel", None)
    with pytest.raises(ConfigError, match="ODDL_LOCAL_API=<the local agent API address>"):
        oc.channel_for(0, 10.0)
    monkeypatch.setenv("ODDL_LOCAL_API", "tcp://127.0.0.1:1,tcp://127.0.0.1:2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ConfigError, match="lists 2 agents but this is local rank 3"):
        oc.channel_for(3, 10.0)


def test_the_handshake_catches_a_job_of_another_size():
    import oddl.torch.channel as oc
    from oddl.common.errors import ConfigError

    # four ranks that are really the same rank (or a job of four nodes for a world of 2)
    with pytest.raises(ConfigError, match="the job has 4 nodes for a world of 2; no rank "
                                          r"\[1\]; ranks given twice \[0\]"):
        oc.handshake(_FakeChannel(4), 0, 2)  # type: ignore[arg-type]
    oc.handshake(_FakeChannel(1), 0, 1)  # a world of one: the sum is the input


def test_dtypes_numpy_cannot_sum_are_refused_with_the_fix():
    import oddl.torch.channel as oc

    with pytest.raises(oc.UnsupportedCollective, match="not torch.bfloat16; cast to float32"):
        oc.as_numpy(torch.ones(3, dtype=torch.bfloat16), "all_reduce")
    assert oc.as_numpy(torch.ones(3, dtype=torch.float16), "x").dtype == np.float16


def test_a_call_that_failed_raises_at_wait():
    """c10d's own work from a future returns True from wait() even when the call failed."""
    import oddl.torch.channel as oc

    fut: torch.futures.Future = torch.futures.Future()
    work = oc.FutureWork(fut)
    assert not work.is_completed()
    fut.set_exception(oc.UnsupportedCollective("all_gather: 3 outputs for a world of 4"))
    with pytest.raises(oc.UnsupportedCollective, match="3 outputs"):
        work.wait()
    assert work.get_future() is fut


def test_a_receive_from_any_source_that_ends_before_its_work_exists_names_its_sender(
        monkeypatch):
    """The receive runs on the receives' thread and may finish before `recv_anysource` has
    made its work (a loaded machine does this: PyTorch's any-source profiler test once hit
    "cannot access free variable 'work'"). Here it finishes inside the submission."""
    import oddl.torch.channel as oc
    import oddl.torch.process_group as opg

    class AtOnce:  # a channel whose receive lane runs the call before returning
        job = None

        def submit_receive(self, what, fn):
            fut: torch.futures.Future = torch.futures.Future()
            fut.set_result(fn(None))
            return fut

    monkeypatch.setattr(opg.native, "recv_any", lambda *args: 2)
    group = opg.OddlProcessGroup(0, 4, cast(oc.Channel, AtOnce()))
    work = group.recv_anysource([torch.empty(3)], 0)
    assert work.wait() and work._source_rank() == 2


@pytest.fixture(scope="module")
def apis(tmp_path_factory) -> Iterator[list[str]]:
    """The emulated testbed with a ring job on its four nodes; the agents' API addresses."""
    from oddl.launch.testbed import RunningTestbed

    with RunningTestbed(tmp_path_factory.mktemp("torch-backend"), EMULATED) as tb:
        nodes = tb.launched.node_ids
        job = tb.operator.submit("torch-backend", nodes, "ring", "optical")
        yield tb.launched.apis
        tb.operator.cancel(job["id"])


def run_world(apis: list[str], scenario: str, timeout: float = 150) -> list[dict[str, Any]]:
    """Start the four ranks as torchrun would; their JSON results in rank order."""
    assert len(apis) == WORLD
    return run_ranks([sys.executable, str(WORKER), scenario], apis, timeout)


def _inputs(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(100 + rank).integers(-1000, 1000, n)


@pytest.mark.e2e
@pytest.mark.timeout(200)
def test_every_collective_and_point_to_point_is_exact_and_native(apis: list[str]):
    res = run_world(apis, "collectives")
    allin = {n: np.stack([_inputs(r, n) for r in range(WORLD)]) for n in (3, 5, 6 * WORLD, 7, 8, 9,
                                                                            10, 12, 50, 100,
                                                                            333, 1000)}
    for r, got in enumerate(res):
        assert got["rank"] == r
        kinds = got["counters"]["kinds"]
        assert got["sum_int64"] == allin[1000].sum(0).tolist()
        f = (allin[333].astype(np.float32) / 8).astype(np.float64)
        assert np.array_equal(got["avg_float32"], f.sum(0) / WORLD)
        assert got["sum_empty"] == []
        nc = allin[12].sum(0).reshape(3, 4).T
        assert got["sum_noncontiguous"] == nc.tolist()
        assert got["broadcast_from_2"] == allin[50][2].astype(float).tolist()
        assert got["all_gather"] == allin[7].tolist()
        assert got["all_gather_into_tensor"] == allin[5].reshape(-1).astype(float).tolist()
        assert got["reused_gather_shared"] is True  # adopted by the agent: no copy back
        assert got["reused_gather_firsts"] == [q + 20.0 for q in range(WORLD)]
        assert got["reduce_scatter"] == allin[6 * WORLD].sum(0)[6 * r:6 * r + 6].tolist()
        assert got["reduce_scatter_tensor"] == allin[6 * WORLD].sum(0)[6 * r:6 * r + 6].astype(
            float).tolist()
        assert got["all_to_all_single"] == [100 * i + 3 * r + k for i in range(WORLD)
                                            for k in range(3)]
        assert got["all_to_all_uneven"] == [[1000 * i + r] * (r + 1) for i in range(WORLD)]
        assert got["reduce_to_1"] == (allin[8].sum(0).tolist() if r == 1 else None)
        assert got["gather_to_0"] == (allin[3].tolist() if r == 0 else None)
        assert got["scatter_from_3"] == [10.0 * r] * 2
        assert got["broadcast_bf16"] == [2.5] * 5
        assert got["recv_from_left"] == [(r - 1) % WORLD] * 4
        assert got["recv_bf16_from_right"] == [1.5 + (r + 1) % WORLD] * 3
        sent = 4 * 8 + 3 * 2 + (16 if r else 0)
        assert kinds["send"] == {"calls": 2 + (r > 0), "optical_bytes": sent,
                                 "fallback_calls": 0, "fallback_bytes": 0}
        assert kinds["recv"]["optical_bytes"] == 4 * 8 + 3 * 2 + (16 * (WORLD - 1) if r == 0
                                                                  else 0)
        if r == 0:
            assert got["any_source"] == [[s, [100 + s] * 2] for s in range(1, WORLD)]
        assert got["async_wait"] == [True, True, True]
        assert got["async_sums"] == [(allin[100] + k).sum(0).tolist() for k in range(3)]
        assert got["future_value"] == allin[10].sum(0).tolist() and got["future_done"]
        # MAX: the agent's own reduction, exact, no fallback
        assert got["max_native"] == allin[9].astype(np.float32).max(0).astype(float).tolist()
        assert got["counters_before_fallback"]["total"]["fallback_calls"] == 0
        assert got["sum_bf16"] == [0.5 * WORLD + sum(range(WORLD)), WORLD,
                                   -2.0 * sum(range(WORLD))]
        assert kinds["all_reduce (bfloat16 as float32)(SUM)"]["optical_bytes"] == 3 * 4
        assert got["reduce_scatter_bf16"] == [WORLD * (2 * r + j) + 6 for j in (0, 1)]  # 6: 0+1+2+3
        assert kinds["reduce_scatter_tensor (bfloat16 as float32)(SUM)"]["optical_bytes"] == 32
        kinds = got["counters"]["kinds"]
        assert kinds["all_reduce(MAX)"] == {"calls": 1, "optical_bytes": 9 * 4,
                                            "fallback_calls": 0, "fallback_bytes": 0}
        assert kinds["gather"]["optical_bytes"] == 3 * 8
        assert kinds["all_reduce(SUM)"]["optical_bytes"] >= 1000 * 8
        assert kinds["all_gather"]["optical_bytes"] == WORLD * 7 * 4
        assert kinds["barrier"]["calls"] >= 1
        # one block per rank; sizes summed ahead only for uneven blocks
        assert kinds["all_to_all_single"]["optical_bytes"] == WORLD * 3 * 8
        assert "all_to_all_single (sizes)" not in kinds
        assert kinds["all_to_all (sizes)"]["optical_bytes"] == WORLD * WORLD * 8


@pytest.mark.e2e
@pytest.mark.timeout(200)
def test_lists_reduce_each_tensor_and_subgroups_run_over_the_optics(apis: list[str]):
    res = run_world(apis, "lists_and_subgroups")
    small = [np.array([[r + 1.0, -2.0, 3.0] for r in range(WORLD)]),
             np.array([[10.0 * (r + 1), 1.0] for r in range(WORLD)])]
    expected = {"MAX": [s.max(0) for s in small], "MIN": [s.min(0) for s in small],
                "PRODUCT": [s.prod(0) for s in small]}
    for r, got in enumerate(res):
        assert got["all_gather_coalesced"] == [
            [_inputs(i, 3).astype(float).tolist(), _inputs(i + 10, 5).astype(float).tolist()]
            for i in range(WORLD)]
        assert got["short_gather_error"] == (f"UnsupportedCollective: all_gather: {WORLD - 1} "
                                             f"outputs for a world of {WORLD}")
        assert got["coalesced_sum"] == [s.sum(0).tolist() for s in small]
        for op, want in expected.items():
            # each tensor on its own: MAX of [a, b] is [max a, max b], not max over both
            assert got[f"coalesced_{op}"] == [w.tolist() for w in want], op
        assert got["pair_sum"] == [float(sum(range(2 * (r // 2), 2 * (r // 2) + 2)))]
        kinds = got["counters"]["kinds"]
        assert kinds["all_gather_coalesced"]["optical_bytes"] == WORLD * 8 * 4
        # the world's MAX, and (ranks 1, 2) the subgroup's, counted under the same kind
        assert kinds["all_reduce(MAX)"]["optical_bytes"] == 5 * 4 * (2 if r in (1, 2) else 1)
        # subgroups over the optics: flows among their members, nothing on gloo
        assert kinds["subgroup flows"]["optical_bytes"] > 0
        assert not [k for k in kinds if "gloo" in k and "beside" not in k and r in (1, 2)]
        if r in (1, 2):
            assert got["middle_gather"] == [[1, 1], [2, 2]]
            assert got["middle_gather_into"] == [1, 1, 2, 2]
            assert got["middle_coalesced_max"] == [small[0][1:3].max(0).tolist(),
                                                   small[1][1:3].max(0).tolist()]
            assert got["middle_broadcast"] == [2.0] * 3
            # rank 1 gets block 0 of (arange(4)·1 + arange(4)·2), rank 2 block 1
            assert got["middle_reduce_scatter"] == ([0.0, 3.0] if r == 1 else [6.0, 9.0])
            assert got["middle_all_to_all"] == ([1, 2, 2, 2] if r == 1 else [1, 1, 2])
            assert got["middle_p2p"] == [10 * (3 - r)] * 2
        if r in (0, 3):
            assert got["beside_sum"] == [2.0]
            assert kinds["allreduce (subgroup, gloo)"]["calls"] == 1


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_ddp_and_fully_shard_train_as_gloo_does(apis: list[str]):
    pytest.importorskip("sklearn")
    from oddl.demo.train import ACCURACY_TOLERANCE

    res = run_world(apis, "training", timeout=280)
    for kind in ("ddp", "fsdp"):
        oddl = [r[f"{kind}_oddl"] for r in res]
        gloo = [r[f"{kind}_gloo"] for r in res]
        # it learned, over the optics, and gloo's run from the same seed agrees
        assert oddl[0]["losses"][1] < oddl[0]["losses"][0]
        assert oddl[0]["accuracy"] > 0.8
        assert abs(oddl[0]["accuracy"] - gloo[0]["accuracy"]) <= ACCURACY_TOLERANCE
        assert np.allclose(oddl[0]["losses"], gloo[0]["losses"], rtol=1e-3)
        total = oddl[0]["counters"]["total"]
        assert total["optical_bytes"] > 0 and total["fallback_calls"] == 0
        assert gloo[0]["counters"]["total"]["calls"] == 0  # gloo's run used no oddl call
    digests = {r["ddp_oddl"]["digest"] for r in res}
    assert len(digests) == 1  # the DDP replicas agree bit for bit
    kinds = res[0]["fsdp_oddl"]["counters"]["kinds"]
    assert any(k.startswith("reduce_scatter_tensor") for k in kinds), kinds
    assert "all_gather_into_tensor" in kinds


@pytest.mark.e2e
@pytest.mark.timeout(200)
def test_train_demo_with_the_backend_reports_bytes_per_iteration(tmp_path: Path):
    pytest.importorskip("sklearn")
    s = train_demo_summary(tmp_path / "run", 1, ", backend='oddl'")
    assert s["ok"], s["problems"]
    assert s["backend"] == "oddl" and s["all_results_exact"] is None  # not claimed here
    oddl, gloo = s["oddl"], s["gloo"]
    assert oddl["replicas_equal"] and abs(oddl["final_test_accuracy"]
                                          - gloo["final_test_accuracy"]) <= s[
        "accuracy_tolerance"]
    per = oddl["backend_per_iteration"]
    # DDP all-reduces every gradient once a step: ~38k float32 parameters
    assert per["optical_bytes"]["min"] >= 4 * 38_000 and per["fallback_bytes"]["total"] == 0
    assert s["iteration_time_ratio_over_gloo"] > 0
    assert s["collectives_done"] > 0
