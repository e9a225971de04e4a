"""What a collective plan is: a collective expanded into steps of transfers over a flat buffer.

Every rank holds a flat buffer of `n_elems` elements. A `Step` is a set of transfers, each
"rank src sends elements [offset, offset+length) of its buffer to rank dst", with one `Op`
for the whole step:

- ``REDUCE``: the receiver adds the segment into the same range of its buffer;
- ``COPY``: the receiver overwrites that range with the segment.

Snapshot semantics: within a step every send reads the sender's buffer as it was at the
START of the step; only then are the received segments applied (in transfer order). A step is
therefore one barrier-separated exchange, and an agent may send and receive concurrently.
Zero-length transfers are never stored, and steps left without transfers are dropped.

Plans stay compact at N = 1024: a step holds four int64 numpy arrays (not Python objects per
transfer), and plans share read-only arrays between steps where they are equal (every ring
step uses the same src/dst arrays; offsets are views into one rotated array).

Builders of plans register with `register_collective` (`oddl.controller.scheduling.registry`);
`validate_plan` checks a plan, `execute_plan` is the reference executor. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from oddl.common.errors import PlanError


class Op(StrEnum):
    """What a receiver does with a received segment."""

    REDUCE = "reduce"
    """Add the segment into the same range of the receiver's buffer."""
    COPY = "copy"
    """Overwrite the same range of the receiver's buffer with the segment."""


@dataclass(frozen=True, eq=False)
class Step:
    """One exchange: transfer t sends ``buf[src[t]][offset[t]:offset[t]+length[t]]`` to dst[t].

    The arrays are int64, equally long, and read-only (steps may share them).
    """

    src: np.ndarray
    dst: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    op: Op
    phase: str = ""
    recv_offset: np.ndarray | None = None
    """Where each receiver puts the segment (element offset in its buffer); None: at the
    sender's `offset` (every all-reduce). All-to-all receives block i into another range than
    the one its sender read."""

    def __post_init__(self) -> None:
        n = self.src.shape
        if len(n) != 1 or self.dst.shape != n or self.offset.shape != n or self.length.shape != n:
            raise PlanError(
                "a step needs four 1-D arrays of equal length (src, dst, offset, length); got "
                f"shapes {self.src.shape}, {self.dst.shape}, {self.offset.shape}, "
                f"{self.length.shape}"
            )
        if self.recv_offset is not None and self.recv_offset.shape != n:
            raise PlanError(f"a step's recv_offset must be as long as its offset ({n}); got "
                            f"shape {self.recv_offset.shape}")

    @property
    def landing(self) -> np.ndarray:
        """Where each transfer lands in its receiver's buffer (element offsets)."""
        return self.offset if self.recv_offset is None else self.recv_offset

    def __len__(self) -> int:
        return int(self.src.shape[0])


@dataclass(frozen=True, eq=False)
class Plan:
    """A collective over `n_ranks` ranks of `n_elems`-element buffers, as ordered steps."""

    collective: str
    n_ranks: int
    n_elems: int
    steps: tuple[Step, ...]

    @property
    def n_steps(self) -> int:
        """Number of steps (barrier-separated exchanges)."""
        return len(self.steps)

    @property
    def n_transfers(self) -> int:
        """Number of transfers over all steps."""
        return sum(len(s) for s in self.steps)

    def bytes_sent(self, itemsize: int) -> np.ndarray:
        """Return the bytes each rank sends over the whole plan (int64 array, by rank)."""
        return self._per_rank("src", itemsize)

    def bytes_received(self, itemsize: int) -> np.ndarray:
        """Return the bytes each rank receives over the whole plan (int64 array, by rank)."""
        return self._per_rank("dst", itemsize)

    def _per_rank(self, side: str, itemsize: int) -> np.ndarray:
        total = np.zeros(self.n_ranks, dtype=np.int64)
        if self.n_transfers:
            ranks = np.concatenate([getattr(s, side) for s in self.steps])
            lengths = np.concatenate([s.length for s in self.steps])
            order = np.argsort(ranks, kind="stable")
            ranks, lengths = ranks[order], lengths[order]
            starts = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
            total[ranks[starts]] = np.add.reduceat(lengths, starts)
        return total * int(itemsize)


# --------------------------------------------------------------------------- checking


