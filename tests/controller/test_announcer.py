"""The announcer (`oddl.controller.announcer`): a burst of registrations, one announcement."""

from __future__ import annotations

import threading

from oddl.controller.announcer import Announcer


def test_what_was_asked_for_is_announced_once_together() -> None:
    calls: list[set[str]] = []
    a = Announcer(calls.append, quiet_s=3600, longest_s=3600)  # never due by itself here
    for job in ("job-1", "job-2", "job-1"):
        a.later(job)
    a.flush()
    a.flush()  # nothing pending: nothing announced
    assert calls == [{"job-1", "job-2"}]
    a.close()


def test_a_pause_announces_by_itself_and_close_stops_it() -> None:
    heard = threading.Event()
    calls: list[set[str]] = []

    def announce(jobs: set[str]) -> None:
        calls.append(jobs)
        heard.set()

    a = Announcer(announce, quiet_s=0.01, longest_s=0.05)
    a.later("job-1")
    assert heard.wait(60)
    assert calls == [{"job-1"}]
    a.close()
    a.later("job-2")  # closed: dropped
    a.flush()
    assert calls == [{"job-1"}]
