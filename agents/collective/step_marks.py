"""Each step's send, receive and reduce time on the call's marks (`oddl.common.call_marks`),
while ``ODDL_CALL_MARKS`` is set: `MarkedLink` wraps the run's link and sums, per step, the
time spent in `send_chunk` (``s<k>.send``, on the sender's thread) and waiting in `recv_chunk`
(``s<k>.recv``), and notes the step's last arrival (``s<k>.in``); `reduced` sums the time from
a chunk's arrival to the end of its reduction (``s<k>.reduce``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from oddl.agents.links.stream_wire import ChunkHead
from oddl.agents.slot_gate import Cancel
from oddl.common.call_marks import MARKS

_last = threading.local()


class MarkedLink:
    """A chunk link that sums each step's chunk times on the call's marks (same calls, same
    errors)."""

    def __init__(self, link: Any):
        self._link = link

    def send_chunk(self, job: str, dst: str, head: ChunkHead, payload: memoryview,
                   deadline_s: float, cancel: Cancel | None = None,
                   optical: bool = False) -> None:
        """Send one chunk (`oddl.agents.collective.context.ChunkLink`), timed."""
        start = time.time_ns()
        self._link.send_chunk(job, dst, head, payload, deadline_s, cancel, optical)
        MARKS.add(f"s{head.step}.send", time.time_ns() - start)
        MARKS.mark_last(f"s{head.step}.out")

    def recv_chunk(self, job: str, src: str, seq: int, step: int, deadline: float,
                   cancel: Cancel | None = None, into: memoryview | None = None
                   ) -> tuple[ChunkHead, memoryview]:
        """Receive one chunk (`oddl.agents.collective.context.ChunkLink`), timed."""
        start = time.time_ns()
        got = self._link.recv_chunk(job, src, seq, step, deadline, cancel, into)
        now = time.time_ns()
        MARKS.add(f"s{step}.recv", now - start)
        MARKS.mark_last(f"s{step}.in")
        _last.at, _last.step = now, step
        return got


def reduced() -> None:
    """The chunk received last on this thread is applied: its reduce time."""
    at = getattr(_last, "at", 0)
    if at:
        MARKS.add(f"s{_last.step}.reduce", time.time_ns() - at)
        _last.at = 0
