"""Warn once per excursion, rate-limited (pure: the caller passes the time).

An excursion is a stretch of checks that find something out of budget (the clock's error
bound above `clock_skew_us`, the links carrying well below `line_rate_gbps`). The first check
of an excursion warns; the rest of it stays quiet; a check in budget ends it. Two warnings are
at least `min_interval_s` apart, so a figure that flaps around its limit does not flood the
log: an excursion that starts too soon after the last warning warns once the interval has
passed, if it still lasts.
"""

from __future__ import annotations


class Excursion:
    """Whether a check that finds something out of budget should warn now."""

    def __init__(self, min_interval_s: float = 300.0):
        self.min_interval_s = min_interval_s
        self.active = False
        """True while the checks find the figure out of budget."""
        self.warnings = 0
        self._warned = False
        self._last: float | None = None

    def check(self, out_of_budget: bool, now_s: float) -> bool:
        """Record one check at `now_s` (seconds, any monotonic clock); True: warn now."""
        if not out_of_budget:
            self.active = self._warned = False
            return False
        self.active = True
        if self._warned:
            return False
        if self._last is not None and now_s - self._last < self.min_interval_s:
            return False
        self._warned = True
        self._last = now_s
        self.warnings += 1
        return True
