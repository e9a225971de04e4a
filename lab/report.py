"""One line per check (ok / FAIL with the reason), a summary, and the JSON report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class CheckFailed(Exception):
    """A check ran and found something wrong; the message says what."""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, fn: Callable[[], str | None]) -> bool:
        """Run one check; print its line. Any exception is a FAIL with its message."""
        start = time.monotonic()
        try:
            detail, ok = fn() or "", True
        except Exception as exc:  # the report names every failure, whatever raised it
            detail, ok = f"{type(exc).__name__}: {exc}" if not isinstance(
                exc, CheckFailed) else str(exc), False
        seconds = time.monotonic() - start
        self.checks.append(Check(name, ok, detail, seconds))
        print(f"{'ok  ' if ok else 'FAIL'} {name}{' — ' + detail if detail else ''} "
              f"({seconds:.1f} s)", flush=True)
        return ok

    def fail(self, name: str, detail: str) -> None:
        """A FAIL line for something that stopped the rehearsal outside any check."""
        self.checks.append(Check(name, False, detail, 0.0))
        print(f"FAIL {name} — {detail}", flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"note {text}", flush=True)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def summary(self) -> str:
        failed = [c for c in self.checks if not c.ok]
        head = f"{len(self.checks) - len(failed)} of {len(self.checks)} checks passed"
        return head + "".join(f"\n  FAIL {c.name}: {c.detail[:300]}" for c in failed)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"passed": self.passed,
                                    "checks": [asdict(c) for c in self.checks],
                                    "notes": self.notes,
                                    "measurements": self.measurements}, indent=2),
                        encoding="utf-8")
