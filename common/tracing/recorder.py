"""The per-process trace recorder: a bounded buffer of raw events, lock-free to append.

Events are stored as tuples with times in ns on the controller's clock (the process's own
clock plus its measured offset, taken when the event is recorded) and turned into Chrome
trace-event JSON only when recording stops (`oddl.common.tracing.chrome`). The buffer holds at
most `capacity` events, allocated once at `start`; an event that finds it full is counted
in `dropped`, never silently lost. Appending takes a slot number from an `itertools.count`
(atomic under the GIL), so hooks on several threads never wait for each other.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from oddl.common.errors import ConfigError
from oddl.common.tracing.chrome import write_trace
from oddl.common.tracing.events import Event, Track

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY = 250_000
"""Events one process keeps (about 0.5 KB each with their arguments: at most ~125 MB)."""
OFFSET_REFRESH_NS = 100_000_000
"""How often (at most) the clock offset is asked again while recording: 0.1 s, far below the
time it takes to drift by a microsecond (docs/explanation/clocks.md)."""


def _no_offset() -> int:
    return 0


class Recorder:
    """One process's trace recorder (see the module docstring)."""

    def __init__(self) -> None:
        self.on = False
        """True while recording: the one thing a hook checks."""
        self.process = ""
        self.directory: Path | None = None
        self.capacity = 0
        self.meta: dict[str, Any] = {}
        self._buf: list[Event | None] = []
        self._next = itertools.count()
        self._clock: Callable[[], int] = time.time_ns
        self._offset: Callable[[], int] = _no_offset
        self._error: Callable[[], int] = _no_offset
        self._offset_now = 0
        self._offset_at = -OFFSET_REFRESH_NS - 1
        self._started_ns = 0
        self._lock = threading.Lock()
        self.flushers: list[Callable[[], None]] = []
        """Called when recording stops, before the file is written: hooks that hold events
        open (the light still on) record their ends."""

    # ---- switching ----------------------------------------------------------------------
    def start(self, directory: str | os.PathLike[str], process: str, *,
              capacity: int = DEFAULT_CAPACITY, clock: Callable[[], int] = time.time_ns,
              offset_ns: Callable[[], int] = _no_offset,
              error_ns: Callable[[], int] = _no_offset,
              meta: Mapping[str, Any] | None = None) -> None:
        """Start recording into a fresh buffer; the file goes to `directory` at `stop`.

        `clock`: this process's clock (ns since the epoch); `offset_ns`: the controller's clock
        minus this one, asked at each event; `error_ns`: the offset's error bound.
        """
        if capacity <= 0:
            raise ConfigError(f"trace buffer of {capacity} events: give a positive number of "
                              f"events (the default is {DEFAULT_CAPACITY})")
        path = Path(directory)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"trace directory {path}: {exc.strerror}; pass --trace a folder "
                              "this process may create and write") from exc
        with self._lock:
            if self.on:
                self._stop_locked()
            self.process, self.directory, self.capacity = process, path, capacity
            self.meta = {"host": socket.gethostname(), **(meta or {})}
            self._buf = [None] * capacity
            self._next = itertools.count()
            self._clock, self._offset, self._error = clock, offset_ns, error_ns
            self._offset_at = -OFFSET_REFRESH_NS - 1  # ask at the first event
            self._started_ns = self.now_ns()
            self.on = True

    def stop(self) -> Path | None:
        """Stop recording and write ``DIR/<process>.trace.json``; its path (None when off)."""
        with self._lock:
            return self._stop_locked()

    def _stop_locked(self) -> Path | None:
        if not self.on:
            return None
        for flush in self.flushers:
            try:
                flush()
            except Exception:  # a hook's bug must not cost the file
                logger.exception("trace %s: a flush hook failed", self.process)
        self.on = False
        stopped = self.now_ns()
        issued = next(self._next)
        kept = min(issued, self.capacity)
        events = [e for e in self._buf[:kept] if e is not None]
        self._buf = []
        assert self.directory is not None
        info = {**self.meta, "process": self.process, "buffer_events": self.capacity,
                "recorded": kept, "dropped": max(0, issued - self.capacity),
                "started_ns": self._started_ns, "stopped_ns": stopped,
                "clock": {"offset_ns": self._offset(), "error_bound_ns": self._error()}}
        path = write_trace(self.directory / f"{self.process}.trace.json", events, info)
        if info["dropped"]:
            logger.warning("trace %s: the buffer of %d events was full: %d events dropped "
                           "(counted in the file's oddl.dropped)", path, self.capacity,
                           info["dropped"])
        return path

    # ---- time ---------------------------------------------------------------------------
    @property
    def base_ns(self) -> int:
        """The trace's time origin (`baseTimeNanoseconds`): the start, controller's clock."""
        return self._started_ns

    def local_ns(self) -> int:
        """This process's clock now (ns since the epoch)."""
        return self._clock()

    def now_ns(self) -> int:
        """Now on the controller's clock."""
        return self.to_controller(self._clock())

    def to_controller(self, local_ns: int) -> int:
        """A time read on this process's clock, on the controller's (the offset is asked
        again at most every `OFFSET_REFRESH_NS`: an agent's estimate takes a lock)."""
        if abs(local_ns - self._offset_at) > OFFSET_REFRESH_NS:
            self._offset_now, self._offset_at = self._offset(), local_ns
        return local_ns + self._offset_now

    # ---- recording (times already on the controller's clock) ----------------------------
    def add(self, event: Event) -> None:
        """Append one raw event (counted as dropped when the buffer is full)."""
        i = next(self._next)
        if i < self.capacity:
            self._buf[i] = event

    def complete(self, track: Track, name: str, cat: str, start_ns: int, end_ns: int,
                 args: Mapping[str, Any] | None = None) -> None:
        """A complete event (``X``) from `start_ns` to `end_ns`."""
        self.add(("X", track, name, cat, start_ns, max(0, end_ns - start_ns), None, args))

    def instant(self, track: Track, name: str, cat: str, t_ns: int,
                args: Mapping[str, Any] | None = None) -> None:
        """An instant (``i``, process scope)."""
        self.add(("i", track, name, cat, t_ns, 0, None, args))

    def begin(self, track: Track, name: str, cat: str, ident: str, t_ns: int,
              args: Mapping[str, Any] | None = None) -> None:
        """The start of an async event (``b``) matched by (`cat`, `ident`, `name`)."""
        self.add(("b", track, name, cat, t_ns, 0, ident, args))

    def end(self, track: Track, name: str, cat: str, ident: str, t_ns: int) -> None:
        """The end of an async event (``e``)."""
        self.add(("e", track, name, cat, t_ns, 0, ident, None))

    def counter(self, track: Track, name: str, t_ns: int, values: Mapping[str, float]) -> None:
        """A counter sample (``C``): one series per key."""
        self.add(("C", track, name, "power", t_ns, 0, None, values))
