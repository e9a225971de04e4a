"""The slot gate: release a send at a slot edge with microsecond accuracy.

Python's sleep wakes ~0.1 ms late with a ~1 ms tail (docs/sources.md §7), so the gate sleeps until
`spin_s` before the edge and busy-waits the rest on the wall clock. The error of every release
(actual minus scheduled, positive = late) is recorded for p50/p99 reporting. A send whose data
is not ready until after its slot edge is not a gate error but a slot *overrun* (the schedule
left too little margin); overruns are counted separately with how late they were.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from oddl.agents.clock import wall as wallclock


class Cancel(Protocol):
    """Anything that says whether to give up (a threading.Event, for one)."""

    def is_set(self) -> bool:
        """True once the wait should end."""


class SlotGate:
    """Waits for slot edges given on the local clock (seconds since the epoch)."""

    def __init__(self, spin_s: float = 300e-6, clock: Callable[[], float] = wallclock.now,
                 history: int = 10000,
                 on_release: Callable[[float], None] | None = None,
                 on_overrun: Callable[[float], None] | None = None):
        self.spin_s = spin_s
        self.clock = clock
        self.on_release = on_release
        self.on_overrun = on_overrun
        self._errors: deque[float] = deque(maxlen=history)
        self._overruns: deque[float] = deque(maxlen=history)
        self._lock = threading.Lock()

    def wait_until(self, t_local: float, cancel: Cancel | None = None) -> float:
        """Block until `t_local`; return and record the release error (s, positive = late).

        When `t_local` has already passed on entry the send is an overrun: it is released at
        once and recorded as such, not as a gate error.
        """
        late = self.clock() - t_local
        if late > 0:
            with self._lock:
                self._overruns.append(late)
            if self.on_overrun is not None:
                self.on_overrun(late)
            return late
        while True:
            remaining = t_local - self.clock()
            if remaining <= self.spin_s:
                break
            if cancel is not None and cancel.is_set():
                break
            time.sleep(min(remaining - self.spin_s, 0.05))
        while self.clock() < t_local:
            pass
        err = self.clock() - t_local
        with self._lock:
            self._errors.append(err)
        if self.on_release is not None:
            self.on_release(err)
        return err

    def percentiles(self) -> tuple[float, float, float]:
        """(p50, p99, max) of |release error| so far, in seconds (zeros when empty)."""
        with self._lock:
            errs = np.abs(np.fromiter(self._errors, dtype=float))
        if errs.size == 0:
            return (0.0, 0.0, 0.0)
        return (float(np.percentile(errs, 50)), float(np.percentile(errs, 99)), float(errs.max()))

    def errors(self) -> list[float]:
        """A copy of the recorded release errors."""
        with self._lock:
            return list(self._errors)

    def overruns(self) -> list[float]:
        """How late each overrun send was (s)."""
        with self._lock:
            return list(self._overruns)
