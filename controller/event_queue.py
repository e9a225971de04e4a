"""A node's schedule events: pushed from any thread, read by its one stream on an event loop.

The controller's core pushes `ScheduleEvent`s from whatever thread handles a request (the
executor's, the slot executor's, the heartbeat monitor's); the node's `WatchSchedule` stream
is a coroutine on the server's event loop that waits for them without a thread of its own
(ADR 0032). A waiting stream parks an `asyncio.Future` here; a push takes it and returns it
as a `Wake`, and whoever pushed wakes every stream it fed with one hop into each loop
(`wake_all`), so a push to a thousand nodes is one `call_soon_threadsafe`, not a thousand.

An event pushed with a key replaces the queued, unsent event of the same key in its place
(a job's assignment: only the newest list of peers matters), so a node that is not reading
holds one of each, not one per registration of its peers.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from oddl.protos import oddl_pb2 as pb


@dataclass(frozen=True)
class Wake:
    """A parked stream to wake: its loop and the future it awaits."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


class EventQueue:
    """First in, first out; `put` from any thread, `get` from one coroutine at a time."""

    def __init__(self) -> None:
        self._items: deque[list[pb.ScheduleEvent]] = deque()
        """Each event in a box of its own, so a keyed one can be replaced in its place."""
        self._keyed: dict[str, list[pb.ScheduleEvent]] = {}
        self._lock = threading.Lock()
        self._waiter: Wake | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, event: pb.ScheduleEvent, key: str = "") -> Wake | None:
        """Queue `event` (with `key`: in place of the queued event of that key, if any); the
        stream parked on the queue (to pass to `wake_all`), if any."""
        with self._lock:
            box = self._keyed.get(key) if key else None
            if box is not None:
                box[0] = event
            else:
                box = [event]
                self._items.append(box)
                if key:
                    self._keyed[key] = box
            waiter, self._waiter = self._waiter, None
        return waiter

    def get_nowait(self) -> pb.ScheduleEvent | None:
        """The next event, or None when there is none."""
        with self._lock:
            if not self._items:
                return None
            box = self._items.popleft()
            for key in [k for k, b in self._keyed.items() if b is box]:
                del self._keyed[key]
            return box[0]

    def kick(self) -> Wake | None:
        """Take the parked stream without an event (it rechecks whether to go on)."""
        with self._lock:
            waiter, self._waiter = self._waiter, None
        return waiter

    async def wait(self) -> None:
        """Return once an event is queued or the stream is kicked (call in the loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._items:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiter = Wake(loop, future)
        try:
            await future
        finally:
            with self._lock:
                if self._waiter is not None and self._waiter.future is future:
                    self._waiter = None


def wake_all(wakes: Iterable[Wake | None]) -> None:
    """Wake the parked streams: one hop into each event loop for all of its streams."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for w in wakes:
        if w is not None:
            by_loop.setdefault(w.loop, []).append(w.future)
    for loop, futures in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, futures)
        except RuntimeError:  # the loop closed: its streams are gone
            pass


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for f in futures:
        if not f.done():
            f.set_result(None)
