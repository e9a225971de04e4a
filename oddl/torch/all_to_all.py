"""The oddl torch backend's all-to-all (`dist.all_to_all`, `dist.all_to_all_single`).

Block j of a rank's inputs goes to group rank j; output i comes from group rank i. Blocks of
any dtype travel as bytes (`oddl.torch.native.raw`).

On the rank path (decision record 0040, record 0045):
- an `all_to_all_single` without split sizes has equal blocks on every rank by c10d's
  contract: they travel straight from the input tensor and land straight in the output (the
  work buffer's layout held by the tensors themselves, `oddl.agents.collective.memory`), no
  copy but this rank's own block; an output that is not contiguous or shares memory with
  the input goes through the rank's work buffer (one copy in, one out);
- blocks of any sizes (split sizes, `dist.all_to_all`'s tensors) travel each at its own size
  and place (`oddl.agents.collective.exchange`): no round that sums the sizes first, no
  padding, and straight from the inputs into the outputs where they allow it.
Through the agent, or where the job's all-to-all forwards blocks, uneven blocks travel padded
to the largest: the ranks first sum the world × world table of block sizes (a small
all-reduce), which also checks that every rank expects what the others send it.

A rank that breaks c10d's contract, or whose sizes disagree with a peer's, sends chunks at
other offsets and lengths than its peers expect, and every rank's call fails (each chunk's
offset and length are checked, then the outcome round), never a wrong result. So does a call
where some ranks pass split sizes and others none (legal for gloo): the error then says to
pass them on every rank or on none (`MIXED_SPLITS`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from oddl.agents.collective.exchange import place
from oddl.agents.collective.memory import Memory
from oddl.common.errors import CallsDiffer, CollectiveError
from oddl.torch.channel import Channel, UnsupportedCollective, count
from oddl.torch.in_rank import RankPath
from oddl.torch.native import Ranks, overlap, own_view, rank_path_of, raw, rows, store

__all__ = ["MIXED_SPLITS", "all_to_all", "all_to_all_even"]

MIXED_SPLITS = ("if some ranks pass split sizes and others none, pass them on every rank or "
                "on none: with them each block travels at its own size and place, without "
                "them every block at one size")
"""The hint added to an all-to-all's failure where the ranks ran different calls."""


def all_to_all(ch: Channel, ranks: Ranks, me: int, outs: list[torch.Tensor],
               ins: list[torch.Tensor], what: str, even: bool = False) -> None:
    """Block j of `ins` to group rank j, outs[i] from group rank i; `even`: every rank's
    blocks are of one size, as c10d promises for an all-to-all without split sizes."""
    world = len(ranks.to_job)
    if len(outs) != world or len(ins) != world:
        raise UnsupportedCollective(f"{what}: {len(ins)} inputs and {len(outs)} outputs "
                                    f"for a world of {world}")
    arrays = [raw(t, what).reshape(-1) for t in ins]
    dtypes = {a.dtype for a in arrays} | {raw(o[:0], what).dtype for o in outs}
    if len(dtypes) != 1:
        raise UnsupportedCollective(f"{what}: one dtype, not {sorted(map(str, dtypes))}")
    dtype = dtypes.pop()
    sizes = {a.size for a in arrays} | {_elements(o) for o in outs}
    path = rank_path_of(ch)
    with _hinted(what):
        if even and len(sizes) == 1:
            cap = sizes.pop()
        elif path is not None and path.sizes_all_to_all(dtype):
            _sized_in_rank(path, ranks, me, arrays, outs, what)
            count(what, optical=sum(a.nbytes for a in arrays))
            return
        else:
            cap = _largest_block(ch, me, arrays, outs, what)
        count(what, optical=world * cap * dtype.itemsize)
        if cap == 0:
            return
        targets = None if path is None else _targets(outs, cap, what)
        if path is not None and targets is not None \
                and _apart_in_rank(path, ranks, me, arrays, targets, cap):
            return
        got = _in_rank(path, ranks, arrays, cap, dtype)
        if got is None:
            blocks = np.zeros((world, cap), dtype=dtype)
            for j, a in enumerate(arrays):
                blocks[ranks.job(j), :a.size] = a
            got = ch.client.all_to_all(blocks, job=ch.job)
    for i, o in enumerate(outs):
        store(o, got[ranks.job(i), :_elements(o)])


def _elements(t: torch.Tensor) -> int:
    """How many elements `t` travels as (`raw`: a complex number as two reals)."""
    return t.numel() * (2 if t.is_complex() else 1)


@contextmanager
def _hinted(what: str) -> Iterator[None]:
    """`CallsDiffer` (the ranks ran different calls), with `MIXED_SPLITS`."""
    try:
        yield
    except CallsDiffer as exc:
        raise CallsDiffer(f"{exc} ({what}: {MIXED_SPLITS})") from exc


def _largest_block(ch: Channel, me: int, arrays: list[np.ndarray], outs: list[torch.Tensor],
                   what: str) -> int:
    """The largest block any rank sends (the ranks sum their sizes: [i, j] is what group rank
    i sends to group rank j); CollectiveError where a rank sends this one other than it
    expects."""
    world = len(arrays)
    sizes = np.zeros((world, world), dtype=np.int64)
    sizes[me] = [a.size for a in arrays]
    ch.sum_(sizes)
    count(f"{what} (sizes)", optical=sizes.nbytes)
    for i in range(world):
        if sizes[i, me] != _elements(outs[i]):
            raise CollectiveError(f"{what}: rank {i} sends {sizes[i, me]} elements to rank "
                                  f"{me}, which expects {_elements(outs[i])}")
    return int(sizes.max())


