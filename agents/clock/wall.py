"""The agent's wall clock: the one seam every agent timestamp that meets the controller's clock
goes through (clock samples, slot edges, deadlines on the local clock, ready times).

`ODDL_CLOCK_SHIFT_US` shifts this clock by that many microseconds (positive = ahead). It is for
rehearsals and tests: it stands in for a host whose clock is off, so the offset estimate
(`oddl.agents.clock.offset_filter`) has something to find. Durations and the emulated light's physics use
`time.monotonic` and are not shifted.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping

from oddl.common.errors import ConfigError

SHIFT_ENV = "ODDL_CLOCK_SHIFT_US"
"""The environment variable that shifts the agent's clock (rehearsals and tests only)."""

_shift_ns = 0


def parse_shift_us(text: str) -> int:
    """The shift in nanoseconds from the variable's text (microseconds, may be negative)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or abs(value) > 3.6e9:
        raise ConfigError(f"{SHIFT_ENV}={text!r} is not a shift in microseconds; set it to a "
                          "number such as 3000 or -250 (within an hour), or unset it")
    return round(value * 1e3)


def shift_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """Take the shift from `environ` (none when unset or empty); return it in seconds."""
    global _shift_ns
    text = environ.get(SHIFT_ENV, "").strip()
    _shift_ns = parse_shift_us(text) if text else 0
    return _shift_ns / 1e9


def shift_s() -> float:
    """The shift in force, in seconds."""
    return _shift_ns / 1e9


def now() -> float:
    """The agent's time in seconds since the epoch."""
    return (time.time_ns() + _shift_ns) / 1e9


def now_ns() -> int:
    """The agent's time in nanoseconds since the epoch."""
    return time.time_ns() + _shift_ns


def from_system_ns(system_ns: int) -> int:
    """A system clock reading (a kernel timestamp, say) on the agent's clock."""
    return system_ns + _shift_ns
