"""Reading trace files: oddl's own (`oddl-trace/1`, docs/reference/trace-format.md) and PyTorch profiler
(Kineto) Chrome traces, checked before anything is computed from them.

A file that is not JSON, that stops mid-way (the recording process died before it finished
writing), that has no `traceEvents`, or whose events lack what the format requires is refused
with a `TraceFileError` naming the file and the fix; so is a set of oddl files recorded against
different testbed files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oddl.common.errors import ConfigError

FORMAT = "oddl-trace/1"
SUFFIX = ".trace.json"


class TraceFileError(ConfigError):
    """A trace file cannot be read as the format says, or does not belong with the others."""


@dataclass
class TraceFile:
    """One loaded trace file: its path, its document, and what kind of trace it is."""

    path: str
    doc: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_oddl(self) -> bool:
        """Written by oddl (it carries the `oddl` header), not by the PyTorch profiler."""
        return isinstance(self.doc.get("oddl"), dict)

    @property
    def header(self) -> dict[str, Any]:
        """The `oddl` header ({} for a profiler trace)."""
        head = self.doc.get("oddl")
        return head if isinstance(head, dict) else {}

    @property
    def base_ns(self) -> int:
        """`baseTimeNanoseconds`: the epoch ns every relative `ts` counts from (0 when a
        profiler trace from before torch 2.4 has absolute `ts`)."""
        return int(self.doc.get("baseTimeNanoseconds", 0))

    @property
    def label(self) -> str:
        """The process that recorded it, or the file's name."""
        return str(self.header.get("process") or Path(self.path).name)


def trace_paths(inputs: Sequence[str]) -> list[str]:
    """Expand the command line's inputs: a directory stands for its `*.trace.json` files (in
    name order), a file for itself. A directory with none, or a missing path, is refused."""
    paths: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(str(p) for p in Path(item).glob(f"*{SUFFIX}"))
            if not found:
                raise TraceFileError(
                    f"{item}: no *{SUFFIX} files in this directory; record with "
                    "`oddl demo --trace DIR` or `oddl testbed up --trace DIR` first, or name "
                    "the trace files themselves")
            paths.extend(found)
        elif os.path.isfile(item):
            paths.append(item)
        else:
            raise TraceFileError(f"{item}: no such file or directory; name a trace directory or "
                                 f"*{SUFFIX} / profiler trace files")
    return paths


def load_trace(path: str) -> TraceFile:
    """Read and check one trace file (see the module docstring for what is refused)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceFileError(f"{path}: cannot read it ({exc.strerror or exc}); check the path "
                             "and its permissions") from None
    except UnicodeDecodeError:
        raise TraceFileError(f"{path}: not a text file; a trace is Chrome trace-event JSON "
                             "(a gzipped profiler trace: gunzip it first)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFileError(_why_not_json(path, text, exc)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFileError(f"{path}: not a Chrome trace in object form (no \"traceEvents\" "
                             "list); give oddl's *.trace.json files or a PyTorch profiler "
                             "export_chrome_trace() file")
    trace = TraceFile(path, doc, doc["traceEvents"])
    _check_header(trace)
    _check_events(trace)
    return trace


def _why_not_json(path: str, text: str, exc: json.JSONDecodeError) -> str:
    if not text.strip():
        return (f"{path}: empty; the process that records it writes it when recording stops: "
                "stop the recording (or the testbed) cleanly and read it again")
    body = text.rstrip()
    if exc.pos >= len(body) or not body.endswith("}"):  # ran out, or cut before the last brace
        return (f"{path}: truncated (the JSON stops at byte {len(text)} in the middle of "
                f"{exc.msg.lower()}); the recording process was stopped before it finished "
                "writing. Record again, or leave this file out")
    return (f"{path}: not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg}); "
            "give the file as the recorder or the profiler wrote it")


def _check_header(trace: TraceFile) -> None:
    head, doc = trace.header, trace.doc
    base = doc.get("baseTimeNanoseconds", 0)
    if not isinstance(base, int) or isinstance(base, bool) or base < 0:
        raise TraceFileError(f"{trace.path}: baseTimeNanoseconds is {base!r}; it must be the "
                             "epoch time in integer nanoseconds the events' ts count from")
    if not trace.is_oddl:
        return
    if head.get("format") != FORMAT:
        raise TraceFileError(f"{trace.path}: oddl.format is {head.get('format')!r}, this oddl "
                             f"reads {FORMAT!r}; read it with the oddl that recorded it")
    if not isinstance(head.get("testbed_sha256"), str) or not head.get("process"):
        raise TraceFileError(f"{trace.path}: the oddl header has no testbed_sha256 or process; "
                             "the file was not written by oddl's recorder (or was edited)")


def _check_events(trace: TraceFile) -> None:
    for i, ev in enumerate(trace.events):
        if not isinstance(ev, dict) or "ph" not in ev:
            raise TraceFileError(f"{trace.path}: traceEvents[{i}] is not an event (no \"ph\"); "
                                 "the file was edited or is not a Chrome trace")
        if ev["ph"] != "M" and not isinstance(ev.get("ts"), int | float):
            raise TraceFileError(f"{trace.path}: traceEvents[{i}] ({ev.get('name')!r}) has no "
                                 "numeric ts; every event but metadata needs one (µs)")
        if ev["ph"] == "X" and not isinstance(ev.get("dur", 0), int | float):
            raise TraceFileError(f"{trace.path}: traceEvents[{i}] ({ev.get('name')!r}) has a "
                                 "non-numeric dur")


def check_same_testbed(traces: Iterable[TraceFile]) -> str:
    """The testbed hash every oddl file shares (\"\" when there are none); files recorded
    against different testbed files are refused, naming one of each. A file whose hash is \"\"
    (a training process that was not told the testbed file) goes with any."""
    first: TraceFile | None = None
    for t in traces:
        if not t.is_oddl or not t.header["testbed_sha256"]:
            continue
        if first is None:
            first = t
        elif t.header["testbed_sha256"] != first.header["testbed_sha256"]:
            raise TraceFileError(
                f"{t.path}: recorded on another testbed (testbed file sha256 "
                f"{t.header['testbed_sha256'][:12]}…, {t.header.get('testbed', '?')!r}) than "
                f"{first.path} ({first.header['testbed_sha256'][:12]}…, "
                f"{first.header.get('testbed', '?')!r}); merge only the files of one run")
    return "" if first is None else str(first.header["testbed_sha256"])

