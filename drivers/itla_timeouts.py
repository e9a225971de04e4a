"""How long the ITLA driver waits for each kind of operation (``ItlaTimeouts``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ItlaTimeouts"]


@dataclass
class ItlaTimeouts:
    """How long the driver waits, in seconds; set them from the device's configuration.

    ``reply_s`` bounds one request/reply exchange (Pure Photonics' code waits 0.25 s);
    ``lock_s`` a channel or fine-tune change with the output on; ``enable_s`` the output enable
    (seconds on real modules: take it from the datasheet); ``startup_s`` how long commands
    refused with CII (module initialising after power-up or reset) are retried. The defaults
    are generous bounds, not device figures.
    """

    reply_s: float = 0.25
    lock_s: float = 5.0
    enable_s: float = 30.0
    startup_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("reply_s", "lock_s", "enable_s", "startup_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"ITLA timeout {name}={value}: expected a number of seconds > 0")
