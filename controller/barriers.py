"""The barrier book: every node's ready for a collective, and what the complete barrier decides.

A collective that passes the controller's barrier (its bucket's first call, ADR 0002) starts
when every node of its job has handed in its ready. The ranks must hand in the same call
(step number, `oddl.common.pairing`), the same collective (kind, reduction op, root:
`oddl.common.collective_kinds`) and the same array (shape and dtype); otherwise the barrier
refuses with the reason. The book keeps, per job, the readies still waiting, their callers'
step numbers and the collectives already abandoned (a participant failed).

Pure: no I/O, no clock, no lock. Its owner (`oddl.controller.core.ControllerCore`) holds the
lock around every call and checks the job (running, the node in it) first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from oddl.common.collective_kinds import ALL_REDUCE, call_mismatch
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


Refusal = Callable[[Agreed], str]
"""Why the job cannot run an agreed call ("" if it can): the OptINC device's limits."""


@dataclass(frozen=True)
class Barrier:
    """The outcome of a complete barrier: start, or refuse with `error`."""

    job_id: str
    seq: int
    n_elems: int
    itemsize: int
    error: str = ""
    kind: str = ALL_REDUCE
    root: int = 0
    caller_steps: Mapping[str, int] = field(default_factory=dict)
    """With `error`: each node's step number (a node behind another goes on, `oddl.common.pairing`)."""


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


@dataclass
class _Waiting:
    """One job's barriers: readies per waiting collective, their steps, the abandoned ones."""

    ready: dict[int, dict[str, Entry]] = field(default_factory=dict)
    steps: dict[int, dict[str, int]] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)


class BarrierBook:
    """The waiting barriers of every job."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Waiting] = {}

    def waiting(self, job_id: str) -> list[int]:
        """The collectives of `job_id` some node is waiting in, in order."""
        waiting = self._jobs.get(job_id)
        return sorted(waiting.ready) if waiting is not None else []

    def ready(self, job_id: str, nodes: int, seq: int, node: str, shape: Sequence[int],
              dtype: str, step: int = 0, call: Call = (ALL_REDUCE, "sum", 0),
              refuse: Refusal | None = None) -> Barrier | None:
        """Record one node's ready for collective `seq` of a job of `nodes` nodes; the
        barrier's outcome once every node is in (None until then)."""
        waiting = self._jobs.setdefault(job_id, _Waiting())
        if seq in waiting.failed:
            return Barrier(job_id, seq, 0, 0, error=f"collective {seq} of job {job_id} was "
                           "already abandoned (a node failed); continue with the next one")
        waiting.ready.setdefault(seq, {})[node] = (tuple(int(x) for x in shape), dtype, call)
        waiting.steps.setdefault(seq, {})[node] = step
        if len(waiting.ready[seq]) < nodes:
            return None
        steps = waiting.steps.pop(seq)
        agreed = agreed_call(job_id, seq, waiting.ready.pop(seq), steps)
        if isinstance(agreed, str):
            return Barrier(job_id, seq, 0, 0, error=agreed, caller_steps=steps)
        error = refuse(agreed) if refuse is not None else ""
        if error:
            return Barrier(job_id, seq, 0, 0, error=f"collective {seq} of job {job_id} "
                           f"refused: {error}")
        kind, _op, root = agreed.call
        return Barrier(job_id, seq, agreed.n_elems, agreed.dtype.itemsize, kind=kind, root=root)

    def abandon(self, job_id: str, reason: str) -> list[Barrier]:
        """Fail every barrier of `job_id` still waiting for nodes (a participant died); a
        later ready for one of them is refused at once."""
        waiting = self._jobs.get(job_id)
        if waiting is None:
            return []
        failed = []
        for seq in sorted(waiting.ready):
            waiting.failed.add(seq)
            failed.append(Barrier(job_id, seq, 0, 0, error=f"collective {seq} of job {job_id} "
                                  f"abandoned: {reason}"))
        waiting.ready.clear()
        waiting.steps.clear()
        return failed

    def forget(self, job_id: str) -> None:
        """Drop every barrier of a job that ended."""
        self._jobs.pop(job_id, None)
