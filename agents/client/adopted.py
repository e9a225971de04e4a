"""Memory a training process already has, adopted as extra buckets (decision record 0017).

A caller that owns shared memory mapped in this process — a torch tensor's storage moved
into shared memory (`oddl.torch.adopt`) — adopts it: `AgentClient.adopt(memory)`. Its
descriptor goes to the agent once (`BucketLink.adopt`), and from then on an array that lies
inside it is reduced where it is, with no copy: the request names the adopted bucket's token
and the array's byte offset in it.

`AdoptedMemory` says where the memory is and whether it is still there: `descriptor()` hands
back its (borrowed) descriptor while the memory lives at `start`, None once it was freed or
moved. Nothing here knows torch.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

logger = logging.getLogger(__name__)

MAX_REGIONS = 64
"""Adopted memories one client keeps (as many as an agent keeps per client,
`oddl.agents.local_api.bucket_registry.MAX_ADOPTED`); adopting one more forgets the oldest."""


class AdoptedMemory(Protocol):
    """Shared memory mapped in this process at `start`, `nbytes` long."""

    start: int
    nbytes: int

    def descriptor(self) -> int | None:
        """Its descriptor (borrowed: the caller neither keeps nor closes it) while the memory
        is still mapped at `start`; None once it was freed or moved."""


@dataclass(eq=False)
class Region:
    """One adopted memory and the agent's token for it on the bucket connection `epoch`."""

    memory: AdoptedMemory
    token: str = ""
    epoch: int = -1


@dataclass(eq=False)
class InRegion:
    """Where an array lies: `offset` bytes into the adopted `region` (what a request names)."""

    region: Region
    offset: int


@dataclass
class AdoptedTable:
    """A client's adopted memories, oldest first; at most `limit`."""

    limit: int = MAX_REGIONS
    _regions: OrderedDict[int, Region] = field(default_factory=OrderedDict)

    def add(self, memory: AdoptedMemory) -> list[Region]:
        """Adopt `memory` (replacing one that starts at the same address); the regions this
        drops (freed, or the oldest beyond the limit), whose tokens the agent may let go."""
        dropped = self.sweep()
        old = self._regions.pop(memory.start, None)
        if old is not None:
            dropped.append(old)
        self._regions[memory.start] = Region(memory)
        while len(self._regions) > self.limit:
            dropped.append(self._regions.popitem(last=False)[1])
        return dropped

    def find(self, a: np.ndarray) -> InRegion | None:
        """Where the contiguous array `a` lies inside an adopted memory that is still there;
        None when it lies in none (or not wholly in one)."""
        if not self._regions or not a.flags.c_contiguous or a.nbytes == 0:
            return None
        address = int(a.__array_interface__["data"][0])
        for region in reversed(self._regions.values()):  # the newest first: DDP's buckets
            memory = region.memory
            if memory.start <= address and address + a.nbytes <= memory.start + memory.nbytes:
                if memory.descriptor() is None:  # freed or moved: `sweep` forgets it
                    return None
                return InRegion(region, address - memory.start)
        return None

    def find_memory(self, memory: AdoptedMemory) -> Region | None:
        """The region of `memory`, if it is adopted."""
        region = self._regions.get(memory.start)
        return region if region is not None and region.memory is memory else None

    def forget(self, region: Region) -> None:
        """Stop using `region` (the agent refused it)."""
        if self._regions.get(region.memory.start) is region:
            del self._regions[region.memory.start]

    def sweep(self) -> list[Region]:
        """Forget the memories that were freed or moved; the regions forgotten."""
        gone = [r for r in self._regions.values() if r.memory.descriptor() is None]
        for region in gone:
            del self._regions[region.memory.start]
        return gone

    def __len__(self) -> int:
        return len(self._regions)

