"""Device commands on the trace (docs/reference/trace-format.md, category ``device``): the driver seam.

Each driver's one exchange function (an ITLA register exchange, a WSS command line, a power
meter's SCPI line) runs through `traced` while the process records: one complete event per
command on the device's own process (``device itla-n0``), from the moment it is sent to its
reply, with whether it succeeded and what came back (or the error). While nothing records,
`traced` is the plain call after one attribute check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from oddl.common.tracing import TRACE, Track

T = TypeVar("T")

RESULT_CHARS = 120
"""A result or error longer than this is cut (the trace keeps the gist, the log the rest)."""


def traced(device: str, command: str, call: Callable[[], T],
           result: Callable[[T], str] = str) -> T:
    """Run `call` (one command to `device`); record it when tracing is on."""
    if not TRACE.on:
        return call()
    start = TRACE.now_ns()
    try:
        out = call()
    except Exception as exc:
        _record(device, command, start, False, f"{type(exc).__name__}: {exc}")
        raise
    _record(device, command, start, True, result(out))
    return out


def _record(device: str, command: str, start: int, ok: bool, result: str) -> None:
    TRACE.complete(Track(f"device {device}", "commands"), command, "device", start,
                   TRACE.now_ns(), {"device": device, "command": command, "ok": ok,
                                    "result": result[:RESULT_CHARS]})
