"""`oddl trace merge`: many trace files on one time axis, in one Chrome trace.

Every file counts its `ts` (µs) from its own `baseTimeNanoseconds` (the PyTorch profiler's
convention since torch 2.4, which oddl's recorder follows on the controller's clock), so
merging is a shift: the merged base is the smallest, and each event of a file moves by
(its base − merged base) / 1000 µs. A profiler trace without a base (torch before 2.4) has
absolute epoch-µs `ts` and shifts by −(merged base) / 1000 µs the same way.

Process ids are renumbered so files never collide (two hosts' agents may share an OS pid, and
the profiler uses small device numbers): each file's pids get fresh numbers in file order, the
`process_name` metadata keeps every name, and a `process_sort_index` keeps the files' order in
the viewer. Async and flow ids are renumbered per file too, so the profiler's correlation ids of
two ranks never pair up. The args of oddl's events that are times on the file's axis
(`TIME_ARGS`: planned starts and ends, the gate's opening) move with their `ts`. Pure: documents in, a document out.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Hashable, Sequence
from typing import Any

from oddl.trace.files import FORMAT, TraceFile, check_same_testbed, load_trace, trace_paths

KINETO_KEEP_OUT = {"traceEvents", "baseTimeNanoseconds", "displayTimeUnit", "oddl"}
"""Top-level keys of a profiler trace not copied into the merged file (the rest — schemaVersion,
distributedInfo, deviceProperties, ... — are, from the first profiler trace, for its readers)."""

TIME_ARGS = ("planned_start_us", "planned_end_us", "gate_open_us")
"""Args of oddl events that are points on the file's relative axis (docs/reference/trace-format.md)."""


class _Ids:
    """Fresh integer pids and async ids across all files."""

    def __init__(self) -> None:
        self.next_pid = 1
        self.next_id = 1
        self.pids: dict[Hashable, int] = {}
        self.ids: dict[Hashable, int] = {}

    def start_file(self) -> None:
        self.pids, self.ids = {}, {}

    def pid(self, old: Any) -> int:
        key = _hashable(old)
        if key not in self.pids:
            self.pids[key] = self.next_pid
            self.next_pid += 1
        return self.pids[key]

    def async_id(self, old: Any) -> int:
        key = _hashable(old)
        if key not in self.ids:
            self.ids[key] = self.next_id
            self.next_id += 1
        return self.ids[key]


def _hashable(value: Any) -> Hashable:
    return value if isinstance(value, Hashable) else json.dumps(value, sort_keys=True)


def merge(traces: Sequence[TraceFile]) -> dict[str, Any]:
    """One Chrome trace of every event of `traces` (see the module docstring)."""
    if not traces:
        raise ValueError("merge needs at least one trace")
    testbed_sha = check_same_testbed(traces)
    base = min(t.base_ns for t in traces)
    ids = _Ids()
    meta: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    sources = []
    for order, trace in enumerate(traces):
        ids.start_file()
        shift_us = (trace.base_ns - base) / 1000.0
        named: set[int] = set()
        for ev in trace.events:
            out = _moved(ev, shift_us, ids, trace.is_oddl)
            if out["ph"] == "M":
                if out.get("name") == "process_name":
                    named.add(out["pid"])
                meta.append(out)
            else:
                events.append(out)
        meta.extend(_process_meta(trace, ids, named, order))
        sources.append(_source(trace, ids, shift_us))
    events.sort(key=lambda e: e["ts"])
    doc: dict[str, Any] = {}
    kineto = next((t for t in traces if not t.is_oddl), None)
    if kineto is not None:
        doc.update({k: v for k, v in kineto.doc.items() if k not in KINETO_KEEP_OUT})
    doc.update({"traceEvents": meta + events, "displayTimeUnit": "ns",
                "baseTimeNanoseconds": base, "oddl": _header(traces, testbed_sha, sources)})
    return doc


def _moved(ev: dict[str, Any], shift_us: float, ids: _Ids, oddl: bool) -> dict[str, Any]:
    out = dict(ev)
    args = out.get("args")
    if oddl and isinstance(args, dict) and any(k in args for k in TIME_ARGS):
        out["args"] = {k: (v + shift_us if k in TIME_ARGS and isinstance(v, int | float) else v)
                       for k, v in args.items()}
    if "pid" in out:
        out["pid"] = ids.pid(out["pid"])
    if "ts" in out and out["ph"] != "M":
        out["ts"] = out["ts"] + shift_us
    if "id" in out:
        out["id"] = ids.async_id(out["id"])
    return out


def _process_meta(trace: TraceFile, ids: _Ids, named: set[int],
                  order: int) -> list[dict[str, Any]]:
    """A name for every pid the file left unnamed, and each pid's place in the file order."""
    out: list[dict[str, Any]] = []
    for old, new in ids.pids.items():
        if new not in named:
            out.append({"ph": "M", "name": "process_name", "pid": new, "tid": 0,
                        "args": {"name": f"{trace.label} pid {old}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": new, "tid": 0,
                    "args": {"sort_index": order * 1000 + new}})
    return out


def _source(trace: TraceFile, ids: _Ids, shift_us: float) -> dict[str, Any]:
    head = trace.header
    src: dict[str, Any] = {"file": os.path.basename(trace.path), "process": trace.label,
                           "kind": "oddl" if trace.is_oddl else "profiler",
                           "base_ns": trace.base_ns, "shift_us": shift_us,
                           "pids": {str(k): v for k, v in ids.pids.items()}}
    for key in ("host", "clock", "recorded", "dropped", "buffer_events"):
        if key in head:
            src[key] = head[key]
    if not trace.is_oddl and isinstance(trace.doc.get("distributedInfo"), dict):
        src["rank"] = trace.doc["distributedInfo"].get("rank")
    return src


def _header(traces: Sequence[TraceFile], testbed_sha: str,
            sources: list[dict[str, Any]]) -> dict[str, Any]:
    first = next((t.header for t in traces if t.is_oddl), {})
    return {"format": FORMAT, "process": "timeline", "testbed": first.get("testbed", ""),
            "testbed_sha256": testbed_sha,
            "recorded": sum(int(s.get("recorded", 0)) for s in sources),
            "dropped": sum(int(s.get("dropped", 0)) for s in sources),
            "sources": sources}


def merge_paths(inputs: Sequence[str]) -> dict[str, Any]:
    """Load (a directory: its *.trace.json files) and merge."""
    return merge([load_trace(p) for p in trace_paths(inputs)])


def timeline_of(path: str) -> dict[str, Any]:
    """What `summary` and `plot` read: a directory merged in memory, or one file as it is."""
    if os.path.isdir(path):
        return merge_paths([path])
    trace = load_trace(path)
    check_same_testbed([trace])
    return trace.doc


def write_json(doc: dict[str, Any], out: str) -> None:
    """Write atomically (a temporary file renamed), so a reader never sees half a file."""
    folder = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".timeline-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, separators=(",", ":"))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as any file the user writes, not mkstemp's 0600
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
