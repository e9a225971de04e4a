"""Shared-memory buckets between a training process and its local agent.

The training process (`AgentClient`) owns a file in the shared-memory folder, maps it and
writes its bucket there; the request on the local API names the file, and the agent maps the
same pages and runs the collective on them in place. The bucket never crosses a socket; the
API messages carry only the header. Files are named `oddl-bucket-*` and the agent opens
nothing else (`open_bucket` checks the folder, the name and the size).
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import tempfile
import uuid
from collections import OrderedDict
from pathlib import Path

import numpy as np

from common.errors import OperationRefused

logger = logging.getLogger(__name__)

PREFIX = "oddl-bucket-"
_NAME = re.compile(rf"^{PREFIX}[0-9a-f]{{32}}$")


def shm_dir() -> Path:
    """Where buckets live: /dev/shm where it exists (memory, not disk), else the temp dir."""
    dev = Path("/dev/shm")
    if dev.is_dir() and os.access(dev, os.W_OK):
        return dev
    return Path(tempfile.gettempdir())


class SharedBucket:
    """A mapped file the client writes buckets into; grows by replacement, never shrinks."""

    def __init__(self, nbytes: int, group: int | None = None):
        """`group`: share the file with that group (mode 0660), for an agent that runs as
        another user of the local API's group; else only this user may open it (0600)."""
        self.path = shm_dir() / f"{PREFIX}{uuid.uuid4().hex}"
        self.size = max(int(nbytes), mmap.PAGESIZE)
        mode = 0o600 if group is None else 0o660
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            if group is not None:
                os.fchown(fd, -1, group)
                os.fchmod(fd, mode)
            os.ftruncate(fd, self.size)
            self._map = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A view of the bucket as an array of this shape and dtype."""
        n = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(self._map, dtype=dtype, count=n).reshape(shape)

    def owns(self, a: np.ndarray) -> bool:
        """True when `a` is a contiguous view that starts at this bucket's first byte."""
        base = np.frombuffer(self._map, dtype=np.uint8, count=1)
        return (a.flags.c_contiguous and a.nbytes <= self.size
                and a.__array_interface__["data"][0] == base.__array_interface__["data"][0])

    def close(self) -> None:
        """Unmap and remove the file."""
        try:
            self._map.close()
        except BufferError:  # a view is still alive: the pages go when it does
            pass
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class BucketMaps:
    """The agent's side: maps of the clients' bucket files, the most recent few kept open."""

    def __init__(self, keep: int = 16):
        self._keep = keep
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()

    def open_bucket(self, path: str, nbytes: int) -> memoryview:
        """A writable view of the first `nbytes` of a client's bucket file; OperationRefused
        for a path outside the shared-memory folder, a foreign name or a short file."""
        p = Path(path)
        if p.parent != shm_dir() or not _NAME.match(p.name):
            raise OperationRefused(f"bucket file {path!r} is not an oddl bucket in {shm_dir()}; "
                                   "use agents.client.AgentClient")
        m = self._maps.get(path)
        if m is None or len(m) < nbytes:
            try:
                fd = os.open(p, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
            except OSError as exc:
                raise OperationRefused(f"cannot open bucket file {path}: {exc}; is the "
                                       "training process on this host?") from exc
            try:
                size = os.fstat(fd).st_size
                if size < nbytes:
                    raise OperationRefused(f"bucket file {path} holds {size} B, the request "
                                           f"needs {nbytes} B")
                m = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            old = self._maps.pop(path, None)
            if old is not None:
                _close(old)
            self._maps[path] = m
            while len(self._maps) > self._keep:
                _close(self._maps.popitem(last=False)[1])
        self._maps.move_to_end(path)
        return memoryview(m)[:nbytes]

    def close(self) -> None:
        """Unmap everything."""
        for m in self._maps.values():
            _close(m)
        self._maps.clear()


def _close(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:
        logger.debug("a bucket map is still in use; it closes when released")
