"""Fault settings shared by the device emulators: validated from a test or a testbed file.

A subclass is a dataclass whose fields are typed `int` (a counter, >= 0), `bool` (a switch),
`float` named `*_probability` (0..1) or any other `float` (seconds, >= 0); `LABEL` names the
device kind in error messages. ``LinkFaults`` holds the faults every serial-link emulator
(ITLA, WSS) offers: lost, late and garbled answers and a reset.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from oddl.common.errors import ConfigError


@dataclass
class FaultSettings:
    """Validation and construction shared by every emulator's fault dataclass (a dataclass
    without fields itself: each emulator's subclass adds them)."""

    LABEL: ClassVar[str] = "device"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first field with an impossible value."""
        for f in fields(self):
            value: Any = getattr(self, f.name)
            kind = str(f.type)
            where = f"{self.LABEL} faults: {f.name} = {value!r}"
            if kind == "bool":
                if not isinstance(value, bool):
                    raise ConfigError(f"{where}; expected true or false")
            elif kind == "int":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(f"{where}; expected an integer >= 0")
            elif isinstance(value, bool) or not isinstance(value, int | float) or not (
                    math.isfinite(value) and value >= 0):
                raise ConfigError(f"{where}; expected a number >= 0")
            elif f.name.endswith("_probability") and value > 1:
                raise ConfigError(f"{where}; expected a number in 0..1")

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> Self:
        """Build from a config mapping; unknown keys and bad values raise ConfigError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{cls.LABEL} faults: unknown key(s) {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(known))}")
        faults = cls()
        for key, value in data.items():
            setattr(faults, key, value)
        faults.validate()
        return faults

    def merged(self, changes: Mapping[str, object]) -> Self:
        """A copy with `changes` applied (ConfigError for unknown names or bad values)."""
        merged = {f.name: getattr(self, f.name) for f in fields(self)}
        unknown = sorted(set(changes) - set(merged))
        if unknown:
            raise ConfigError(f"{self.LABEL} faults: unknown key(s) {', '.join(unknown)}")
        merged.update(changes)
        return self.from_mapping(merged)


@dataclass
class LinkFaults(FaultSettings):
    """Faults of a serial link, counted per received request (a frame or a command line)."""

    no_answer: int = 0
    """Drop the next k requests unexecuted (no answer)."""
    no_answer_always: bool = False
    """Never answer (a dead or unplugged module)."""
    late_s: float = 0.0
    """Delay every answer by this many seconds."""
    garbage: int = 0
    """Answer the next k requests with random bytes."""
    reset_next: bool = False
    """On the next request, reset to the power-on state; that request gets no answer."""
    drop_probability: float = 0.0
    """Chance (seeded) that any request goes unanswered."""
    garbage_probability: float = 0.0
    """Chance (seeded) that any answer is garbage."""

    def drop_answer(self, rng: random.Random) -> bool:
        """Whether this request goes unanswered (and unexecuted); counts ``no_answer`` down."""
        if self.no_answer_always:
            return True
        if self.no_answer > 0:
            self.no_answer -= 1
            return True
        return self.drop_probability > 0 and rng.random() < self.drop_probability

    def garble_answer(self, rng: random.Random) -> bool:
        """Whether this answer is replaced by garbage; counts ``garbage`` down."""
        if self.garbage > 0 or (self.garbage_probability > 0
                                and rng.random() < self.garbage_probability):
            self.garbage = max(0, self.garbage - 1)
            return True
        return False
