"""What a complete barrier decides from every node's ready: start, or refuse with the reason.

The ranks must hand in the same call (step number, `oddl.common.pairing`), the same collective
(kind, reduction op, root: `oddl.common.collective_kinds`) and the same array (shape and dtype).
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from oddl.common.collective_kinds import call_mismatch
from oddl.common.pairing import step_mismatch

MAX_ELEMENTS = 1 << 36
"""Largest collective (elements) a job accepts: 256 GiB of float32."""

Call = tuple[str, str, int]
"""(kind, op, root) of one node's call."""
Entry = tuple[tuple[int, ...], str, Call]
"""One node's ready: (shape, dtype, call)."""


@dataclass(frozen=True)
class Agreed:
    """What every node handed in, once they agree."""

    n_elems: int
    dtype: np.dtype
    call: Call


def agreed_call(job_id: str, seq: int, entries: Mapping[str, Entry],
                steps: Mapping[str, int]) -> Agreed | str:
    """The call every node made, or the reason collective `seq` is refused."""
    mismatch = step_mismatch(job_id, seq, steps) or call_mismatch(
        job_id, seq, {n: e[2] for n, e in entries.items()})
    if mismatch:
        return mismatch
    arrays = {(s, d) for s, d, _ in entries.values()}
    if len(arrays) > 1:
        detail = ", ".join(f"{n}: shape {list(s)} dtype {d}"
                           for n, (s, d, _) in sorted(entries.items()))
        return (f"collective {seq} of job {job_id} refused: the training processes handed in "
                f"different arrays ({detail}); every node must hand in the same shape and "
                "dtype in the same order")
    shape, dtype = arrays.pop()
    n = 1
    for x in shape:
        n *= x
    if any(x < 0 for x in shape) or n > MAX_ELEMENTS:
        return (f"collective {seq} of job {job_id} refused: shape {list(shape)} is not an "
                f"array this testbed can carry (at most {MAX_ELEMENTS:,} elements)")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return f"unknown dtype {dtype!r}"
    return Agreed(n, dt, next(iter(entries.values()))[2])
