"""The agent's map of its clients' buckets, by token (decision records 0015 and 0017).

Each client connection of the bucket socket holds one *own* bucket (the client's memfd: a new
one replaces the old) and up to `MAX_ADOPTED` *adopted* buckets: memory the training process
already had (a tensor's storage moved into shared memory) and handed over so that
collectives run in it in place. When a client adopts one more than the bound, its oldest
adopted bucket is unmapped; a request naming it then gets ``bucket-unknown`` and the client
hands it over again. The bucket socket's thread adds and drops buckets, the collectives
thread looks them up (`view`).
"""

from __future__ import annotations

import logging
import mmap
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from oddl.common.errors import BucketUnavailable, OperationRefused

logger = logging.getLogger(__name__)

MAX_ADOPTED = 64
"""Adopted buckets one client connection may hold; adopting one more unmaps its oldest."""


@dataclass
class _ClientMaps:
    pid: int
    own: str | None = None
    adopted: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """Tokens of the adopted buckets, oldest first."""


class BucketRegistry:
    """The clients' buckets by token (see the module docstring)."""

    def __init__(self, max_adopted: int = MAX_ADOPTED) -> None:
        self.max_adopted = max_adopted
        self._lock = threading.Lock()
        self._maps: dict[str, mmap.mmap] = {}
        self._clients: dict[int, _ClientMaps] = {}
        self._pid_of: dict[str, int] = {}

    def add(self, client: int, pid: int, buf: mmap.mmap) -> str:
        """Keep `buf` as client `client`'s own bucket (replacing its previous one); its
        token."""
        with self._lock:
            maps = self._clients.setdefault(client, _ClientMaps(pid))
            old, maps.own = maps.own, self._keep(buf, pid)
            token = maps.own
            old_buf = self._forget(old)
        _unmap(old_buf)
        return token

    def adopt(self, client: int, pid: int, buf: mmap.mmap) -> str:
        """Keep `buf` as one more adopted bucket of client `client` (unmapping its oldest
        adopted one beyond the bound); its token."""
        with self._lock:
            maps = self._clients.setdefault(client, _ClientMaps(pid))
            token = self._keep(buf, pid)
            maps.adopted[token] = None
            evicted = []
            while len(maps.adopted) > self.max_adopted:
                oldest, _ = maps.adopted.popitem(last=False)
                evicted.append(self._forget(oldest))
        for old in evicted:
            _unmap(old)
        if evicted:
            logger.info("client pid %d holds more than %d adopted buckets: unmapped its %d "
                        "oldest", pid, self.max_adopted, len(evicted))
        return token

    def release(self, client: int, token: str) -> bool:
        """Unmap client `client`'s adopted bucket `token` (its memory was freed); False when
        the client holds no such adopted bucket."""
        with self._lock:
            maps = self._clients.get(client)
            if maps is None or token not in maps.adopted:
                return False
            del maps.adopted[token]
            buf = self._forget(token)
        _unmap(buf)
        return True

    def drop(self, client: int) -> None:
        """Client `client` went away: unmap all its buckets."""
        with self._lock:
            maps = self._clients.pop(client, None)
            tokens = [] if maps is None else [maps.own, *maps.adopted]
            bufs = [self._forget(t) for t in tokens]
        for buf in bufs:
            _unmap(buf)

    def _keep(self, buf: mmap.mmap, pid: int) -> str:
        token = secrets.token_hex(16)
        self._maps[token] = buf
        self._pid_of[token] = pid
        return token

    def _forget(self, token: str | None) -> mmap.mmap | None:
        if token is None:
            return None
        self._pid_of.pop(token, None)
        return self._maps.pop(token, None)

    def view(self, token: str, nbytes: int, offset: int = 0) -> memoryview:
        """A writable view of `nbytes` bytes at `offset` in the bucket `token`;
        BucketUnavailable (``bucket-unknown``) for a token this agent does not hold (it
        restarted, the client's bucket connection closed, or the bucket was unmapped to keep
        the bound), OperationRefused for a range beyond the bucket's end."""
        with self._lock:
            buf = self._maps.get(token)
            if buf is None:
                raise BucketUnavailable(
                    "this agent holds no bucket with that token (it restarted, the client's "
                    "bucket connection closed, or it held too many adopted buckets); hand "
                    "the descriptor over again", kind="bucket-unknown")
            if offset < 0 or len(buf) < offset + nbytes:
                raise OperationRefused(f"the bucket holds {len(buf)} B, the request needs "
                                       f"{nbytes} B at offset {offset}")
            return memoryview(buf)[offset:offset + nbytes]  # under the lock: never closed

    def holders(self) -> dict[int, int]:
        """Bytes mapped per client process id (for status and tests)."""
        with self._lock:
            out: dict[int, int] = {}
            for token, buf in self._maps.items():
                pid = self._pid_of.get(token, 0)
                out[pid] = out.get(pid, 0) + len(buf)
            return out

    def adopted_count(self, pid: int) -> int:
        """How many adopted buckets the clients of process `pid` hold (for tests)."""
        with self._lock:
            return sum(len(m.adopted) for m in self._clients.values() if m.pid == pid)

    def close(self) -> None:
        """Unmap every bucket."""
        with self._lock:
            bufs = list(self._maps.values())
            self._maps.clear()
            self._clients.clear()
            self._pid_of.clear()
        for buf in bufs:
            _unmap(buf)


def _unmap(buf: mmap.mmap | None) -> None:
    if buf is None:
        return
    try:
        buf.close()
    except BufferError:  # a collective still runs on it: it unmaps when that lets go
        logger.debug("a bucket is still in use; it is unmapped when released")
