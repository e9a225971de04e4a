"""Shared-memory buckets in named files: the fallback where descriptors cannot be passed.

On the common path a training process hands its agent an anonymous memory file descriptor
over the Unix socket beside the local API (`oddl.common.memfd`, `oddl.agents.client.buckets`): nothing is
named anywhere. Where that is impossible — a local API on `tcp://127.0.0.1`, a platform
without `memfd_create` — the client writes its bucket into a file here, and the request names
the file; the agent maps the same pages and reduces in place. Either way the bucket never
crosses a socket.

A named file must not outlive its creator, so it cleans itself up: its name carries the
creating process's id (`oddl-bucket-<pid>-<32 hex>`); the client removes it on `close()`,
when the bucket is garbage collected and at interpreter exit (`weakref.finalize`); and every
new bucket first removes this user's files whose creating process is gone (one killed with
SIGKILL). The agent opens nothing but `oddl-bucket-*` files in the folder
(`BucketMaps.open_bucket` checks the folder, the name and the size) and lets go of a file's
pages once its client removed it.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import tempfile
import uuid
import weakref
from collections import OrderedDict
from pathlib import Path

import numpy as np

from oddl.common.errors import BucketUnavailable, OperationRefused

logger = logging.getLogger(__name__)

PREFIX = "oddl-bucket-"
_NAME = re.compile(rf"^{PREFIX}(\d{{1,10}})-[0-9a-f]{{32}}$")


def shm_dir() -> Path:
    """Where buckets live: /dev/shm where it exists (memory, not disk), else the temp dir."""
    dev = Path("/dev/shm")
    if dev.is_dir() and os.access(dev, os.W_OK):
        return dev
    return Path(tempfile.gettempdir())


def view_of(buf: mmap.mmap, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A view of the mapped bucket `buf` as an array of this shape and dtype."""
    n = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(buf, dtype=dtype, count=n).reshape(shape)


def starts_at(buf: mmap.mmap, a: np.ndarray) -> bool:
    """True when `a` is a contiguous view that starts at the first byte of `buf`."""
    base = np.frombuffer(buf, dtype=np.uint8, count=1)
    return (a.flags.c_contiguous and a.nbytes <= len(buf)
            and a.__array_interface__["data"][0] == base.__array_interface__["data"][0])


def creator_pid(name: str) -> int | None:
    """The id of the process that created bucket file `name`, or None for another name."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def sweep_dead(folder: Path) -> list[Path]:
    """Remove this user's bucket files in `folder` whose creating process has ended; the
    files removed. Another user's files, and those of live processes, stay."""
    removed: list[Path] = []
    me, uid = os.getpid(), os.getuid()
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        pid = creator_pid(name)
        if pid is None or pid == me or _alive(pid):
            continue
        path = folder / name
        try:
            if path.lstat().st_uid != uid:
                continue
            path.unlink()
        except OSError:
            continue  # gone already, or not ours to remove
        removed.append(path)
    if removed:
        logger.info("removed %d shared-memory bucket file(s) of ended processes from %s",
                    len(removed), folder)
    return removed


class SharedBucket:
    """A mapped file the client writes buckets into; grows by replacement, never shrinks.
    Removed on `close()`, on garbage collection and at interpreter exit."""

    def __init__(self, nbytes: int, group: int | None = None):
        """`group`: share the file with that group (mode 0660), for an agent that runs as
        another user of the local API's group; else only this user may open it (0600)."""
        folder = shm_dir()
        sweep_dead(folder)
        self.path = folder / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        self.size = max(int(nbytes), mmap.PAGESIZE)
        mode = 0o600 if group is None else 0o660
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            if group is not None:
                os.fchown(fd, -1, group)
                os.fchmod(fd, mode)
            os.ftruncate(fd, self.size)
            self._map = mmap.mmap(fd, self.size)
        except BaseException:
            self.path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        self._finalizer = weakref.finalize(self, _remove, self._map, self.path, os.getpid())

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A view of the bucket as an array of this shape and dtype."""
        return view_of(self._map, shape, dtype)

    def owns(self, a: np.ndarray) -> bool:
        """True when `a` is a contiguous view that starts at this bucket's first byte."""
        return starts_at(self._map, a)

    def close(self) -> None:
        """Unmap and remove the file (again: nothing)."""
        self._finalizer()


def _remove(buf: mmap.mmap, path: Path, owner: int) -> None:
    """Unmap `buf` and remove `path`, in the process that created it only (a forked child
    that exits must not remove its parent's bucket)."""
    try:
        buf.close()
    except BufferError:  # a view is still alive: the pages go when it does
        pass
    if os.getpid() == owner:
        path.unlink(missing_ok=True)


class BucketMaps:
    """The agent's side: maps of the clients' bucket files, the most recent few kept open;
    a map whose file its client removed is let go at the next request."""

    def __init__(self, keep: int = 16):
        self._keep = keep
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()

    def open_bucket(self, path: str, nbytes: int) -> memoryview:
        """A writable view of the first `nbytes` of a client's bucket file; OperationRefused
        for a path outside the shared-memory folder, a foreign name or a short file, and
        BucketUnavailable (``bucket-unreachable``) for a file this agent cannot open."""
        p = Path(path)
        if p.parent != shm_dir() or not _NAME.match(p.name):
            raise OperationRefused(f"bucket file {path!r} is not an oddl bucket in {shm_dir()}; "
                                   "use oddl.agents.client.agent_client.AgentClient")
        self._forget_removed()
        m = self._maps.get(path)
        if m is None or len(m) < nbytes:
            m = self._map(p, nbytes)
            old = self._maps.pop(path, None)
            if old is not None:
                _close(old)
            self._maps[path] = m
            while len(self._maps) > self._keep:
                _close(self._maps.popitem(last=False)[1])
        self._maps.move_to_end(path)
        return memoryview(m)[:nbytes]

    @staticmethod
    def _map(p: Path, nbytes: int) -> mmap.mmap:
        try:
            fd = os.open(p, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise BucketUnavailable(f"cannot open bucket file {p}: {exc}; is the training "
                                    "process on this host?", kind="bucket-unreachable") from exc
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:
                raise OperationRefused(f"bucket file {p} holds {size} B, the request needs "
                                       f"{nbytes} B")
            return mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def _forget_removed(self) -> None:
        for path in [p for p in self._maps if not os.path.exists(p)]:
            _close(self._maps.pop(path))

    def __len__(self) -> int:
        return len(self._maps)

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
