"""The `oddl` backend honours the process group's timeout, as PyTorch promises (issue 33).

A barrier that a rank never joins raises within the group's timeout on the ranks that called
it, naming the group, the call and the timeout (and "Timed out", which PyTorch's
`test_barrier_timeout_*` look for); the timeout of `new_group` bounds that group's calls.
After a timeout the process's later collectives are refused at once, saying how to go on, and
a new group made by every rank goes on.
No timing luck: the test asserts that the call raised, no sooner than the timeout (the agent
waited that long for the missing rank) and within ten times it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import EMULATED, run_ranks

pytest.importorskip("torch")

WORKER = Path(__file__).resolve().parents[1] / "workers" / "torch_timeout_worker.py"
TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def testbed(tmp_path_factory) -> Iterator[Any]:
    from oddl.launch.testbed import RunningTestbed

    with RunningTestbed(tmp_path_factory.mktemp("torch-timeouts"), EMULATED) as tb:
        yield tb


def run_scenario(tb: Any, scenario: str) -> list[dict[str, Any]]:
    """The scenario's four ranks on a job of their own (a lone call leaves the job's
    collective sequence broken on purpose: the job is cancelled after)."""
    job = tb.operator.submit(f"timeouts-{scenario}", tb.launched.node_ids, "ring", "optical")
    try:
        return run_ranks([sys.executable, str(WORKER), scenario], tb.launched.apis, 150,
                         env={"ODDL_JOB": job["id"]})
    finally:
        tb.operator.cancel(job["id"])


@pytest.mark.e2e
@pytest.mark.timeout(200)
@pytest.mark.parametrize("scenario, group", [("resume", "'0' of 4"), ("new_group", "'1' of 4")])
def test_a_barrier_a_rank_never_joins_raises_within_the_groups_timeout(
        testbed: Any, scenario: str, group: str) -> None:
    results = run_scenario(testbed, scenario)
    callers = [r for r in results if r["called"]]
    assert len(callers) == (1 if scenario == "new_group" else 3)
    for r in callers:
        barrier = r["barrier"]
        assert barrier["error"].startswith(f"CollectiveTimeout: barrier on process group "
                                           f"{group} ranks (oddl) Timed out after "), barrier
        assert f"within its timeout of {TIMEOUT_S:g} s" in barrier["error"]
        assert TIMEOUT_S <= barrier["seconds"] < 10 * TIMEOUT_S, barrier
        # the sequence is broken: refused at once, saying how to go on
        following = r["next"]
        assert following["error"].startswith("CollectiveError: all_reduce not sent: an "
                                              "earlier collective failed"), following
        assert "make a new process group on every rank" in following["error"]
        assert following["seconds"] < TIMEOUT_S
    if scenario == "resume":  # the way on: a new group re-agrees the step numbers
        for r in results:
            assert r["fresh"]["error"] == "" and r["fresh_sum"] == [10.0] * 3, r
            assert r["world_after"]["error"] == "", r


@pytest.mark.e2e
@pytest.mark.timeout(200)
def test_a_subgroups_timeout_bounds_its_flows(testbed: Any) -> None:
    """PyTorch's `test_barrier_timeout_group`: a subgroup of ranks [1, 2] with its own
    timeout, rank 1 alone in its barrier; then a receive from rank 2, which never sends."""
    [caller] = [r for r in run_scenario(testbed, "subgroup") if r["called"]]
    barrier, receive = caller["barrier"], caller["next"]
    assert barrier["error"].startswith("CollectiveTimeout: barrier on process group '1' of 2 "
                                       "ranks (oddl) Timed out after "), barrier
    assert TIMEOUT_S <= barrier["seconds"] < 10 * TIMEOUT_S, barrier
    # the group's timeout bounds its point-to-point calls too (the agent gave up the receive)
    assert receive["error"].startswith("CollectiveTimeout: recv on process group '1' of 2 "
                                       "ranks (oddl) Timed out after "), receive
    assert TIMEOUT_S <= receive["seconds"] < 10 * TIMEOUT_S, receive