def _in_rank(path: RankPath | None, ranks: Ranks, arrays: list[np.ndarray], cap: int,
             dtype: np.dtype) -> np.ndarray | None:
    """The received blocks (world, cap) by job rank, exchanged on the rank path; None where
    the agent exchanges them. The work buffer is laid out as the agent's client lays it
    out: the input blocks by job rank, then the output's, this rank's own already in place.
    A block shorter than `cap` is padded with zeros (nothing of an earlier call travels)."""
    if path is None:
        return None
    world = len(arrays)
    work = path.scratch("all_to_all", (2 * world, cap), dtype)
    for j, a in enumerate(arrays):
        row = work[ranks.job(j)]
        row[:a.size] = a
        row[a.size:] = 0
    work[world + path.rank] = work[path.rank]
    return work[world:] if path.run(work, "all_to_all") else None


def all_to_all_even(ch: Channel, ranks: Ranks, me: int, output: torch.Tensor,
                    input: torch.Tensor, what: str) -> None:  # noqa: A002
    """`all_to_all_single` without split sizes: equal blocks along the first dimension.
    Contiguous tensors of the process's memory on the rank path go block by block straight
    from `input` into `output` (`_apart_in_rank`) with no more Python per block than a
    row view; anything else takes `all_to_all` with the blocks split apart."""
    world = len(ranks.to_job)
    path = rank_path_of(ch)
    flat_out = None if path is None else own_view(output, what)
    if path is not None and flat_out is not None and output.shape[:1] == input.shape[:1] \
            and output.numel() == input.numel() and output.numel() \
            and output.shape[0] % world == 0:
        flat_in = raw(input, what).reshape(-1)
        if flat_in.dtype == flat_out.dtype:
            with _hinted(what):
                done = _apart_in_rank(path, ranks, me, list(flat_in.reshape(world, -1)),
                                      list(flat_out.reshape(world, -1)), flat_in.size // world)
            if done:
                count(what, optical=flat_in.nbytes)
                return
    all_to_all(ch, ranks, me, rows(output, [], world, what), rows(input, [], world, what),
               what, even=True)


def _targets(outs: list[torch.Tensor], cap: int, what: str) -> list[np.ndarray] | None:
    """The outputs' own memory (`own_view`), when every one has it and `cap` elements; else
    None."""
    targets = []
    for o in outs:
        view = own_view(o, what)
        if view is None or view.size != cap:
            return None
        targets.append(view)
    return targets


def _apart_in_rank(path: RankPath, ranks: Ranks, me: int, arrays: list[np.ndarray],
                   targets: list[np.ndarray], cap: int) -> bool:
    """Exchange the blocks on the rank path straight from the inputs into the outputs (the
    work buffer's layout held by the arrays themselves: `Memory.apart`), when every block
    is `cap` elements and no output shares memory with an input; False, with nothing sent,
    where that does not hold or the agent keeps the call (the caller then copies through
    the work buffer)."""
    world = len(arrays)
    if any(a.size != cap for a in arrays) or overlap(arrays, targets):
        return False
    targets[me][...] = arrays[me]  # this rank's own block moves no further
    regions = [(ranks.job(j) * cap, a) for j, a in enumerate(arrays)]
    regions += [((world + ranks.job(i)) * cap, t) for i, t in enumerate(targets)]
    return path.run(Memory.apart(regions), "all_to_all")


def _sized_in_rank(path: RankPath, ranks: Ranks, me: int, arrays: list[np.ndarray],
                   outs: list[torch.Tensor], what: str) -> None:
    """Exchange blocks of the sizes this rank's tensors have, each at its own place
    (`oddl.agents.collective.exchange`): straight from the inputs into the outputs where
    they are contiguous tensors of the process's memory and share none with an input,
    through copies where not. A rank whose own block is of another size in than out fails
    the call on every rank, naming both."""
    world, dtype = len(arrays), arrays[0].dtype
    views = [own_view(o, what) for o in outs]  # the rest land in arrays of their own
    targets = [v if v is not None else np.empty(_elements(o), dtype)
               for v, o in zip(views, outs, strict=True)]
    if targets[me].size != arrays[me].size:
        path.give_up(CollectiveError(
            f"{what}: rank {me} sends itself {arrays[me].size} elements and expects "
            f"{targets[me].size}; its split sizes for itself must agree"))
    if overlap(arrays, targets):  # in place: the sends read a copy of the input
        arrays = [a.copy() for a in arrays]
    targets[me][...] = arrays[me]  # this rank's own block moves no further
    dummy = np.zeros(1, dtype)
    regions = [(place(ranks.job(j), a.size), a if a.size else dummy.copy())
               for j, a in enumerate(arrays)]
    regions += [(place(world + ranks.job(i), t.size), t if t.size else dummy.copy())
                for i, t in enumerate(targets)]
    sent, received = [0] * world, [0] * world
    for j in range(world):
        sent[ranks.job(j)], received[ranks.job(j)] = arrays[j].size, targets[j].size
    path.run_sized_all_to_all(Memory.apart(regions), tuple(sent), tuple(received))
    for v, o, t in zip(views, outs, targets, strict=True):
        if v is None:
            store(o, t)
