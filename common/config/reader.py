"""Reading one TOML table or array of tables against a schema: unknown keys, missing keys and
wrong values fail with the file, the key and the fix (:class:`TableReader`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

from oddl.common.errors import ConfigError

REQUIRED = object()
"""Default of a key that must be given."""

Spec = Mapping[str, tuple[Callable[[Any, str], Any], Any]]
"""A table's schema: key → (converter of (value, key), default or :data:`REQUIRED`)."""


class TableReader:
    """Checks tables of one testbed file (`path`, named in every error) against their specs."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, key: str, problem: str, fix: str) -> ConfigError:
        """The error to raise: ``FILE: KEY: PROBLEM; FIX``."""
        return ConfigError(f"{self.path}: {key}: {problem}; {fix}")

    def table(self, raw: Any, key: str, spec: Spec) -> dict[str, Any]:
        """Check one table against `spec` (name → (converter, default)); reject unknown keys."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise self.fail(key, f"expected a table, got {type(raw).__name__}",
                            f"write it as [{key}] with key = value lines")
        for name in raw:
            if name not in spec:
                near = difflib.get_close_matches(name, list(spec), n=1)
                hint = f"did you mean {near[0]!r}?" if near else f"known keys: {', '.join(spec)}"
                raise self.fail(f"{key}.{name}", "unknown key", f"remove it ({hint})")
        out: dict[str, Any] = {}
        for name, (conv, default) in spec.items():
            if name in raw:
                out[name] = conv(raw[name], f"{key}.{name}")
            elif default is REQUIRED:
                raise self.fail(f"{key}.{name}", "missing", f"add {name} = … to {key}")
            else:
                out[name] = default
        return out

    # converters -------------------------------------------------------------------------
    def num(self, lo: float | None = None, hi: float | None = None, *, positive: bool = False
            ) -> Callable[[Any, str], float]:
        """Converter of a finite number, optionally in [lo, hi] or > 0."""
        def conv(v: Any, key: str) -> float:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise self.fail(key, f"expected a number, got {v!r}", "write a plain number")
            if positive and v <= 0:
                raise self.fail(key, f"must be > 0, got {v}", "use a positive value")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                raise self.fail(key, f"{v} is outside [{lo}, {hi}]", "use a value in that range")
            return float(v)
        return conv

    def integer(self, lo: int | None = None, hi: int | None = None) -> Callable[[Any, str], int]:
        """Converter of a whole number, optionally in [lo, hi]."""
        def conv(v: Any, key: str) -> int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise self.fail(key, f"expected an integer, got {v!r}", "write a whole number")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                raise self.fail(key, f"{v} is outside [{lo}, {hi}]", "use a value in that range")
            return v
        return conv

    def text(self, choices: tuple[str, ...] = ()) -> Callable[[Any, str], str]:
        """Converter of a string, optionally one of `choices`."""
        def conv(v: Any, key: str) -> str:
            if not isinstance(v, str):
                raise self.fail(key, f"expected a string, got {v!r}", 'quote it: key = "value"')
            if choices and v not in choices:
                raise self.fail(key, f"{v!r} is not one of {', '.join(choices)}",
                                "use one of those")
            return v
        return conv

    def pair(self, kind: type) -> Callable[[Any, str], tuple[Any, Any]]:
        """Converter of ``[low, high]`` (two numbers of `kind`, low first)."""
        def conv(v: Any, key: str) -> tuple[Any, Any]:
            ok = (isinstance(v, list) and len(v) == 2
                  and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
                  and (kind is float or all(isinstance(x, int) for x in v)))
            if not ok or v[0] > v[1]:
                raise self.fail(key, f"expected [low, high], got {v!r}",
                                "write two numbers, low first, e.g. [0, 13]")
            return (kind(v[0]), kind(v[1]))
        return conv

    def anytable(self, v: Any, key: str) -> dict[str, Any]:
        """Converter of an inline table, kept as a dict (device faults)."""
        if not isinstance(v, dict):
            raise self.fail(key, f"expected a table, got {v!r}", "write it as an inline table {…}")
        return dict(v)

    def array(self, raw: Any, key: str) -> list[dict[str, Any]]:
        """An array of tables (``[[key]]`` entries); none if absent."""
        if raw is None:
            return []
        if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
            raise self.fail(key, "expected an array of tables", f"write each entry as [[{key}]]")
        return raw

    @staticmethod
    def entry_key(section: str, index: int, entry: Mapping[str, Any]) -> str:
        """How errors name an entry of an array of tables: ``devices[2] (wss0)``."""
        name = entry.get("id")
        return f"{section}[{index}]" + (f" ({name})" if isinstance(name, str) else "")
