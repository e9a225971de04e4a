"""Recorded events to Chrome trace-event JSON (docs/reference/trace-format.md): the pure conversion and
the one file write.

`ts` is µs relative to `baseTimeNanoseconds` (the recording's start on the controller's clock,
the PyTorch profiler's convention); pids and tids are numbered in order of first use, each
named by a ``process_name``/``thread_name`` metadata event. Events are written in time order,
so every track's timestamps are monotone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from oddl.common.tracing.events import FORMAT, Event, Track


def to_chrome(events: Iterable[Event], info: Mapping[str, Any]) -> dict[str, Any]:
    """The trace file's JSON object for `events` and the recording's `info` (``oddl``)."""
    ordered = sorted(events, key=lambda e: e[4])
    base = int(info.get("started_ns") or (ordered[0][4] if ordered else 0))
    pids: dict[str, int] = {}
    tids: dict[Track, int] = {}
    out: list[dict[str, Any]] = []
    for ph, track, name, cat, t_ns, dur_ns, ident, args in ordered:
        pid = pids.setdefault(track.process, len(pids) + 1)
        tid = tids.setdefault(track, sum(1 for t in tids if t.process == track.process) + 1)
        ev: dict[str, Any] = {"ph": ph, "name": name, "cat": cat, "pid": pid, "tid": tid,
                              "ts": max(0, t_ns - base) / 1e3}
        if ph == "X":
            ev["dur"] = dur_ns / 1e3
        elif ph == "i":
            ev["s"] = "p"
        elif ph in ("b", "e"):
            ev["id"] = ident
        if args:
            ev["args"] = dict(args)
        out.append(ev)
    meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
             "args": {"name": process}} for process, pid in pids.items()]
    meta += [{"ph": "M", "name": "thread_name", "pid": pids[t.process], "tid": tid, "ts": 0,
              "args": {"name": t.thread}} for t, tid in tids.items()]
    return {"traceEvents": meta + out, "displayTimeUnit": "ns", "baseTimeNanoseconds": base,
            "oddl": {"format": FORMAT, **info}}


def write_trace(path: Path, events: Iterable[Event], info: Mapping[str, Any]) -> Path:
    """Write the trace file atomically (a reader never sees half a file); its path."""
    doc = to_chrome(events, info)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    os.replace(tmp, path)
    return path
