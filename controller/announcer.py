"""Announcing a job's peers once for many registrations (ADR 0032).

When an agent registers (or comes back from the dead), the other nodes of its running jobs
learn its data address in a `JobAssigned` that lists every peer. Announced at each
registration, a controller restart with a job of N nodes sends N·N events of N peers each:
at 256 nodes that is 16 million entries and gigabytes of queued events. `Announcer` gathers
the jobs to announce until the registrations pause for `quiet_s` (or `longest_s` has passed
since the first), then announces each once, to every node, from a thread of its own: a
restart's burst of a thousand re-registrations is announced once or twice, not every 0.1 s
(one announcement to 1024 nodes costs ~0.3 s of the core's lock). A registration that comes
after a quiet spell is announced at once (the leading edge): one agent restarting must not
leave its peers sending to its old address while the announcement waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

QUIET_S = 0.1
"""Announce once no registration came for this long..."""
LONGEST_S = 1.0
"""...or this long after the first one waiting, whichever is sooner."""


class Announcer:
    """Calls `announce(job_ids)` with every job asked for (`later`) once they pause."""

    def __init__(self, announce: Callable[[set[str]], None], quiet_s: float = QUIET_S,
                 longest_s: float = LONGEST_S, clock: Callable[[], float] = time.monotonic):
        self._announce = announce
        self._quiet_s, self._longest_s = quiet_s, longest_s
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: set[str] = set()
        self._first = self._last = clock()
        """Made counts as the last registration: a controller that starts (or restarts) is
        about to hear a burst, so its first registration is gathered, not a leading edge."""
        self._flushed = -float("inf")
        self._leading = False
        """The pending jobs came after a quiet spell: announce them at once."""
        self._closed = False
        self._announcing = 0
        """Announcements under way (taken from `_pending`, not yet told): `settle` waits."""
        self._thread: threading.Thread | None = None

    def later(self, job_id: str) -> None:
        """Announce `job_id` once the registrations pause."""
        with self._cond:
            if self._closed:
                return
            now = self._clock()
            if not self._pending:
                self._first = now
                self._leading = now - max(self._flushed, self._last) > self._quiet_s
            self._pending.add(job_id)
            self._last = now
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="announcer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _due(self, now: float) -> float:
        """Seconds until the pending jobs are due (≤ 0: now)."""
        if self._leading:
            return 0.0
        return min(self._last + self._quiet_s, self._first + self._longest_s) - now

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._pending
                                            or self._due(self._clock()) > 0):
                    self._cond.wait(self._due(self._clock()) if self._pending else None)
                if self._closed:
                    return
            self.flush()

    def flush(self) -> None:
        """Announce what is pending now."""
        with self._cond:
            pending, self._pending = self._pending, set()
            self._flushed, self._leading = self._clock(), False
            self._announcing += 1
        try:
            if pending:
                self._announce(pending)
        finally:
            with self._cond:
                self._announcing -= 1
                self._cond.notify_all()

    def settle(self) -> None:
        """Announce what is pending and wait for any announcement under way to be told.

        After it returns, every registration so far has been announced: what a caller that
        drains the pushed events (a unit test, an operator's view) sees next is not a late
        announcement of an earlier registration.
        """
        self.flush()
        with self._cond:
            while self._announcing:
                self._cond.wait()

    def close(self) -> None:
        """Announce nothing more."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
