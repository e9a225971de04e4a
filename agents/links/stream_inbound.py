"""The receiving side of a chunk stream: recycled payload buffers and one reader thread per
accepted stream.

Every chunk is read as soon as it arrives into a recycled buffer (no allocation, no page
faults per message) and queued, in order, for the collective executor; because every
stream is always drained, a sender never waits for the receiver to turn to it.
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


class Inbound:
    """One accepted stream and the thread that reads it: every chunk is read as soon as it
    arrives (so a sender never waits for this node to turn to it, which could deadlock a
    plan whose receiver hears several senders) and queued, in order, for the executor."""

    def __init__(self, sock: socket.socket, pool: BufferPool, cond: threading.Condition,
                 name: str, on_malformed: Callable[[str], None],
                 on_chunk: Callable[[int, float], None] | None = None):
        self.sock = sock
        self.queue: deque[tuple[ChunkHead, bytearray, float]] = deque()
        self.alive = True
        self.last_data = time.monotonic()
        """When the last chunk arrived (or the stream opened): a newer stream from the same
        sender supersedes this one once it has been idle a while."""
        self.lent: bytearray | None = None
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
                buf = self._pool.take(head.nbytes)
                if not recv_all(self.sock, memoryview(buf)[:head.nbytes]):
                    return
                if self._on_chunk is not None:
                    self._on_chunk(head.nbytes, time.monotonic() - started)
                with self._cond:
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
