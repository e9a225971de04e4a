"""The announcer (`oddl.controller.announcer`): a burst of registrations, one announcement."""

from __future__ import annotations

import threading

from oddl.controller.announcer import Announcer


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_first_after_a_quiet_spell_goes_at_once_and_a_burst_together() -> None:
    heard = threading.Event()
    calls: list[set[str]] = []

    def announce(jobs: set[str]) -> None:
        calls.append(jobs)
        heard.set()

    clock = Clock()
    a = Announcer(announce, quiet_s=3600, longest_s=3600, clock=clock)  # never due by itself
    a.later("job-0")  # within the quiet spell after it was made (a restart's burst): gathered
    a.later("job-1")
    assert not heard.wait(0.2)  # (under load this may pass without proving much, never fail)
    a.flush()
    assert calls == [{"job-0", "job-1"}]
    heard.clear()
    clock.now = 20_000.0  # a quiet spell since that announcement
    a.later("job-1")  # the leading edge: at once
    assert heard.wait(60)
    for job in ("job-2", "job-3", "job-2"):  # within the quiet spell: gathered
        a.later(job)
    a.flush()
    a.flush()  # nothing pending: nothing announced
    assert calls == [{"job-0", "job-1"}, {"job-1"}, {"job-2", "job-3"}]
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


def test_settle_returns_only_once_an_announcement_under_way_is_told() -> None:
    """What a caller drains after `settle` holds every earlier registration's announcement,
    even one the announcer's thread had taken and not yet told (the race CI once lost)."""
    started, release = threading.Event(), threading.Event()
    calls: list[set[str]] = []

    def announce(jobs: set[str]) -> None:
        started.set()
        assert release.wait(60)
        calls.append(jobs)

    clock = Clock()
    a = Announcer(announce, quiet_s=3600, longest_s=3600, clock=clock)
    clock.now = 10_000.0  # a quiet spell since it was made
    a.later("job-1")  # the leading edge: the thread takes it at once, then blocks
    assert started.wait(60)
    settled = threading.Event()
    waiter = threading.Thread(target=lambda: (a.settle(), settled.set()))
    waiter.start()
    assert not settled.wait(0.2)  # the announcement under way is not told yet: still waiting
    release.set()
    waiter.join(60)
    assert settled.is_set() and calls == [{"job-1"}]
    a.close()
