"""The oddl torch backend's all-to-all (`dist.all_to_all`, `dist.all_to_all_single`).

Block j of a rank's inputs goes to group rank j; output i comes from group rank i. Blocks of
any dtype travel as bytes (`oddl.torch.native.raw`). Uneven blocks travel padded to the
largest: the ranks first sum the world × world table of block sizes (a small all-reduce),
which also checks that every rank expects what the others send it. An
`all_to_all_single` without split sizes has equal blocks on every rank by c10d's contract,
so it skips that round (half a small call's time): a rank that breaks the contract sends
blocks at other offsets and lengths than its peers expect, and every rank's call fails
(each chunk's offset and length are checked, then the outcome round), never a wrong result.
So does a call where some ranks pass split sizes and others none (legal for gloo): the
error then says to pass them on every rank or on none (`MIXED_SPLITS`).

On the rank path (decision record 0040) the inputs are written straight into the rank's
work buffer in job order and the outputs read straight out of it: one copy in, one out, as
few as a single work buffer allows. Through the agent, the blocks go in one padded array.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from oddl.common.errors import CallsDiffer, CollectiveError
from oddl.torch.channel import Channel, UnsupportedCollective, count
from oddl.torch.in_rank import RankPath
from oddl.torch.native import Ranks, rank_path_of, raw, store

__all__ = ["MIXED_SPLITS", "all_to_all"]

MIXED_SPLITS = ("if some ranks pass split sizes and others none, pass them on every rank or "
                "on none: without them the block sizes are not summed first")
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
    sizes = {a.size for a in arrays} | {o.numel() for o in outs}
    with _hinted(what):
        if even and len(sizes) == 1:
            cap = sizes.pop()
        else:
            cap = _largest_block(ch, me, arrays, outs, what)
        count(what, optical=world * cap * dtype.itemsize)
        if cap == 0:
            return
        got = _in_rank(rank_path_of(ch), ranks, arrays, cap, dtype)
        if got is None:
            blocks = np.zeros((world, cap), dtype=dtype)
            for j, a in enumerate(arrays):
                blocks[ranks.job(j), :a.size] = a
            got = ch.client.all_to_all(blocks, job=ch.job)
    for i, o in enumerate(outs):
        store(o, got[ranks.job(i), :o.numel()])


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
        if sizes[i, me] != outs[i].numel():
            raise CollectiveError(f"{what}: rank {i} sends {sizes[i, me]} elements to rank "
                                  f"{me}, which expects {outs[i].numel()}")
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
