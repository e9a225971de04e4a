"""Fault settings shared by the device emulators: validated from a test or a testbed file.

A subclass is a dataclass whose fields are typed `int` (a counter, >= 0), `bool` (a switch),
`float` named `*_probability` (0..1) or any other `float` (seconds, >= 0); `LABEL` names the
device kind in error messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, ClassVar, Self

from common.errors import ConfigError


class FaultSettings:
    """Validation and construction shared by every emulator's fault dataclass."""

    LABEL: ClassVar[str] = "device"

    def validate(self) -> None:
        """Raise ConfigError naming the first field with an impossible value."""
        for f in fields(self):  # type: ignore[arg-type]
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
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{cls.LABEL} faults: unknown key(s) {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(known))}")
        faults = cls()
        for key, value in data.items():
            setattr(faults, key, value)
        faults.validate()
        return faults
