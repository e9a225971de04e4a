"""The announcer (`oddl.controller.announcer`): a burst of registrations, one announcement."""

from __future__ import annotations

import threading

from oddl.controller.announcer import Announcer


def test_the_first_after_a_quiet_spell_goes_at_once_and_a_burst_together() -> None:
    heard = threading.Event()
    calls: list[set[str]] = []

    def announce(jobs: set[str]) -> None:
        calls.append(jobs)
        heard.set()

    a = Announcer(announce, quiet_s=3600, longest_s=3600)  # a burst is never due by itself
    a.later("job-1")  # nothing announced before: the leading edge, at once
    assert heard.wait(60)
    for job in ("job-2", "job-3", "job-2"):  # within the quiet spell: gathered
        a.later(job)
    a.flush()
    a.flush()  # nothing pending: nothing announced
    assert calls == [{"job-1"}, {"job-2", "job-3"}]
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
