"""Zero-copy all-reduce for tensors the training script reuses (decision record 0017).

DDP all-reduces the same bucket tensors every iteration, and most scripts reuse their
buffers. The second time the same storage comes to an in-place all-reduce (the first time,
for the first storage of a size the client's bucket cannot hold: `Promoter._first_of_size`,
decision record 0035), `Promoter` moves
it into shared memory *in place* (torch's `_share_fd_cpu_`, what `Tensor.share_memory_()`
does under the file_descriptor strategy: the storage keeps its identity and gets a new data
pointer, so every view of it — DDP's gradient views into its bucket — follows) and hands its
descriptor to the agent (`AgentClient.adopt`). From then on the collective runs in the
tensor's own memory: no copy into the client's bucket, none back.

A storage is promoted only if it is plain CPU memory that nobody else points into: not
shared or pinned already, still resizable (torch makes a storage unresizable once numpy or a
foreign buffer aliases it: `Tensor.numpy()`, `torch.from_numpy`, `torch.frombuffer`), a
plain `Tensor` or `Parameter`, at least `MIN_BYTES`. A storage seen once keeps the copy path
(FSDP's fresh outputs must not pay a share each call; they pay it at most once per size); "the same storage" means the same
StorageImpl — a torch weak reference to it (`StorageWeakRef`) pins its identity, so a new
storage at a recycled address is a new sighting — at the same data pointer and size.

After promotion the storage is made unresizable: torch 2.13 crashes (SIGSEGV) when an
fd-shared CPU storage is resized; a resize now raises "Trying to resize storage that is not
resizable" instead. `ODDL_ZERO_COPY=0` turns promotion off.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

if TYPE_CHECKING:
    from oddl.agents.client.agent_client import AgentClient

logger = logging.getLogger(__name__)

ENV_ZERO_COPY = "ODDL_ZERO_COPY"
MIN_BYTES = 256 * 1024
"""Smaller storages are copied (a copy of this size costs tens of microseconds)."""
SIGHTINGS = 256
"""Storages seen once that are remembered (the oldest are forgotten)."""


class StorageMemory:
    """A promoted storage as `oddl.agents.client.adopted.AdoptedMemory`: where it is, and its descriptor
    while it is still there (the same StorageImpl, at the same address, in the same file)."""

    def __init__(self, storage: torch.UntypedStorage, fd: int):
        self._weak = StorageWeakRef(storage)
        self.start = storage.data_ptr()
        self.nbytes = storage.nbytes()
        self._inode = _inode(fd)

    def descriptor(self) -> int | None:
        if self._weak.expired():
            return None
        storage = torch.UntypedStorage._new_with_weak_ptr(self._weak.cdata)
        if storage is None or storage.data_ptr() != self.start or not storage.is_shared():
            return None
        try:
            fd = int(storage._get_shared_fd())  # type: ignore[attr-defined]  # kept by torch
        except RuntimeError:  # shared some other way (file_system): not this memory
            return None
        return fd if _inode(fd) == self._inode else None


def _inode(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class _Sighting:
    def __init__(self, storage: torch.UntypedStorage):
        self.weak = StorageWeakRef(storage)
        self.ptr, self.nbytes = storage.data_ptr(), storage.nbytes()

    def is_of(self, storage: torch.UntypedStorage) -> bool:
        return (not self.weak.expired() and self.weak.cdata == storage._cdata
                and (self.ptr, self.nbytes) == (storage.data_ptr(), storage.nbytes()))


class Promoter:
    """Moves reused storages into shared memory and has `client` adopt them (module
    docstring); used only on the thread that uses `client`."""

    def __init__(self, client: AgentClient, min_bytes: int = MIN_BYTES,
                 enabled: bool | None = None):
        self.client = client
        self.min_bytes = min_bytes
        self.enabled = (os.environ.get(ENV_ZERO_COPY, "1").strip() != "0" if enabled is None
                        else enabled)
        self.promoted = 0
        self._seen: OrderedDict[int, _Sighting] = OrderedDict()
        self.eager = True
        """Promote the first storage of a size the bucket cannot hold at once (False: at its
        second sighting, as every storage before decision record 0035)."""
        self._sizes: OrderedDict[int, None] = OrderedDict()
        """Sizes whose first storage was promoted at once (`_first_of_size`), oldest first."""

    def before_in_place(self, t: torch.Tensor) -> None:
        """`t` is about to be all-reduced in place: promote its storage if this is the
        second time it comes and it qualifies."""
        if not self.enabled or not plain(t, self.min_bytes):
            return
        storage = t.untyped_storage()
        key = storage._cdata
        seen = self._seen.pop(key, None)
        if (seen is None or not seen.is_of(storage)) \
                and not (self.eager and self._first_of_size(storage)):
            self._seen[key] = _Sighting(storage)
            while len(self._seen) > SIGHTINGS:
                self._seen.popitem(last=False)
            return
        fd, _ = storage._share_fd_cpu_()  # the bytes move into shared memory, in place
        forbid_resize(storage)
        self.promoted += 1
        if not self.client.adopt(StorageMemory(storage, fd)):
            # an agent of another uid (or one that takes no descriptors): it will refuse
            # every storage, so move no more of them
            self.enabled = False
            logger.warning("the agent did not adopt a tensor's memory; this process copies "
                           "its tensors as before from now on (decision record 0017)")


    def _first_of_size(self, storage: torch.UntypedStorage) -> bool:
        """Whether a storage seen for the first time is promoted at once: the first one of
        its size that the client's bucket cannot hold. The copy path would make a new bucket
        of that size — the same new pages and the same copy as the move into shared memory —
        and the second call would then pay the move as well (issue 36). Each size is tried so
        once: later fresh storages of it (FSDP's outputs) wait for their second sighting."""
        nbytes = storage.nbytes()
        if nbytes in self._sizes or self.client.bucket_bytes() >= nbytes:
            return False
        self._sizes[nbytes] = None
        while len(self._sizes) > SIGHTINGS:
            self._sizes.popitem(last=False)
        return True


def plain(t: torch.Tensor, min_bytes: int) -> bool:
    """Whether `t`'s storage may be moved into shared memory (module docstring)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type != "cpu" \
            or t.layout != torch.strided or not t.is_contiguous():
        return False
    storage = t.untyped_storage()
    return (storage.nbytes() >= min_bytes and not storage.is_shared()
            and not storage.is_pinned() and storage.resizable())


def forbid_resize(storage: torch.UntypedStorage) -> None:
    """Make `storage` unresizable (what `Tensor.numpy()` does to protect its view)."""
    torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


class _Interface:
    """An object numpy makes an array of (`__array_interface__`), keeping `tensor` alive."""

    def __init__(self, tensor: torch.Tensor, dtype: np.dtype):
        self.tensor = tensor
        self.__array_interface__ = {"data": (tensor.data_ptr(), False), "version": 3,
                                    "shape": tuple(tensor.shape), "typestr": dtype.str}


_DTYPES: dict[torch.dtype, np.dtype] = {}


def array_of(t: torch.Tensor) -> np.ndarray:
    """A numpy view of the contiguous CPU tensor `t` that, unlike `Tensor.numpy()`, leaves
    its storage resizable, so that `plain` can tell a storage nobody else aliases."""
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        dtype = _DTYPES[t.dtype] = torch.empty(0, dtype=t.dtype).numpy().dtype
    return np.asarray(_Interface(t.detach(), dtype))
