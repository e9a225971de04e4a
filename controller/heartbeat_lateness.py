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
from dataclasses import dataclass

KEPT = 4096
"""At most this many readings per period (a sample of a larger fleet's)."""


class Lateness:
    """The lateness of the heartbeats read this sweep period and the one before."""

    def __init__(self) -> None:
        self._now: list[float] = []
        self._before: list[float] = []
        self._last_s = 0.0
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
        """The median lateness of the heartbeats read this period and the one before, s;
        with none read, the last median (nothing read is no news that the controller caught
        up: a hold lasts, and `HOLD_CAP_INTERVALS` bounds it; 0 before any was read)."""
        with self._lock:
            seen = self._now + self._before
            if seen:
                self._last_s = statistics.median(seen)
            return self._last_s

    def next_period(self) -> None:
        """Start a new period (the monitor's sweep calls it)."""
        with self._lock:
            self._before, self._now = self._now, []


HOLD_CAP_INTERVALS = 10.0
"""A hold that has lasted this many heartbeat intervals judges read silence again, with the
lateness as grace (`Behind.grace_s`): a controller that stays behind still finds the dead that
send no times (decision record 0038)."""


@dataclass(frozen=True)
class Behind:
    """How a held sweep judges while the controller reads late (decision record 0038).

    Always: an agent whose newest heartbeat was *sent* three intervals or more before the
    send front (`front_ns`), and *read* three intervals ago or more, is dead, however late
    the controller reads: its peers' later beats came through, its own did not. Once the hold
    is `capped`: an agent read-silent for three intervals plus `grace_s` too (counted from the
    hold's start), for the agents that send no times.
    """

    capped: bool = False
    grace_s: float = 0.0


def send_front_ns(newest: list[int]) -> int:
    """The send front: the latest time such that most agents (more than half) have a
    heartbeat sent at or after it read (`newest`: each live agent's newest send time, 0
    for none); 0 when none sent a time."""
    if not newest:
        return 0
    return statistics.median_low(newest)
