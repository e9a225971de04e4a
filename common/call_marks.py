"""Where one call's time goes: timestamps along its path, off unless ``ODDL_CALL_MARKS``
names a folder (`benchmarks/bench_call_breakdown.py`, issue 36).

Each process keeps one record for the call in flight (a process serves one collective at a
time: a training process's worker thread, an agent's collectives thread): `mark(name)` notes
the wall clock (ns, `time.time_ns`, the same clock in every process of a host, so marks of the
training process and of its agent compare), `add(name, ns)` sums a duration (a step's send,
receive and reduce time over its chunks), `note(**keys)` adds what identifies the call. An
agent appends the record, one JSON line, to ``<folder>/<process>.jsonl`` once its reply is on
the way (`flush`); a training process hands its records to whoever asks (`take`).

Off, each call is one attribute test. On, a mark costs about a microsecond.
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from pathlib import Path
from typing import Any

ENV = "ODDL_CALL_MARKS"


class CallMarks:
    """One process's record of the call in flight (see the module docstring)."""

    def __init__(self, folder: str | None):
        self.on = bool(folder)
        self.folder = Path(folder) if folder else None
        self._record: dict[str, Any] = {}
        self._lock = threading.Lock()

    def begin(self) -> None:
        """Start a new record (the previous one, unflushed, is dropped)."""
        if self.on:
            with self._lock:
                self._record = {"minflt0": _minflt()}

    def mark(self, name: str) -> None:
        """Note the time `name` happened (the first time in this record wins)."""
        if self.on:
            now = time.time_ns()
            with self._lock:
                self._record.setdefault(name, now)

    def mark_last(self, name: str) -> None:
        """Note the time `name` happened (the last time in this record wins)."""
        if self.on:
            now = time.time_ns()
            with self._lock:
                self._record[name] = now

    def add(self, name: str, ns: int) -> None:
        """Add `ns` to the duration `name` of this record."""
        if self.on:
            with self._lock:
                self._record[name] = self._record.get(name, 0) + ns

    def note(self, **keys: Any) -> None:
        """What identifies the call (node, job, step, bytes)."""
        if self.on:
            with self._lock:
                self._record.update(keys)

    def take(self) -> dict[str, Any]:
        """The record so far (with this process's minor page faults since `begin`), and a
        fresh one."""
        with self._lock:
            record, self._record = self._record, {}
        if "minflt0" in record:
            record["minflt"] = _minflt() - record.pop("minflt0")
        return record

    def flush(self, process: str) -> None:
        """Append the record to ``<folder>/<process>.jsonl`` if it is a collective's (it has
        a `step`), and start a fresh one."""
        if not self.on or self.folder is None:
            return
        record = self.take()
        if "step" not in record:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"{process}.jsonl", "a") as out:  # after the reply went
            out.write(json.dumps(record) + "\n")


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


MARKS = CallMarks(os.environ.get(ENV))
"""This process's marks (on when ``ODDL_CALL_MARKS`` was set at import)."""
