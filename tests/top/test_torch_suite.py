"""PyTorch's own distributed suite on the oddl backend: the fast subset must keep passing.

`make test` runs tests/workers/torch_suite.py's FAST selection (a few tests of every family) with
BACKEND=oddl on the emulated testbed; every test recorded in
tests/data/torch_suite_oddl_passes.json must still pass, each failure shown with its reason.
`make torch-suite` runs every family on oddl and on gloo in the same run (docs/how-to/torch-backend.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # the suite's own import (the extra `oddl[torch]`)

import torch_suite  # noqa: E402  (tests/workers/torch_suite.py, after the skips)


@pytest.fixture(autouse=True)
def _forked_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks fork from a runner that imported torch and the suite once: the same tests,
    ~5× faster than spawned ranks that each import them anew (`torch_suite.START`)."""
    monkeypatch.setenv(torch_suite.START, "fork")


def test_the_families_sort_the_suites_names():
    assert torch_suite.family_of("test_all_reduce_sum") == "all_reduce"
    assert torch_suite.family_of("test_all_reduce_group_max") == "*_group"
    assert torch_suite.family_of("test_all_reduce_full_group_max") == "all_reduce"
    assert torch_suite.family_of("test_reduce_sum_twice") == "reduce"
    assert torch_suite.family_of("test_send_recv_any_source") == "send/recv"
    assert torch_suite.family_of("test_ddp_create_graph") == "DDP"
    assert torch_suite.family_of("test_get_rank") is None
    reason = torch_suite.reason_of({"reason": "Traceback ...\noddl.torch_channel."
                                              "UnsupportedCollective: send: no\n\n"})
    assert reason == "UnsupportedCollective: send: no"


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_oddl_keeps_passing_what_it_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    recorded = set(json.loads(torch_suite.PASSES.read_text())["oddl"])
    assert recorded <= set(torch_suite.FAST), "the record names tests the fast run leaves out"
    monkeypatch.setenv("TORCH_SUITE_LOGS", str(tmp_path))
    results = torch_suite.run_suite(list(torch_suite.FAST), ["oddl"], workdir=tmp_path)["oddl"]
    lost = {n: torch_suite.reason_of(results[n]) if n in results else "not run"
            for n in sorted(recorded) if results.get(n, {}).get("status") != "passed"}
    assert not lost, f"oddl no longer passes: {json.dumps(lost, indent=1)}\n" + "\n".join(
        _what_the_run_logged(tmp_path, list(lost)))


RANK_PATH_FAMILIES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
                      "all_to_all", "DDP")
"""The families whose calls the ranks run themselves on an ideal-network job (decision record
0040): what the agent path passes of them in the fast run, the rank path must pass too."""


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_the_ranks_moving_their_own_bytes_pass_what_the_agents_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    recorded = set(json.loads(torch_suite.PASSES.read_text())["oddl"])
    names = [n for n in torch_suite.FAST
             if n in recorded and torch_suite.family_of(n) in RANK_PATH_FAMILIES]
    assert len(names) >= 8, names
    monkeypatch.setenv("TORCH_SUITE_LOGS", str(tmp_path))
    in_ranks: list[int] = []
    results = torch_suite.run_suite(names, ["oddl"], workdir=tmp_path, rank_path=True,
                                    in_ranks=in_ranks)["oddl"]
    assert len(in_ranks) == 4 and min(in_ranks) > 0, f"ran through the agents: {in_ranks}"
    lost = {n: torch_suite.reason_of(results[n]) if n in results else "not run"
            for n in names if results.get(n, {}).get("status") != "passed"}
    assert not lost, f"on the rank path oddl fails: {json.dumps(lost, indent=1)}\n" + "\n".join(
        _what_the_run_logged(tmp_path, list(lost)))


@pytest.mark.e2e
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", sorted(set(torch_suite.BARRIER_TIMEOUTS.values())))
def test_the_barrier_timeout_tests_pass_with_the_gloo_gate_lifted(
        world: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """PyTorch's `test_barrier_timeout_*` skip every backend but gloo ("Only gloo backend
    supports timeouts"); lifted, they run on oddl and must pass: a barrier rank 0 alone makes
    raises "Timed out" no sooner than the group's timeout, and the next test's new group
    pairs cleanly although rank 0's agent used steps the other ranks never made."""
    names = [n for n, w in torch_suite.BARRIER_TIMEOUTS.items() if w == world]
    monkeypatch.setenv("TORCH_SUITE_LOGS", str(tmp_path))
    monkeypatch.setenv(torch_suite.LIFT_GATES, "1")
    results = torch_suite.run_suite(names, ["oddl"], world, workdir=tmp_path)["oddl"]
    outcome = {n: (results.get(n, {}).get("status"), torch_suite.reason_of(results[n])
                   if n in results else "not run") for n in names}
    failed = [n for n, (status, _) in outcome.items() if status != "passed"]
    assert not failed, f"{json.dumps(outcome, indent=1)}\n" + "\n".join(
        _what_the_run_logged(tmp_path, failed))


def _what_the_run_logged(folder: Path, failed: list[str]) -> list[str]:
    """The ranks' output of each failed test and the warnings of every service (CI keeps no
    files: the assertion message is all a reader of a red run gets)."""
    out = []
    ranks = (folder / "torch-suite-oddl.log").read_text(errors="replace").splitlines()
    for name in failed:
        begun = [i for i, line in enumerate(ranks) if line.startswith(f"[oddl] {name} ")]
        if begun:
            out.append(f"--- the ranks of {name}:\n" + "\n".join(
                ranks[begun[0]:begun[-1] + 1][-60:]))
    for log in sorted(folder.glob("agent-*.log")) + [folder / "controller.log"]:
        warned = [line for line in log.read_text(errors="replace").splitlines()
                  if " WARNING " in line or " ERROR " in line]
        out.append(f"--- {log.name}, its last warnings:\n" + "\n".join(warned[-15:]))
    return out
