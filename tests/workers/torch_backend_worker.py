"""One rank of the oddl torch backend tests: `python tests/workers/torch_backend_worker.py SCENARIO`.

Started four times by tests/top/test_torch_backend.py with torchrun's environment (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and ODDL_LOCAL_API; joins `init_process_group("oddl")`,
runs the scenario and prints one JSON line of results (tensors as lists) for the test to check
against values it computes itself.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import oddl.torch.backend as ob


def inputs(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s test tensor: integers (exact in every dtype used)."""
    g = np.random.default_rng(100 + rank)
    return torch.from_numpy(g.integers(-1000, 1000, n)).to(dtype)


def collectives(rank: int, world: int) -> dict[str, Any]:
    """Every collective the backend carries, plus MAX without and with the fallback."""
    out: dict[str, Any] = {}
    _reductions(rank, world, out)
    _exchanges(rank, world, out)
    _async_and_fallback(rank, world, out)
    return out


def _reductions(rank: int, world: int, out: dict[str, Any]) -> None:
    """all_reduce (sum, avg, empty, non-contiguous), broadcast, all_gather, reduce_scatter,
    reduce."""
    t = inputs(rank, 1000, torch.int64)
    dist.all_reduce(t)
    out["sum_int64"] = t.tolist()
    f = inputs(rank, 333, torch.float32) / 8
    dist.all_reduce(f, op=dist.ReduceOp.AVG)
    out["avg_float32"] = f.tolist()
    empty = torch.empty(0)
    dist.all_reduce(empty)
    out["sum_empty"] = empty.tolist()
    nc = inputs(rank, 12, torch.float64).reshape(3, 4).t()  # not contiguous
    dist.all_reduce(nc)
    out["sum_noncontiguous"] = nc.tolist()
    b = inputs(rank, 50, torch.float32)
    dist.broadcast(b, src=2)
    out["broadcast_from_2"] = b.tolist()
    gathered = [torch.empty(7, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(gathered, inputs(rank, 7, torch.int32))
    out["all_gather"] = [g.tolist() for g in gathered]
    into = torch.empty(world * 5, dtype=torch.float64)
    dist.all_gather_into_tensor(into, inputs(rank, 5, torch.float64))
    out["all_gather_into_tensor"] = into.tolist()
    # a reused output, its input a view of this rank's slot (as FSDP lays them out): from
    # the second call it is gathered in its own memory, moved into shared memory (no copy)
    n = 100_000  # 400 kB a slot, above the promotion threshold
    big = torch.empty(world * n, dtype=torch.float32)
    for k in range(3):
        big[rank * n:(rank + 1) * n] = rank + 10.0 * k
        dist.all_gather_into_tensor(big, big[rank * n:(rank + 1) * n])
    out["reused_gather_shared"] = big.untyped_storage().is_shared()
    out["reused_gather_firsts"] = big[::n].tolist()
    rs = torch.empty(6, dtype=torch.int64)
    dist.reduce_scatter(rs, list(inputs(rank, 6 * world, torch.int64).chunk(world)))
    out["reduce_scatter"] = rs.tolist()
    rst = torch.empty(6, dtype=torch.float32)
    dist.reduce_scatter_tensor(rst, inputs(rank, 6 * world, torch.float32))
    out["reduce_scatter_tensor"] = rst.tolist()
    red = inputs(rank, 8, torch.int64)
    dist.reduce(red, dst=1)
    out["reduce_to_1"] = red.tolist() if rank == 1 else None


def _exchanges(rank: int, world: int, out: dict[str, Any]) -> None:
    """gather, scatter, all_to_all_single, uneven all_to_all, a bfloat16 broadcast."""
    got = [torch.empty(3, dtype=torch.int64) for _ in range(world)] if rank == 0 else None
    dist.gather(inputs(rank, 3, torch.int64), got, dst=0)
    out["gather_to_0"] = [g.tolist() for g in got] if got is not None else None
    mine = torch.empty(2, dtype=torch.float64)
    parts = [torch.full((2,), 10.0 * j) for j in range(world)] if rank == 3 else None
    dist.scatter(mine, [p.double() for p in parts] if parts else None, src=3)
    out["scatter_from_3"] = mine.tolist()
    half = torch.full((5,), 1.5 + rank, dtype=torch.bfloat16)  # numpy has no bfloat16
    dist.broadcast(half, src=1)
    out["broadcast_bf16"] = half.float().tolist()
    dist.barrier()
    a2a = torch.empty(world * 3, dtype=torch.int64)
    dist.all_to_all_single(a2a, torch.arange(world * 3, dtype=torch.int64) + 100 * rank)
    out["all_to_all_single"] = a2a.tolist()
    # uneven: rank r sends j+1 elements to rank j, valued 1000·r + j
    ins = [torch.full((j + 1,), 1000 * rank + j, dtype=torch.int64) for j in range(world)]
    outs = [torch.empty(rank + 1, dtype=torch.int64) for _ in range(world)]
    dist.all_to_all(outs, ins)
    out["all_to_all_uneven"] = [o.tolist() for o in outs]


def _async_and_fallback(rank: int, world: int, out: dict[str, Any]) -> None:
    """Calls in flight and futures; MAX refused, then carried by the gloo fallback."""
    # async: three calls in flight, then wait; and a future
    xs = [inputs(rank, 100, torch.int64) + k for k in range(3)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    out["async_wait"] = [w.wait() for w in works]
    out["async_sums"] = [x.tolist() for x in xs]
    y = inputs(rank, 10, torch.int64)
    fut = dist.all_reduce(y, async_op=True).get_future()
    out["future_value"] = fut.wait()[0].tolist()
    out["future_done"] = fut.done()
    # MAX: the agent's reduction, no fallback
    m = inputs(rank, 9, torch.float32)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    out["max_native"] = m.tolist()
    # bfloat16: reduced as float32 by the agent, rounded once
    bf = torch.tensor([0.5 + rank, 1.0, -2.0 * rank], dtype=torch.bfloat16)
    dist.all_reduce(bf)
    out["sum_bf16"] = bf.float().tolist()
    # and its reduce-scatter (FSDP's with a bfloat16 reduce dtype), the same way
    bf_rs = torch.empty(2, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(bf_rs, torch.arange(2.0 * world, dtype=torch.bfloat16) + rank)
    out["reduce_scatter_bf16"] = bf_rs.float().tolist()
    out["counters_before_fallback"] = ob.counters()
    # point-to-point natively, as flows: every rank posts its receive first (a ring exchange,
    # which deadlocks if a receive holds up the rank's send)
    got = torch.empty(4, dtype=torch.int64)
    work = dist.irecv(got, (rank - 1) % world)
    dist.send(torch.full((4,), rank, dtype=torch.int64), (rank + 1) % world)
    work.wait()
    out["recv_from_left"] = got.tolist()
    # any dtype, into a non-contiguous tensor, on a tag of its own
    target = torch.zeros(3, 2, dtype=torch.bfloat16)[:, 0]
    work = dist.irecv(target, (rank + 1) % world, tag=7)
    dist.isend(torch.full((3,), 1.5 + rank, dtype=torch.bfloat16), (rank - 1) % world,
               tag=7).wait()
    work.wait()
    out["recv_bf16_from_right"] = target.float().tolist()
    # rank 0 receives from any source: every other rank's flow, each naming its sender
    if rank == 0:
        seen = []
        for _ in range(world - 1):
            t = torch.empty(2, dtype=torch.int64)
            seen.append((dist.recv(t, tag=11), t.tolist()))
        out["any_source"] = sorted(seen)
    else:
        dist.send(torch.full((2,), 100 + rank, dtype=torch.int64), 0, tag=11)
    out["counters"] = ob.counters()


def lists_and_subgroups(rank: int, world: int) -> dict[str, Any]:
    """Coalesced lists (each tensor reduced on its own, in the world and in a subgroup) and
    subgroups (as flows among their members; one on gloo by request, counted)."""
    out: dict[str, Any] = {}
    ins = [inputs(rank, 3, torch.float32), inputs(rank + 10, 5, torch.float32)]
    outs = [[torch.empty(3), torch.empty(5)] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    out["all_gather_coalesced"] = [[t.tolist() for t in per] for per in outs]
    try:  # found wrong on the worker thread: the error reaches the caller's wait()
        dist.all_gather([torch.empty(2) for _ in range(world - 1)], torch.ones(2))
        out["short_gather_error"] = ""
    except Exception as exc:  # reported to the test
        out["short_gather_error"] = f"{type(exc).__name__}: {exc}"
    # small integers: the product of four stays exact in float32
    small = [torch.tensor([rank + 1.0, -2.0, 3.0]), torch.tensor([10.0 * (rank + 1), 1.0])]
    sums = [t.clone() for t in small]
    dist.all_reduce_coalesced(sums)
    out["coalesced_sum"] = [t.tolist() for t in sums]
    for op in ("MAX", "MIN", "PRODUCT"):  # the agent's reductions, each tensor on its own
        got = [t.clone() for t in small]
        dist.all_reduce_coalesced(got, op=getattr(dist.ReduceOp, op))
        out[f"coalesced_{op}"] = [t.tolist() for t in got]
    # subgroups as hybrid sharding makes them: two pairs, and [1, 2] as the suite's tests do
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    middle = dist.new_group([1, 2])
    mine = torch.tensor([float(rank)])
    dist.all_reduce(mine, group=pairs[rank // 2])
    out["pair_sum"] = mine.tolist()
    if rank in (1, 2):
        out.update(_middle_group(rank, middle, small))
    # a subgroup beside, on gloo, when asked
    os.environ["ODDL_TORCH_SUBGROUPS"] = "gloo"
    beside = dist.new_group([0, 3])
    del os.environ["ODDL_TORCH_SUBGROUPS"]
    if rank in (0, 3):
        one = torch.ones(1)
        dist.all_reduce(one, group=beside)
        out["beside_sum"] = one.tolist()
    out["counters"] = ob.counters()
    return out


def _middle_group(rank: int, middle: Any, small: list[torch.Tensor]) -> dict[str, Any]:
    """The subgroup of ranks [1, 2]: its collectives and point-to-point, all as flows."""
    out: dict[str, Any] = {}
    gathered = [torch.empty(2, dtype=torch.int64) for _ in range(2)]
    dist.all_gather(gathered, torch.full((2,), rank, dtype=torch.int64), group=middle)
    out["middle_gather"] = [g.tolist() for g in gathered]
    into = torch.empty(4, dtype=torch.int64)
    dist.all_gather_into_tensor(into, torch.full((2,), rank, dtype=torch.int64), group=middle)
    out["middle_gather_into"] = into.tolist()
    dist.barrier(group=middle)  # c10d passes barrier's options by keyword
    got = [t.clone() for t in small]  # each tensor reduced on its own here too
    dist.all_reduce_coalesced(got, op=dist.ReduceOp.MAX, group=middle)
    out["middle_coalesced_max"] = [t.tolist() for t in got]
    # more of the group's collectives, all as flows among its two members
    b = torch.full((3,), float(rank)) if rank == 2 else torch.zeros(3)
    dist.broadcast(b, src=2, group=middle)
    out["middle_broadcast"] = b.tolist()
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.arange(4.0) * rank, group=middle)
    out["middle_reduce_scatter"] = rs.tolist()
    sizes = [1, 2] if rank == 1 else [3, 1]  # uneven: rank 1 sends 1 to itself, 2 to rank 2
    a2a = torch.empty(sum([1, 3] if rank == 1 else [2, 1]), dtype=torch.int64)
    dist.all_to_all_single(a2a, torch.full((sum(sizes),), rank, dtype=torch.int64),
                           [1, 3] if rank == 1 else [2, 1], sizes, group=middle)
    out["middle_all_to_all"] = a2a.tolist()
    # point-to-point in the group, addressed by global rank as c10d does
    peer = 2 if rank == 1 else 1
    got_p2p = torch.empty(2, dtype=torch.int64)
    work = dist.irecv(got_p2p, peer, group=middle)
    dist.send(torch.full((2,), 10 * rank, dtype=torch.int64), peer, group=middle)
    work.wait()
    out["middle_p2p"] = got_p2p.tolist()
    return out


def _digits() -> dict[str, np.ndarray]:
    from oddl.demo.train_worker import load_digits_split

    return load_digits_split()


def _train(model: torch.nn.Module, wrapped: torch.nn.Module, data: dict[str, np.ndarray],
           rank: int, world: int, epochs: int, seed: int) -> dict[str, Any]:
    """Train `wrapped` (the DDP or FSDP view of `model`) on this rank's share of digits."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    ds = TensorDataset(torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"]))
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(ds, batch_size=32, sampler=sampler)
    opt = torch.optim.Adam(wrapped.parameters(), lr=0.01)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(wrapped(x), y)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(y)
        losses.append(total / len(sampler))
    x_te, y_te = torch.from_numpy(data["x_test"]), torch.from_numpy(data["y_test"])
    with torch.no_grad():
        acc = float((wrapped(x_te).argmax(1) == y_te).float().mean())
    return {"losses": losses, "accuracy": acc}


def training(rank: int, world: int) -> dict[str, Any]:
    """DDP (no hook) and fully_shard, each over oddl and over gloo from the same seed."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from oddl.demo.train_worker import build_model, param_digest

    data = _digits()
    gloo = dist.new_group(backend="gloo")
    seed, epochs = 7, 2
    out: dict[str, Any] = {}
    for name, group in (("oddl", None), ("gloo", gloo)):
        torch.manual_seed(seed)
        model = build_model()
        ob.reset_counters()
        ddp = DistributedDataParallel(model, process_group=group)
        out[f"ddp_{name}"] = {**_train(model, ddp, data, rank, world, epochs, seed),
                              "digest": param_digest(model), "counters": ob.counters()}
    for name, group in (("oddl", dist.group.WORLD), ("gloo", gloo)):
        torch.manual_seed(seed)
        model = build_model()
        ob.reset_counters()
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if any(p.requires_grad for p in layer.parameters(recurse=False)):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        result = _train(model, model, data, rank, world, epochs, seed)
        out[f"fsdp_{name}"] = {**result, "counters": ob.counters()}
    return out


def main() -> int:
    scenario = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("oddl", timeout=datetime.timedelta(seconds=60))
    try:
        result = {"collectives": collectives, "training": training,
                  "lists_and_subgroups": lists_and_subgroups}[scenario](rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print(json.dumps({"rank": rank, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
