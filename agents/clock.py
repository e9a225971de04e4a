"""Clock-offset estimation between an agent and the controller (NTP-style, pure).

One sample is four timestamps: agent send t1, controller receive t2, controller send t3, agent
receive t4 (ns). offset = ((t2 - t1) + (t3 - t4)) / 2 is controller minus agent; the sample
with the smallest round trip (t4 - t1) - (t3 - t2) bounds the error best.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


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


@dataclass(frozen=True)
class ClockEstimate:
    """The best offset estimate and its error bound (half the round trip)."""

    offset_s: float
    rtt_s: float

    @property
    def error_bound_s(self) -> float:
        """The offset is within this of the truth, if delays are non-negative."""
        return self.rtt_s / 2


def estimate(samples: Iterable[ClockSample]) -> ClockEstimate:
    """Pick the minimum-round-trip sample; raise ValueError when there are none."""
    best = min(samples, key=lambda s: s.rtt_s, default=None)
    if best is None:
        raise ValueError("no clock samples")
    return ClockEstimate(best.offset_s, max(best.rtt_s, 0.0))
