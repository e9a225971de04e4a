"""Where a run's elements are: the plan's element layout and the arrays that hold it.

A plan addresses one layout of elements (`oddl.common.collective_kinds.work_blocks`): an
all-reduce's bucket, an all-to-all's input blocks followed by its output blocks. Usually one
array holds the whole layout (`Memory.whole`). A call whose tensors already hold the ranges
its sends read and its receives write can hand them over as they are (`Memory.apart`): an
all-to-all's input blocks and output blocks, read and written in the caller's own tensors,
with no copy into a work buffer and none back out. The plan, its chunks and the proofs over
them (`oddl.agents.collective.chunks`, `oddl.agents.collective.direct_landing`) are the same
either way; only where an element range is found differs.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

import numpy as np

from oddl.common.errors import CollectiveError

__all__ = ["Memory"]


class Memory:
    """Disjoint element ranges of a plan's layout, each held by a flat array of its own, all
    of one dtype. Every range a run touches must lie inside one of them (`view`)."""

    def __init__(self, regions: Iterable[tuple[int, np.ndarray]]):
        placed = sorted(((int(start), a) for start, a in regions), key=lambda r: r[0])
        if not placed:
            raise ValueError("a run's memory needs at least one array")
        dtypes = {a.dtype for _, a in placed}
        if len(dtypes) != 1:
            raise ValueError(f"a run's arrays must share one dtype, not {sorted(map(str, dtypes))}")
        for start, a in placed:
            if a.ndim != 1 or not a.flags.c_contiguous or start < 0:
                raise ValueError(f"the array at element {start} must be flat and contiguous "
                                 f"({a.ndim}-d, contiguous: {a.flags.c_contiguous})")
        for (s0, a0), (s1, _) in zip(placed, placed[1:], strict=False):
            if s0 + a0.size > s1:
                raise ValueError(f"the arrays at elements {s0} ({a0.size} long) and {s1} overlap")
        self._starts = [s for s, _ in placed]
        self._arrays = [a for _, a in placed]
        self._one = self._arrays[0] if len(placed) == 1 and placed[0][0] == 0 else None
        self.dtype: np.dtype = placed[0][1].dtype
        self.itemsize: int = self.dtype.itemsize
        self.size: int = max(s + a.size for s, a in placed)
        """The layout's extent in elements (its gaps, if any, included)."""
        self.nbytes: int = sum(a.nbytes for a in self._arrays)
        """The bytes the arrays hold."""

    @classmethod
    def whole(cls, buf: np.ndarray) -> Memory:
        """The layout held by one flat array."""
        return cls([(0, buf)])

    @classmethod
    def apart(cls, regions: Iterable[tuple[int, np.ndarray]]) -> Memory:
        """The layout held by several arrays, each at its first element (see the module
        docstring)."""
        return cls(regions)

    def view(self, offset: int, n: int) -> np.ndarray:
        """Elements [offset, offset + n) of the layout, as a view of the array holding them;
        CollectiveError when no one array holds them all (the plan reaches past the arrays
        the caller handed over)."""
        if self._one is not None and offset + n <= self._one.size:
            return self._one[offset:offset + n]
        i = bisect_right(self._starts, offset) - 1
        if i >= 0:
            rel = offset - self._starts[i]
            if rel + n <= self._arrays[i].size:
                return self._arrays[i][rel:rel + n]
        raise CollectiveError(
            f"elements {offset}+{n} of the plan's layout lie in none of the run's arrays "
            f"(at {self._starts}, {[a.size for a in self._arrays]} long); the plan and the "
            "call's tensors disagree: check that every rank makes the same call")

    def snapshot(self) -> Memory:
        """A copy of every array, at the same places (what a step's sends read while its
        receives overwrite what they send)."""
        return Memory(zip(self._starts, (a.copy() for a in self._arrays), strict=True))
