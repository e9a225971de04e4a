"""What the direct links really carry, measured from the traffic (pure but for a lock).

Each chunk a stream receives is timed from its header to its last byte: the sender writes a
chunk in one go, so its bytes arrive as fast as the link carries them (a receiver that fell
behind reads bytes already queued, which only makes the figure higher, never lower). Chunks
under `MIN_CHUNK_BYTES` are left out (their time is mostly latency), and the measured rate is
the median of the last `window` chunks' rates, so neither a stalled read nor a burst from the
socket buffer moves it. Nothing is sent to measure: collectives are never disturbed.

`rate_warning` compares it with `[fabric] line_rate_gbps`, the rate every slot is sized
with: a link that carries well under it overruns its slots.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

MIN_CHUNK_BYTES = 256 << 10
"""Smaller chunks are not timed."""

MIN_CHUNKS = 8
"""Chunks timed before the rate is reported."""

WELL_BELOW = 0.8
"""A measured rate under this fraction of `line_rate_gbps` is out of budget."""


class LineRateMeter:
    """The rate of the last `window` big chunks a node received (thread-safe)."""

    def __init__(self, window: int = 64):
        self._rates: deque[float] = deque(maxlen=window)
        self._lock = threading.Lock()
        self.chunks = 0

    def add(self, nbytes: int, seconds: float) -> None:
        """One chunk of `nbytes` read in `seconds`, from its header to its last byte."""
        if nbytes < MIN_CHUNK_BYTES or seconds <= 0:
            return
        with self._lock:
            self._rates.append(nbytes * 8 / seconds)
            self.chunks += 1

    def measured_bps(self) -> float | None:
        """The median rate (bit/s) of the window, or None before `MIN_CHUNKS` chunks."""
        with self._lock:
            if len(self._rates) < MIN_CHUNKS:
                return None
            return float(statistics.median(self._rates))


def rate_warning(node: str, measured_bps: float | None, configured_gbps: float,
                 testbed: str) -> str | None:
    """The warning when the links carry well below the configured rate, else None."""
    if measured_bps is None or measured_bps >= WELL_BELOW * configured_gbps * 1e9:
        return None
    measured = measured_bps / 1e9
    return (f"{node}: the direct links carry {measured:.3g} Gbit/s (median of the chunks "
            f"received lately), well below [fabric] line_rate_gbps = {configured_gbps:g} in "
            f"{testbed}: every slot is sized at the configured rate, so the data runs over "
            f"its slots. Set [fabric] line_rate_gbps to what the links carry (about "
            f"{measured:.3g}) in {testbed} and restart the controller and agents")
