"""The sizes of an OptINC network (`Shape`) and the checks of its hardware parameters.

Shared by the network (`oddl.offline.optinc.onn`), its designed phases (`oddl.offline.optinc.design`)
and its training (`oddl.offline.optinc.train`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from oddl.offline.optinc.levels import OptincError

BIAS_SCALE = 0.6
"""Threshold of the thresholders times √R (the bias a unit at the top threshold needs ≈ 0)."""


def default_transceivers(bits: int) -> int:
    """PAM4 transceivers (2 bits each) when b is even, else on-off keying (1 bit each)."""
    return bits // 2 if bits % 2 == 0 and bits > 1 else bits


@dataclass(frozen=True)
class Shape:
    """Sizes of one network (all derived from N, b, M and the number of blocks R)."""

    n_inputs: int
    bits: int
    transceivers: int
    blocks: int

    @property
    def digit_bits(self) -> int:
        """c = b/M bits per transceiver."""
        return self.bits // self.transceivers

    @property
    def digit_top(self) -> int:
        """Largest digit 2**c − 1 (PAM levels − 1)."""
        return (1 << self.digit_bits) - 1

    @property
    def k(self) -> int:
        """Block size: M digit sums + the bias laser."""
        return self.transceivers + 1

    @property
    def hidden(self) -> int:
        """H = R·k thresholders."""
        return self.blocks * self.k

    @property
    def sum_levels(self) -> int:
        """Values a digit sum takes: N·(2**c − 1) + 1."""
        return self.n_inputs * self.digit_top + 1

    @property
    def thresholds(self) -> int:
        """Rounding thresholds of the mean: 2**b − 1 (one block each in the designed network)."""
        return (1 << self.bits) - 1


def check_phase_bits(bits: Any) -> int | None:
    """None (full precision) or a DAC resolution in 1..24 bits."""
    if bits is None:
        return None
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 24:
        raise OptincError(f"phase_bits must be None (full precision) or an integer in 1..24, "
                          f"got {bits!r}")
    return int(bits)


def check_nonneg(name: str, value: Any) -> float:
    """A finite number ≥ 0, or OptincError naming ``name``."""
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise OptincError(f"{name} must be a number, got {value!r}") from exc
    if not math.isfinite(v) or v < 0:
        raise OptincError(f"{name} must be finite and ≥ 0, got {value!r}")
    return v
