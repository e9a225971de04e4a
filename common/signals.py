"""Serving until SIGINT or SIGTERM, without a lock in the signal handler.

Python runs a signal handler on the main thread between two bytecodes, possibly while that
thread holds a lock. A handler that calls ``threading.Event.set()`` while the main thread sits
in ``Event.wait()`` of the same event can therefore block for ever on the event's own lock:
the process then ignores every later SIGTERM (seen: emulator hosts that outlived their parent's
death signal, `tests/top/test_procs.py`). The handler here only stores the signal number; the
waiting loop polls it between short sleeps.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

__all__ = ["StopSignals"]

POLL_S = 0.05
"""How often a wait looks for a signal (the longest a stop waits after the signal came)."""


class StopSignals:
    """While the ``with`` block runs (on the main thread), SIGINT and SIGTERM are recorded
    instead of acting; `wait` returns True once one came. Handlers are restored on exit."""

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)):
        self.signals = signals
        self.received: int | None = None
        """The first signal that came, or None."""
        self._previous: dict[int, Any] = {}

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:  # a plain store: no lock, safe at any bytecode
            self.received = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a signal came (True) or `timeout` seconds passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.received is None:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S if deadline is None else
                       max(0.0, min(POLL_S, deadline - time.monotonic())))
        return True
