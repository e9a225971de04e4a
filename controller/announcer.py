"""Announcing a job's peers once for many registrations (ADR 0032).

When an agent registers (or comes back from the dead), the other nodes of its running jobs
learn its data address in a `JobAssigned` that lists every peer. Announced at each
registration, a controller restart with a job of N nodes sends N·N events of N peers each:
at 256 nodes that is 16 million entries and gigabytes of queued events. `Announcer` gathers
the jobs to announce for a short window and then announces each once, to every node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

WINDOW_S = 0.1
"""How long registrations gather before their jobs are announced: a restart's burst of
re-registrations is announced a few times, not once per agent."""


class Announcer:
    """Calls `announce(job_ids)` at most once per `window_s`, with every job asked for since."""

    def __init__(self, announce: Callable[[set[str]], None], window_s: float = WINDOW_S):
        self._announce = announce
        self._window_s = window_s
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._timer: threading.Timer | None = None
        self._closed = False

    def later(self, job_id: str) -> None:
        """Announce `job_id` at the end of the current window (opening one if none is)."""
        with self._lock:
            if self._closed:
                return
            self._pending.add(job_id)
            if self._timer is None:
                self._timer = threading.Timer(self._window_s, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        """Announce what is pending now."""
        with self._lock:
            pending, self._pending = self._pending, set()
            self._timer = None
        if pending:
            self._announce(pending)

    def close(self) -> None:
        """Announce nothing more."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            self._pending.clear()
