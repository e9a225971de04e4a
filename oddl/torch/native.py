"""The oddl torch backend's collectives as the agent's native ones (`AgentClient.all_gather`,
`reduce_scatter`, `broadcast`, `gather`, `scatter`, `allreduce(op=...)`; the all-to-all is
`oddl.torch.all_to_all`).

Each function runs on the channel's worker thread, reads the torch tensors as numpy arrays,
makes one native call and writes the result into the output tensors, counting the bytes handed to the agent. The agent orders blocks by job rank (the
job's node order); c10d by group rank: `Ranks` maps one to the other (the identity when
rank r runs on the job's r-th node, as the launchers start them).

Collectives that only move bytes (gather, broadcast, all-to-all, scatter) carry any dtype:
one numpy has no type for (bfloat16, bool, complex) travels as the unsigned integer of its
width. Reductions reduce what gloo reduces, exactly as gloo does (`oddl.torch.dtypes`: bool
as uint8, complex as its real view, bfloat16 as float32). A 0-d tensor is one element.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.collective.memory import Memory
from oddl.torch.adopt import array_of
from oddl.torch.channel import Channel, UnsupportedCollective, as_numpy, count
from oddl.torch.dtypes import (
    BOOL_OPS,
    COMPLEX_OPS,
    at_least_1d,
    average,
    check_reduction,
    numpy_reducible,
)
from oddl.torch.in_rank import RankPath

__all__ = ["OPS", "Ranks", "reduce_name", "all_gather", "all_gather_into", "broadcast", "gather",
           "in_place", "rank_path_of", "raw", "recv", "recv_any", "reduce_", "reduce_scatter",
           "rows", "scatter", "send", "store"]

# torch's reduction name -> the agent's op (AVG is a sum divided by the world size,
# integers truncated toward zero: oddl.torch.dtypes.average)
OPS = {"SUM": "sum", "AVG": "sum", "MIN": "min", "MAX": "max", "PRODUCT": "prod",
       "BAND": "band", "BOR": "bor", "BXOR": "bxor"}
_UINT = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


class Ranks:
    """Group rank r runs on job rank `to_job[r]` (learned at the handshake)."""

    def __init__(self, to_job: list[int]):
        self.to_job = to_job
        self.from_job = sorted(range(len(to_job)), key=to_job.__getitem__)  # the inverse
        self.identity = to_job == list(range(len(to_job)))

    def job(self, rank: int) -> int:
        return self.to_job[rank]

    def to_job_order(self, blocks: np.ndarray) -> np.ndarray:
        """(world, ...) blocks indexed by group rank -> indexed by job rank."""
        return blocks if self.identity else blocks[self.from_job]

    def copy_to_job_order(self, blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
        """`to_job_order(blocks)` written into `out`: one copy, also when reordering."""
        for job_rank, group_rank in enumerate(self.from_job):
            out[job_rank] = blocks[group_rank]
        return out

    def to_group_order(self, blocks: np.ndarray) -> np.ndarray:
        """(world, ...) blocks indexed by job rank -> indexed by group rank."""
        return blocks if self.identity else blocks[self.to_job]


def raw(t: torch.Tensor, what: str) -> np.ndarray:
    """A numpy view of `t` (contiguous: a copy if it is not; a 0-d tensor as one element) for
    a collective that only moves bytes: any dtype, those numpy lacks as the unsigned integer
    of the same width."""
    c = _numpy_typed(t.detach().contiguous())
    if c.device.type != "cpu":
        return as_numpy(c, what)  # refused, naming the fix
    # unlike `Tensor.numpy()`, a view that leaves the storage resizable: an input that is a
    # view of a reused output (FSDP's all-gather) must not keep that output from promotion
    return at_least_1d(array_of(c))


def _numpy_typed(c: torch.Tensor) -> torch.Tensor:
    """`c` as a dtype numpy has: complex as its real view, the rest numpy lacks as the
    unsigned integer of the same width."""
    if c.is_complex():
        c = torch.view_as_real(c)
    if c.dtype in (torch.bfloat16, torch.bool) or c.dtype.is_floating_point and c.dtype not in (
            torch.float16, torch.float32, torch.float64):
        c = c.view(_UINT[c.element_size()])
    return c


def in_place(result: np.ndarray, t: torch.Tensor) -> bool:
    """Whether the agent's `result` already lies in `t`'s memory."""
    return t.is_contiguous() and result.__array_interface__["data"][0] == t.data_ptr()


def store(out: torch.Tensor, values: np.ndarray) -> None:
    """Write `values` (raw or numeric, any shape of out's size) into `out`."""
    dst = out
    if dst.is_complex():
        dst = torch.view_as_real(dst)
    src = torch.from_numpy(np.ascontiguousarray(values))
    if src.dtype != dst.dtype:
        src = src.view(dst.dtype)
    dst.copy_(src.reshape(dst.shape))


def rows(t: torch.Tensor, sizes: list[int], world: int, what: str) -> list[torch.Tensor]:
    """`t` split along its first dimension by `sizes` (equal parts when empty)."""
    if not sizes:
        if t.shape[0] % world:
            raise UnsupportedCollective(f"{what}: {t.shape[0]} rows, not a multiple of the "
                                        f"world {world}")
        sizes = [t.shape[0] // world] * world
    return list(torch.split(t, list(sizes), dim=0))


def reduce_name(what: str, opts: Any) -> str:
    """The name of `opts`' reduction; one the agent has no counterpart for is refused
    (PREMUL_SUM, NCCL's scaled sum, which gloo refuses too)."""
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    name = next((n for n in OPS if op == getattr(dist.ReduceOp, n)),
                str(getattr(op, "op", op)).rsplit(".", 1)[-1])
    if name not in OPS:
        raise UnsupportedCollective(f"{what}({name}): the agent reduces with "
                                    f"{', '.join(OPS)}; not {name}")
    return name


def reduce_(ch: Channel, t: torch.Tensor, name: str, world: int, what: str,
            fallback: Any = None) -> None:
    """All-reduce `t` in place with torch's reduction `name`, as gloo does (`oddl.torch.dtypes`:
    bool as uint8, complex SUM and AVG as its real view). bfloat16 is reduced as float32 (every
    bfloat16 is a float32; the result, the same on every rank, is rounded once). A dtype the
    agent cannot reduce goes to `fallback` (ODDL_TORCH_FALLBACK=gloo), counted, or is refused
    naming the fix, before anything is sent."""
    check_reduction(t, name, what, fallback is not None)
    if t.dtype == torch.bool:
        flags = t.to(torch.uint8)  # 0 or 1 each
        reduce_(ch, flags, BOOL_OPS[name], world, f"{what} (bool as uint8)")
        t.copy_(flags)
        return
    if t.is_complex() and name in COMPLEX_OPS:
        reduce_(ch, torch.view_as_real(t), "SUM", world, f"{what} ({t.dtype} as real pairs)")
        if name == "AVG":
            average(t, world)
        return
    if t.dtype == torch.bfloat16:
        wide = t.float()
        reduce_(ch, wide, name, world, f"{what} (bfloat16 as float32)")
        t.copy_(wide)
        return
    if not numpy_reducible(t.dtype):  # check_reduction let it through: the fallback takes it
        opts = dist.AllreduceOptions()
        opts.reduceOp = getattr(dist.ReduceOp, name)
        fallback.allreduce([t], opts).wait()
        count(f"{what}({name}) (fallback)", fallback=t.numel() * t.element_size())
        return
    path = rank_path_of(ch)
    a = as_numpy(t, what, promote=path is None)  # the rank path needs no shared memory
    if a.size:
        if path is not None and path.run(a, "all_reduce", OPS[name]):
            res = a
        else:
            res = ch.client.allreduce(a, op=OPS[name], job=ch.job, out=a)
        if not in_place(res, t):  # `a` was a contiguous copy
            store(t, res)
    if name == "AVG":
        average(t, world)
    count(f"{what}({name})", optical=a.nbytes)


def rank_path_of(ch: Channel) -> RankPath | None:
    """The group's rank path: the world group's, if its ranks leased it (decision record
    0040); its calls lay their work buffer out in job order, as the agent's client does."""
    return getattr(ch, "rank_path", None)


def broadcast(ch: Channel, ranks: Ranks, t: torch.Tensor, root: int) -> None:
    a = raw(t, "broadcast")
    if a.size:
        path = rank_path_of(ch)
        if path is not None and a.flags.writeable and path.run(a, "broadcast",
                                                               root=ranks.job(root)):
            res = a
        else:
            res = ch.client.broadcast(a, root=ranks.job(root), job=ch.job)
        if not in_place(res, t):
            store(t, res)
    count("broadcast", optical=a.nbytes)


def all_gather(ch: Channel, ranks: Ranks, flat_in: np.ndarray, what: str) -> np.ndarray:
    """(world, n): row r is group rank r's `flat_in`."""
    count(what, optical=flat_in.nbytes * len(ranks.to_job))
    if flat_in.size == 0:
        return np.empty((len(ranks.to_job), 0), flat_in.dtype)
    path = rank_path_of(ch)
    if path is not None:
        work = path.scratch("all_gather", (len(ranks.to_job), flat_in.size), flat_in.dtype)
        work[path.rank] = flat_in
        if path.run(work, "all_gather"):
            return ranks.to_group_order(work)
    return ranks.to_group_order(ch.client.all_gather(flat_in, job=ch.job))


def own_view(t: torch.Tensor, what: str) -> np.ndarray | None:
    """A flat numpy view of `t`'s own memory, into which a collective may write its result
    straight: for a contiguous tensor in this process's memory; None for any other."""
    if t.device.type != "cpu" or not t.is_contiguous():
        return None
    view = raw(t, what).reshape(-1)
    return view if in_place(view, t) else None


def all_gather_apart(ch: Channel, ranks: Ranks, outs: list[torch.Tensor], t: torch.Tensor,
                     what: str) -> bool:
    """Every group rank's `t` into `outs` (`dist.all_gather`'s list), straight into the
    outputs' memory on the rank path (the all-gather's buffer held by the outputs
    themselves, `Memory.apart`: no work buffer, no copy out) when each is a contiguous
    tensor of the process's memory of `t`'s size and no two share memory; False, with
    nothing sent, where not (or where the agent keeps the call)."""
    path = rank_path_of(ch)
    flat = raw(t, what).reshape(-1)
    if path is None or flat.size == 0 or len(outs) != len(ranks.to_job):
        return False
    views = []
    for o in outs:
        view = own_view(o, what)
        if view is None or view.size != flat.size or view.dtype != flat.dtype:
            return False
        views.append(view)
    if overlap(views):
        return False
    views[ranks.from_job[path.rank]][...] = flat  # this rank's own block, in place
    n = flat.size
    if not path.run(Memory.apart([(ranks.job(r) * n, v) for r, v in enumerate(views)]),
                    "all_gather"):
        return False
    count(what, optical=flat.nbytes * len(views))
    return True


def overlap(first: list[np.ndarray], second: list[np.ndarray] | None = None) -> bool:
    """Whether an array of `first` shares a byte with one of `second` (None: with another
    array of `first`)."""
    sides = (first,) if second is None else (first, second)
    spans = sorted((a.__array_interface__["data"][0], a.nbytes, side)
                   for side, arrays in enumerate(sides) for a in arrays if a.nbytes)
    reach = [0, 0]  # the furthest byte each side's spans reach so far
    for start, nbytes, side in spans:
        if start < reach[side if second is None else 1 - side]:
            return True
        reach[side] = max(reach[side], start + nbytes)
    return False


def all_gather_into(ch: Channel, ranks: Ranks, output: torch.Tensor, input: torch.Tensor,
                    what: str) -> None:
    """Every group rank's `input` into `output`, block r from rank r. Straight into output's
    memory when it is contiguous and the group's ranks are the job's (no copy of the whole
    output), and for a reused output in that memory itself, moved into shared memory
    (`torch_adopt`): before anything takes a view of `input`, which may lie inside it (FSDP
    lays its all-gather input out in the output) and moves with it."""
    world = len(ranks.to_job)
    direct = ranks.identity and output.is_contiguous() and output.device.type == "cpu" \
        and input.numel() > 0
    path = rank_path_of(ch)
    if direct and path is None and ch.promoter is not None and ch.promoter.enabled:
        ch.promoter.before_in_place(output)  # none in a subgroup, none needed on the rank path
    flat = raw(input, what).reshape(-1)
    if direct:
        out = raw(output, what).reshape(world, -1)
        if out.dtype == flat.dtype and out.shape[1] == flat.size:
            count(what, optical=flat.nbytes * world)
            if path is not None:  # the rank gathers straight into output's memory
                out[path.rank] = flat  # (nothing to do where the input lies there: FSDP)
                if path.run(out, "all_gather"):
                    return
            ch.client.all_gather(flat, out=out, job=ch.job)  # `out` is output's memory
            return
    store(output, all_gather(ch, ranks, flat, what))


def reduce_scatter(ch: Channel, ranks: Ranks, blocks: torch.Tensor, name: str,
                   out: torch.Tensor, what: str) -> None:
    """`blocks` (world, n) by group rank: this rank's block of their reduction into `out`.
    Every dtype as the all-reduce takes it (`reduce_`): bfloat16 as float32, rounded once;
    bool as uint8; complex SUM and AVG as its real view."""
    if blocks.dtype != out.dtype:
        raise UnsupportedCollective(f"{what}: input {blocks.dtype}, output {out.dtype}; give "
                                    "both one dtype")
    check_reduction(out, name, what)
    world = len(ranks.to_job)
    if out.dtype == torch.bool:
        flags = torch.empty(out.shape, dtype=torch.uint8)
        reduce_scatter(ch, ranks, blocks.to(torch.uint8), BOOL_OPS[name], flags,
                       f"{what} (bool as uint8)")
        out.copy_(flags)
        return
    if out.is_complex():
        reduce_scatter(ch, ranks, torch.view_as_real(blocks).reshape(world, -1), "SUM",
                       torch.view_as_real(out), f"{what} ({out.dtype} as real pairs)")
        if name == "AVG":
            average(out, world)
        return
    if out.dtype == torch.bfloat16:
        wide = torch.empty(out.shape, dtype=torch.float32)
        reduce_scatter(ch, ranks, blocks.float(), name, wide, f"{what} (bfloat16 as float32)")
        out.copy_(wide)
        return
    a = as_numpy(blocks, what)
    count(f"{what}({name})", optical=a.nbytes)
    if a.size == 0:
        return
    mine = _reduce_scatter_in_rank(rank_path_of(ch), ranks, a, OPS[name])
    if mine is None:
        mine = ch.client.reduce_scatter(ranks.to_job_order(a), op=OPS[name], job=ch.job)
    store(out, mine)
    if name == "AVG":
        average(out, world)


def _reduce_scatter_in_rank(path: RankPath | None, ranks: Ranks, a: np.ndarray, op: str
                            ) -> np.ndarray | None:
    """This rank's reduced block of `a` (world, n) by group rank, reduced on the rank path in
    a copy (`a` stays as it was); None where the agent reduces it."""
    if path is None:
        return None
    work = ranks.copy_to_job_order(a, path.scratch("reduce_scatter", a.shape, a.dtype))
    return work[path.rank] if path.run(work, "reduce_scatter", op) else None


def gather(ch: Channel, ranks: Ranks, me: int, t: torch.Tensor, root: int,
           outs: list[torch.Tensor]) -> None:
    a = raw(t, "gather").reshape(-1)
    count("gather", optical=a.nbytes)
    if a.size == 0:
        return
    res = ch.client.gather(a, root=ranks.job(root), job=ch.job)
    if me == root:
        assert res is not None  # the root gets the blocks
        for r, o in enumerate(ranks.to_group_order(res)):
            store(outs[r], o)


def scatter(ch: Channel, ranks: Ranks, me: int, out: torch.Tensor, root: int,
            ins: list[torch.Tensor]) -> None:
    mine = raw(out, "scatter").reshape(-1)
    count("scatter", optical=mine.nbytes)
    if mine.size == 0:
        return
    if me == root:
        blocks = np.stack([raw(t, "scatter").reshape(-1) for t in ins])
        res = ch.client.scatter(ranks.to_job_order(blocks), root=ranks.job(root), job=ch.job)
    else:
        res = ch.client.scatter(None, root=ranks.job(root), out=np.empty_like(mine),
                                job=ch.job)
    store(out, res)


def send(channel: Channel, ranks: Ranks, t: torch.Tensor, dst: int, on: tuple[int, str],
         timeout_s: float | None = None) -> None:
    """`t` as a flow to group rank `dst` on (tag, session) `on` (its bytes; any dtype), within
    `timeout_s` (the group's)."""
    a = raw(t, "send")
    if a.nbytes:
        channel.client.send(a, ranks.job(dst), tag=on[0], session=on[1], job=channel.job,
                            timeout_s=timeout_s)
    count("send", optical=a.nbytes)


def recv(client: AgentClient, job: str | None, ranks: Ranks, t: torch.Tensor, src: int,
         on: tuple[int, str], timeout_s: float | None = None) -> None:
    """The next flow from group rank `src` on (tag, session) `on` into `t` (in its memory when
    contiguous), within `timeout_s` (the group's)."""
    a = raw(t, "recv")
    if a.nbytes:
        client.recv(a, ranks.job(src), tag=on[0], session=on[1], job=job, timeout_s=timeout_s)
        if not in_place(a, t):
            store(t, a)
    count("recv", optical=a.nbytes)


def recv_any(client: AgentClient, job: str | None, ranks: Ranks, t: torch.Tensor,
             on: tuple[int, str], timeout_s: float | None = None) -> int:
    """The first flow from any rank on (tag, session) `on` into `t` (within `timeout_s`); the
    group rank it came from."""
    a = raw(t, "recv")
    got, source = client.recv_any(a, tag=on[0], session=on[1], job=job, timeout_s=timeout_s)
    if not in_place(got, t):
        store(t, got)
    count("recv", optical=a.nbytes)
    return ranks.from_job[source]