def validate_plan(plan: Plan) -> None:
    """Raise PlanError unless every transfer is in range, non-empty and unambiguous.

    Checks: ranks in 0..N−1, no rank sends to itself, 0 ≤ offset, 0 < length,
    offset+length ≤ n_elems, integer arrays, and in COPY steps no two segments received by
    one rank overlap (their order would decide the result).
    """
    n, n_elems = plan.n_ranks, plan.n_elems
    if n < 1 or n_elems < 0:
        raise PlanError(f"plan needs n_ranks >= 1 and n_elems >= 0; got {n} and {n_elems}")
    for i, step in enumerate(plan.steps):
        where = f"{plan.collective} step {i}"
        if not isinstance(step.op, Op):
            raise PlanError(f"{where}: op must be Op.REDUCE or Op.COPY; got {step.op!r}")
        arrays = (step.src, step.dst, step.offset, step.length)
        if not all(np.issubdtype(a.dtype, np.integer) for a in arrays):
            raise PlanError(f"{where}: src, dst, offset and length must be integer arrays")
        if len(step) == 0:
            continue
        bad = np.flatnonzero((step.src < 0) | (step.src >= n) | (step.dst < 0) | (step.dst >= n))
        if len(bad):
            t = bad[0]
            raise PlanError(
                f"{where}: transfer {t} goes {step.src[t]} -> {step.dst[t]}; ranks are 0..{n - 1}"
            )
        bad = np.flatnonzero(step.src == step.dst)
        if len(bad):
            raise PlanError(f"{where}: rank {step.src[bad[0]]} sends to itself; drop the transfer")
        for side, starts in (("covers", step.offset), ("lands on", step.landing)):
            end = starts + step.length
            bad = np.flatnonzero((starts < 0) | (step.length <= 0) | (end > n_elems))
            if len(bad):
                t = bad[0]
                raise PlanError(
                    f"{where}: transfer {t} {side} [{starts[t]}, {end[t]}) of length "
                    f"{step.length[t]}; segments must be non-empty and inside [0, {n_elems})"
                )
        if step.op is Op.COPY:
            order = np.lexsort((step.landing, step.dst))
            d, o, e = step.dst[order], step.landing[order], end[order]
            clash = np.flatnonzero((d[1:] == d[:-1]) & (o[1:] < e[:-1]))
            if len(clash):
                c = clash[0]
                raise PlanError(
                    f"{where}: rank {d[c]} receives overlapping COPY segments [{o[c]}, {e[c]}) "
                    f"and [{o[c + 1]}, {e[c + 1]}); split them over two steps"
                )


def execute_plan(plan: Plan, inputs: Sequence[np.ndarray],
                 reduce: np.ufunc = np.add) -> list[np.ndarray]:
    """Run `plan` on one input buffer per rank and return every rank's final buffer.

    The reference executor (pure numpy, snapshot semantics, receives applied in transfer
    order; REDUCE applies `reduce`, a binary ufunc). The inputs are not modified. For an
    all-reduce every output equals the sum.
    """
    if len(inputs) != plan.n_ranks:
        raise PlanError(
            f"{plan.collective} plan has {plan.n_ranks} ranks; got {len(inputs)} inputs"
        )
    bufs = [np.array(x, copy=True) for x in inputs]
    for r, b in enumerate(bufs):
        if b.shape != (plan.n_elems,) or b.dtype != bufs[0].dtype:
            raise PlanError(
                f"input {r} has shape {b.shape} and dtype {b.dtype}; every input must be 1-D "
                f"with {plan.n_elems} elements of dtype {bufs[0].dtype}"
            )
    for step in plan.steps:
        src, dst = step.src.tolist(), step.dst.tolist()
        off, ln = step.offset.tolist(), step.length.tolist()
        sent = [bufs[s][o : o + m].copy() for s, o, m in zip(src, off, ln, strict=True)]
        for d, o, m, data in zip(dst, step.landing.tolist(), ln, sent, strict=True):
            if step.op is Op.REDUCE:
                reduce(bufs[d][o : o + m], data, out=bufs[d][o : o + m])
            else:
                bufs[d][o : o + m] = data
    return bufs


# --------------------------------------------------------------------------- helpers


def read_only(a: np.ndarray) -> np.ndarray:
    """Mark `a` read-only and return it (plans and schedules share such arrays)."""
    a.setflags(write=False)
    return a


def append_nonempty(
    steps: list[Step],
    src: np.ndarray,
    dst: np.ndarray,
    off: np.ndarray,
    ln: np.ndarray,
    op: Op,
    phase: str,
) -> None:
    """Append a step without its zero-length transfers, or nothing if none is left."""
    keep = ln > 0
    if keep.all():
        steps.append(Step(src, dst, read_only(off), read_only(ln), op, phase))
    elif keep.any():
        steps.append(
            Step(
                read_only(src[keep]),
                read_only(dst[keep]),
                read_only(off[keep]),
                read_only(ln[keep]),
                op,
                phase,
            )
        )
