"""The oddl backend's call and byte counters per collective kind (`oddl.torch.backend`
re-exports `counters` and `reset_counters`)."""

from __future__ import annotations

import threading
from typing import Any

_counter_lock = threading.Lock()
_counters: dict[str, dict[str, int]] = {}


def count(kind: str, optical: int = 0, fallback: int = 0) -> None:
    """Count one call of `kind` and the bytes it sent over the optics or the fallback."""
    with _counter_lock:
        c = _counters.setdefault(kind, {"calls": 0, "optical_bytes": 0, "fallback_calls": 0,
                                        "fallback_bytes": 0})
        c["calls"] += 1
        c["optical_bytes"] += optical
        c["fallback_bytes"] += fallback
        c["fallback_calls"] += bool(fallback)


def counters() -> dict[str, Any]:
    """This process's counters per collective kind, and totals: calls, bytes handed to the
    agent (over the optical circuits), calls and bytes that went to the gloo fallback."""
    with _counter_lock:
        kinds = {k: dict(v) for k, v in _counters.items()}
    total = {f: sum(v[f] for v in kinds.values())
             for f in ("calls", "optical_bytes", "fallback_calls", "fallback_bytes")}
    return {"kinds": kinds, "total": total}


def reset_counters() -> None:
    """Zero the counters (e.g. at the start of an iteration)."""
    with _counter_lock:
        _counters.clear()
