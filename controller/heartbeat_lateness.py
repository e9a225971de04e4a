"""How late the controller reads its agents' heartbeats: the monitor's check on itself.

A heartbeat carries when its agent sent it, on the controller's clock as the agent estimates
it (`HeartbeatRequest.sent_ns`). Read on time, it is late by the clock's error and the
network's delay, milliseconds. Read seconds late, the controller is what is behind: its
RPCs wait in gRPC's queues while its loop writes what a thousand re-registrations asked for
(a restart), yet the loop's own ticks come on time, so its lag does not show it (decision
record 0034). Declaring agents dead then is judging them by the controller's delay.

`Lateness` keeps the heartbeats' lateness over the current and the previous sweep period;
the monitor holds its verdicts while their median is an interval or more. The median, so that
one agent with a wrong clock holds nothing; over what was read, so that agents that really
went silent (nothing read from them) do not hold their own verdict. Pure: no I/O, its own
lock (heartbeats are read on the event loop, the monitor sweeps in a thread).
"""

from __future__ import annotations

import statistics
import threading

KEPT = 4096
"""At most this many readings per period (a sample of a larger fleet's)."""


class Lateness:
    """The lateness of the heartbeats read this sweep period and the one before."""

    def __init__(self) -> None:
        self._now: list[float] = []
        self._before: list[float] = []
        self._lock = threading.Lock()

    def read(self, sent_ns: int, now_ns: int) -> None:
        """Note a heartbeat sent at `sent_ns` (0: its agent does not know the clock) read
        at `now_ns`, both on the controller's clock."""
        if sent_ns <= 0:
            return
        with self._lock:
            if len(self._now) < KEPT:
                self._now.append(max(0.0, (now_ns - sent_ns) / 1e9))

    def median_s(self) -> float:
        """The median lateness of the heartbeats read this period and the one before, s (0:
        none read)."""
        with self._lock:
            seen = self._now + self._before
        return statistics.median(seen) if seen else 0.0

    def next_period(self) -> None:
        """Start a new period (the monitor's sweep calls it)."""
        with self._lock:
            self._before, self._now = self._now, []
