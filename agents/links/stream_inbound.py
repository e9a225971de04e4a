"""The receiving side of a chunk stream: recycled payload buffers, posted landings and one
reader thread per accepted stream.

Every chunk is read as soon as it arrives into a recycled buffer (no allocation, no page
faults per message) and queued, in order, for the collective executor; because every
stream is always drained, a sender never waits for the receiver to turn to it. A chunk the
executor posted a landing for (decision record 0039) is read straight into its place in the
destination instead, and queued as that place.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

from oddl.agents.links.stream_wire import CHUNK_BYTES, HEAD_BYTES, MAX_CHUNK, ChunkHead, recv_all


class BufferPool:
    """Recycled payload buffers, so a chunk costs no allocation (and no page faults)."""

    def __init__(self, keep: int = 64):
        self._free: list[bytearray] = []
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bytearray:
        """A buffer of at least `nbytes`."""
        with self._lock:  # the most recently used first: still in the caches
            for i in range(len(self._free) - 1, -1, -1):
                if len(self._free[i]) >= nbytes:
                    return self._free.pop(i)
        return bytearray(max(nbytes, CHUNK_BYTES))

    def give(self, buf: bytearray) -> None:
        """Take a buffer back (kept while the pool is not full)."""
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buf)


Landing = tuple[int, int, int]
"""A posted chunk: (collective seq, step, sender's element offset)."""


class Landings:
    """The chunks each (job, source) stream may read straight into the destination, posted
    by the executor before they arrive and taken by the stream's reader (call under the
    link's condition's lock)."""

    def __init__(self) -> None:
        self._posted: dict[tuple[str, str], dict[Landing, memoryview]] = {}

    def post(self, job: str, src: str, chunk: Landing, into: memoryview) -> None:
        """Let the chunk from `src` land in `into` (its exact size) when it arrives."""
        self._posted.setdefault((job, src), {})[chunk] = into

    def take(self, key: tuple[str, str], head: ChunkHead) -> memoryview | None:
        """The place posted for this chunk (and no longer posted), if any and if it fits."""
        posted = self._posted.get(key)
        if not posted:
            return None
        into = posted.pop((head.seq, head.step, head.offset), None)
        return into if into is not None and len(into) == head.nbytes else None

    def withdraw(self, job: str, seq: int) -> None:
        """Forget every chunk of collective `seq` of `job` still posted."""
        for key, posted in self._posted.items():
            if key[0] == job:
                for chunk in [c for c in posted if c[0] == seq]:
                    del posted[chunk]

    def forget(self, job: str | None = None) -> None:
        """Forget every posting (of `job`)."""
        for key in [k for k in self._posted if job is None or k[0] == job]:
            del self._posted[key]


class Inbound:
    """One accepted stream and the thread that reads it: every chunk is read as soon as it
    arrives (so a sender never waits for this node to turn to it, which could deadlock a
    plan whose receiver hears several senders) and queued, in order, for the executor."""

    def __init__(self, sock: socket.socket, pool: BufferPool, cond: threading.Condition,
                 name: str, on_malformed: Callable[[str], None],
                 on_chunk: Callable[[int, float], None] | None = None,
                 landing: Callable[[ChunkHead], memoryview | None] | None = None):
        self.sock = sock
        self.queue: deque[tuple[ChunkHead, bytearray | memoryview, float]] = deque()
        self.alive = True
        self.last_data = time.monotonic()
        """When the last chunk arrived (or the stream opened): a newer stream from the same
        sender supersedes this one once it has been idle a while."""
        self.lent: bytearray | None = None
        self.landing_seq: int | None = None
        """The collective whose chunk the reader is writing into its destination (under
        the condition's lock): a run that ends early closes this stream and waits."""
        self._landing = landing
        """Takes the place posted for a chunk (`Landings.take`), under the lock."""
        self._pool = pool
        self._cond = cond
        self._on_malformed = on_malformed
        self._on_chunk = on_chunk
        """Told each chunk's size and the time from its header to its last byte."""
        self._thread = threading.Thread(target=self._read, name=name, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        head_buf = bytearray(HEAD_BYTES)
        try:
            while True:
                if not recv_all(self.sock, memoryview(head_buf)):
                    return
                head = ChunkHead.unpack(head_buf)
                if head.nbytes > MAX_CHUNK:
                    raise ValueError(f"a chunk of {head.nbytes} B (at most {MAX_CHUNK})")
                started = time.monotonic()
                buf = self._place(head)
                if not recv_all(self.sock, memoryview(buf)[:head.nbytes]):
                    return
                if self._on_chunk is not None:
                    self._on_chunk(head.nbytes, time.monotonic() - started)
                with self._cond:
                    self.landing_seq = None
                    self.last_data = time.monotonic()
                    self.queue.append((head, buf, self.last_data))
                    self._cond.notify_all()
        except (ValueError, struct.error) as exc:
            self._on_malformed(str(exc))
        except OSError:
            pass
        finally:
            with self._cond:
                self.alive = False
                self._cond.notify_all()
            self.close()

    def _place(self, head: ChunkHead) -> bytearray | memoryview:
        """Where the chunk's payload goes: its posted place, or a recycled buffer."""
        if self._landing is not None:
            with self._cond:
                into = self._landing(head)
                if into is not None:
                    self.landing_seq = head.seq
                    return into
        return self._pool.take(head.nbytes)

    def join(self, timeout_s: float) -> bool:
        """Wait for the reader to end (after `close`); False if it did not in time."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def recycle(self) -> None:
        """Return the buffer lent out by the last chunk taken."""
        if self.lent is not None:
            self._pool.give(self.lent)
            self.lent = None

    def close(self) -> None:
        """Close the socket, which ends the reader."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader blocked in recv
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


SUPERSEDE_S = 1.0
"""How long an older stream from a sender that opened a newer one may stay idle before the
receiver turns to the newer one (what the old one delivered in full comes first)."""


def superseded(conn: Inbound) -> bool:
    """Whether an older stream, with a newer one from the same sender behind it, is done: it
    closed, or it has nothing queued and has been idle (its peer vanished without a reset: a
    rebooted host, a cut link)."""
    if conn.queue:
        return False
    return not conn.alive or time.monotonic() - conn.last_data > SUPERSEDE_S
