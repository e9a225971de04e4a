"""Clock-offset estimation between an agent and the controller (NTP-style, pure).

One sample is four timestamps: agent send t1, controller receive t2, controller send t3, agent
receive t4 (ns, each on its own clock). offset = ((t2 - t1) + (t3 - t4)) / 2 is controller
minus agent. Whatever the two one-way delays are (as long as neither is negative), the true
offset lies within half the round trip (t4 - t1) - (t3 - t2) of that figure (RFC 5905, section
8). A sample ages: the two clocks drift apart by at most `drift_ppm` (RFC 5905's frequency
tolerance, 15 ppm, unless told otherwise), so a sample taken `a` seconds ago bounds the offset
to half its round trip plus drift · a.

`ClockFilter` keeps a window of samples and reports the one whose aged bound is smallest now,
with that bound: a sample that queued behind other traffic, or one taken while a link comes
back from an outage, is simply never the best while a better one (fresh or a little older) is
in the window. A sample whose interval cannot overlap the best one's means that a clock was
stepped (or drifted faster than assumed): after `STEP_CONFIRM` such samples in a row the
window is started afresh from them, and the estimate before that stays in force meanwhile.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

DRIFT_PPM = 15.0
"""How fast two clocks may drift apart (RFC 5905's PHI, 15e-6 s/s)."""

STEP_CONFIRM = 3
"""Inconsistent samples in a row that show a clock step (one alone is ignored)."""


@dataclass(frozen=True)
class ClockSample:
    """Four timestamps of one exchange, in nanoseconds."""

    t1: int
    t2: int
    t3: int
    t4: int

    @property
    def offset_s(self) -> float:
        """Controller clock minus agent clock."""
        return ((self.t2 - self.t1) + (self.t3 - self.t4)) / 2e9

    @property
    def rtt_s(self) -> float:
        """Network round trip, excluding the controller's processing time."""
        return ((self.t4 - self.t1) - (self.t3 - self.t2)) / 1e9

    def bound_s(self, now_ns: int, drift_ppm: float = DRIFT_PPM) -> float:
        """Half the round trip plus the drift since the sample (at agent time `now_ns`)."""
        return self.rtt_s / 2 + drift_ppm * 1e-6 * max(now_ns - self.t4, 0) / 1e9


@dataclass(frozen=True)
class ClockEstimate:
    """The offset estimate (controller minus agent) and the bound on its error."""

    offset_s: float
    rtt_s: float
    error_bound_s: float = math.inf
    """The true offset is within this of `offset_s`; infinite before the first sample."""
    age_s: float = 0.0
    """How long ago the sample it rests on was taken."""
    samples: int = 0
    """Samples in the window."""

    @property
    def known(self) -> bool:
        """True once a sample supports the estimate."""
        return math.isfinite(self.error_bound_s)


UNKNOWN = ClockEstimate(0.0, 0.0)
"""No sample yet: offset 0, unbounded error."""


def _disjoint(a: ClockSample, b: ClockSample, now_ns: int, drift_ppm: float) -> bool:
    """True when the offset intervals of `a` and `b` (aged to `now_ns`) cannot overlap."""
    return abs(a.offset_s - b.offset_s) > a.bound_s(now_ns, drift_ppm) + b.bound_s(now_ns,
                                                                                   drift_ppm)


class ClockFilter:
    """A window of clock samples and the best estimate they give (see the module docstring)."""

    def __init__(self, window: int = 64, drift_ppm: float = DRIFT_PPM):
        if window < 1:
            raise ValueError("the clock filter needs a window of at least one sample")
        self.drift_ppm = drift_ppm
        self._samples: deque[ClockSample] = deque(maxlen=window)
        self._suspects: list[ClockSample] = []
        self.steps = 0
        """How many clock steps the filter has seen (each restarted the window)."""

    def add(self, sample: ClockSample) -> None:
        """Take one sample (one whose round trip is negative, a clock that went back during
        the exchange, is dropped)."""
        if sample.rtt_s < 0:
            return
        best = self._best(sample.t4)
        if best is None or not _disjoint(best, sample, sample.t4, self.drift_ppm):
            self._suspects.clear()
            self._samples.append(sample)
            return
        self._suspects.append(sample)
        if len(self._suspects) >= STEP_CONFIRM:
            self._samples.clear()
            self._samples.extend(self._suspects)
            self._suspects.clear()
            self.steps += 1

    def _best(self, now_ns: int) -> ClockSample | None:
        return min(self._samples, key=lambda s: s.bound_s(now_ns, self.drift_ppm), default=None)

    def estimate(self, now_ns: int) -> ClockEstimate:
        """The best estimate at agent time `now_ns` (`UNKNOWN` without samples)."""
        best = self._best(now_ns)
        if best is None:
            return UNKNOWN
        return ClockEstimate(best.offset_s, best.rtt_s, best.bound_s(now_ns, self.drift_ppm),
                             max(now_ns - best.t4, 0) / 1e9, len(self._samples))


def estimate(samples: list[ClockSample], now_ns: int | None = None) -> ClockEstimate:
    """The best estimate of `samples` at `now_ns` (default: the newest sample's t4)."""
    f = ClockFilter(max(len(samples), 1))
    for s in samples:
        f.add(s)
    if now_ns is None:
        now_ns = max((s.t4 for s in samples), default=0)
    return f.estimate(now_ns)
