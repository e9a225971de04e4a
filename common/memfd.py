"""Shared-memory buckets as anonymous memory: a `memfd` the client hands its agent.

The training process creates an anonymous memory file (`os.memfd_create`), seals it so that
it can never shrink, maps it and passes the descriptor to its agent over a Unix socket
(SCM_RIGHTS, `oddl.agents.client.buckets`); the agent maps the same pages (`map_bucket_fd`). The
memory has no name in any folder: it lives exactly as long as some process holds the
descriptor or a mapping of it, so a client that exits, is killed or is garbage collected
takes its bucket with it once its agent lets go (the agent does when the client's socket
closes).

The seal matters to the agent: a client that could shrink the file under the agent's mapping
would make the agent's next access to the cut-off pages a SIGBUS, which kills the agent.
`map_bucket_fd` accepts only a sealed memory file, and maps it only if it can write to it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat
import weakref

import numpy as np

from oddl.common.errors import OperationRefused
from oddl.common.shm import starts_at, view_of

NAME = "oddl-bucket"
"""The memfd's name: it shows as ``/memfd:oddl-bucket (deleted)`` in /proc/PID/maps."""
MAX_BUCKET_BYTES = 1 << 37
"""Largest bucket an agent maps (128 GiB: the local API's largest array of 8-byte items)."""
_F_GET_SEALS: int | None = getattr(fcntl, "F_GET_SEALS", None)
_F_ADD_SEALS: int = getattr(fcntl, "F_ADD_SEALS", 0)
_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0)
_SEALS = _SHRINK | getattr(fcntl, "F_SEAL_GROW", 0) | getattr(fcntl, "F_SEAL_SEAL", 0)


def supported() -> bool:
    """Whether this platform has sealable anonymous memory files (Linux)."""
    return hasattr(os, "memfd_create") and _F_ADD_SEALS != 0 and _SHRINK != 0


class MemfdBucket:
    """The client's bucket in anonymous memory; grows by replacement, never shrinks. Its
    descriptor stays open (`fd`) so that it can be handed to a restarted agent; `close()`,
    garbage collection and interpreter exit close it and the mapping."""

    def __init__(self, nbytes: int):
        self.size = max(int(nbytes), mmap.PAGESIZE)
        self.fd = os.memfd_create(NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            fcntl.fcntl(self.fd, _F_ADD_SEALS, _SEALS)
            self._map = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self._finalizer = weakref.finalize(self, _release, self._map, self.fd)

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A view of the bucket as an array of this shape and dtype."""
        return view_of(self._map, shape, dtype)

    def owns(self, a: np.ndarray) -> bool:
        """True when `a` is a contiguous view that starts at this bucket's first byte."""
        return starts_at(self._map, a)

    def close(self) -> None:
        """Close the descriptor and unmap (again: nothing); the memory goes once the agent
        lets go too."""
        self._finalizer()


def _release(buf: mmap.mmap, fd: int) -> None:
    try:
        buf.close()
    except BufferError:  # a view is still alive: the pages go when it does
        pass
    try:
        os.close(fd)
    except OSError:
        pass


def map_bucket_fd(fd: int, *, sealed: bool = True) -> mmap.mmap:
    """The agent's side: map a descriptor a client handed over, all of it, writable.
    OperationRefused, naming what is wrong, for anything but a memory file the agent may
    write, of at most MAX_BUCKET_BYTES, sealed against shrinking unless `sealed` is False
    (memory a client of the agent's own uid adopts, decision record 0017). The caller still
    owns (and closes) `fd`."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OperationRefused("the descriptor is not a memory file (use "
                               "oddl.agents.client.agent_client.AgentClient, which sends a memfd)")
    if sealed and not seals_against_shrinking(fd):
        raise OperationRefused("the descriptor is not a memfd sealed against shrinking "
                               "(F_SEAL_SHRINK): a bucket that could shrink under the agent's "
                               "mapping would crash it; only a process of the agent's own uid "
                               "may hand over unsealed memory (it copies instead)")
    if not 0 < st.st_size <= MAX_BUCKET_BYTES:
        raise OperationRefused(f"the bucket holds {st.st_size} B; the agent maps 1 B to "
                               f"{MAX_BUCKET_BYTES} B")
    try:
        return mmap.mmap(fd, st.st_size)
    except (OSError, ValueError) as exc:
        raise OperationRefused(f"cannot map the bucket for writing ({exc}); send a memfd "
                               "opened read-write and not sealed against writes") from exc


def seals_against_shrinking(fd: int) -> bool:
    """Whether the file behind `fd` carries F_SEAL_SHRINK (nobody can make it smaller)."""
    try:
        seals = fcntl.fcntl(fd, _F_GET_SEALS) if _F_GET_SEALS is not None else 0
    except OSError:
        seals = 0
    return bool(seals & _SHRINK)
