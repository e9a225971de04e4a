"""The format check of an oddl trace file (docs/reference/trace-format.md), pure: `problems` lists what
breaks the format, `check` raises `TraceFormatError` naming the file and the first problems.

Checked: the top-level keys and ``oddl`` block; each event's phase and its fields (``dur`` ≥ 0
on ``X``, ``id`` on ``b``/``e``, ``s`` on ``i``); the arguments the format requires per
category; ``ts`` monotone per track; every async begin has its end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from oddl.common.errors import ConfigError

PHASES = frozenset("XiIbeBECM")
REQUIRED_ARGS: Mapping[str, frozenset[str]] = {
    "device": frozenset({"device", "command", "ok", "result"}),
    "retune": frozenset({"job", "seq", "slot", "transmitter", "channel", "wss", "in_port",
                         "out_port"}),
    "circuit": frozenset({"job", "seq", "slot", "src", "dst", "channel"}),
    "plan": frozenset({"job", "seq", "step", "node", "peer", "planned_start_us",
                       "planned_end_us"}),
    "control": frozenset({"job", "seq"}),
    "collective": frozenset({"job", "seq", "collective", "kind", "bytes", "step"}),
    "slot": frozenset({"job", "seq", "step", "peer", "planned_start_us", "gate_open_us",
                       "gate_error_us", "data_us", "slot_us"}),
    "chunk": frozenset({"job", "seq", "step", "peer", "offset", "bytes"}),
    "fault": frozenset({"job", "seq", "step", "peer", "by_us"}),
    "light": frozenset({"src", "receiver", "channel", "settle_us"}),
}
"""Per category, the arguments its events must carry (the ends of async pairs excepted)."""
TOP_KEYS = ("traceEvents", "displayTimeUnit", "baseTimeNanoseconds", "oddl")
ODDL_KEYS = ("format", "process", "host", "clock", "buffer_events", "recorded", "dropped",
             "started_ns", "stopped_ns")


class TraceFormatError(ConfigError):
    """A file that is not an oddl trace (or breaks the format)."""


def problems(doc: Any, limit: int = 20) -> list[str]:
    """What in `doc` (a loaded trace file) breaks the format; empty when it conforms."""
    if not isinstance(doc, dict):
        return ["the file is not a JSON object with traceEvents"]
    found = [f"no top-level {key!r}" for key in TOP_KEYS if key not in doc]
    oddl = doc.get("oddl", {})
    found += [f"no oddl.{key}" for key in ODDL_KEYS if key not in oddl]
    if not str(oddl.get("format", "")).startswith("oddl-trace/"):
        found.append(f"oddl.format is {oddl.get('format')!r}, not oddl-trace/N")
    last: dict[tuple[int, int], float] = {}
    open_async: Counter[tuple[Any, ...]] = Counter()
    for i, ev in enumerate(doc.get("traceEvents", [])):
        found += _event_problems(i, ev, last, open_async)
        if len(found) >= limit:
            return found[:limit]
    found += [f"async {key[2]!r} (cat {key[1]}, id {key[3]}) on pid {key[0]} has "
              f"{abs(n)} unmatched {'begin' if n > 0 else 'end'}(s)"
              for key, n in open_async.items() if n]
    return found[:limit]


def _event_problems(i: int, ev: Any, last: dict[tuple[int, int], float],
                    open_async: Counter[tuple[Any, ...]]) -> list[str]:
    if not isinstance(ev, dict):
        return [f"traceEvents[{i}] is not an object"]
    ph = ev.get("ph")
    where = f"traceEvents[{i}] ({ev.get('name')!r})"
    if ph not in PHASES:
        return [f"{where}: phase {ph!r} is not one of {''.join(sorted(PHASES))}"]
    out = [f"{where}: no {key}" for key in ("name", "pid", "tid", "ts") if key not in ev]
    if out or ph == "M":
        return out
    ts = float(ev["ts"])
    track = (ev["pid"], ev["tid"])
    if ts < last.get(track, float("-inf")):
        out.append(f"{where}: ts {ts} goes back in time on pid {track[0]} tid {track[1]}")
    last[track] = ts
    if ph == "X" and not float(ev.get("dur", -1)) >= 0:
        out.append(f"{where}: complete event without dur >= 0")
    if ph in "be":
        if "id" not in ev:
            out.append(f"{where}: async event without id")
        open_async[(ev["pid"], ev.get("cat"), ev["name"], ev.get("id"))] += 1 if ph == "b" else -1
    if ph == "e":
        return out
    missing = REQUIRED_ARGS.get(str(ev.get("cat")), frozenset()) - set(ev.get("args", {}))
    if missing:
        out.append(f"{where}: cat {ev.get('cat')} lacks args {', '.join(sorted(missing))}")
    return out


def check(doc: Any, name: str) -> None:
    """TraceFormatError naming `name` (the file) unless `doc` conforms."""
    found = problems(doc)
    if found:
        raise TraceFormatError(f"{name}: not an oddl trace file: " + "; ".join(found[:5]) +
                               ("; ..." if len(found) > 5 else "") +
                               " (record it again with --trace, see docs/how-to/trace-a-run.md)")
