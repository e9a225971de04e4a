"""What `oddl demo --train`'s parent side makes of its workers' JSON lines (`WorkersReport`):
a wrong all-reduce is a typed signal (`inexact_ranks`), not a phrase to search for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from oddl.demo.train_supervisor import WorkersReport
from oddl.launch.processes import ManagedProcess


def _quiet(_: str) -> None:
    pass


def test_a_mismatch_marks_its_rank_inexact_and_a_plain_failure_does_not() -> None:
    report = WorkersReport()
    report.event(2, {"event": "failed", "network": "optical", "mismatch": True,
                     "error": "bucket 0: element 7 differs"}, _quiet)
    report.event(1, {"event": "failed", "network": "optical", "mismatch": False,
                     "error": "TimeoutError"}, _quiet)
    assert report.inexact_ranks == {2}
    assert report.failed_ranks == {1, 2}
    assert report.problems[0].startswith("rank 2: the optical all-reduce differed from the "
                                         "exact reduction")


def test_an_exit_code_is_reported_once_per_rank() -> None:
    def worker(code: int) -> ManagedProcess:
        fake: Any = SimpleNamespace(proc=SimpleNamespace(wait=lambda _timeout: code),
                                    log_path="w.log", tail=lambda _n: "last lines")
        return cast(ManagedProcess, fake)

    report = WorkersReport()
    report.event(0, {"event": "failed", "network": "gloo", "error": "boom"}, _quiet)
    assert report.ended(0, worker(1)) and report.ended(3, worker(2))
    assert not report.ended(1, worker(0))
    assert [p.split(":")[0] for p in report.problems] == ["rank 0", "rank 3"]
    assert report.failed_ranks == {0, 3} and not report.inexact_ranks
