"""One rank of the rank-path tests: `python tests/workers/rank_path_worker.py SCENARIO`.

Started four times by tests/top/test_rank_path.py with torchrun's environment and
ODDL_LOCAL_API, on a testbed with direct links and a job on the ideal network (decision record
0040); joins `init_process_group("oddl")`, runs the scenario and prints one JSON line.
- ``exact``: all-reduces of several sizes, dtypes and reductions (integers, exact in every
  dtype), then all-gathers (into one tensor and into a list), reduce-scatters and broadcasts,
  and what the agent counted meanwhile; each result reported as its fingerprint
  (tests/support/fingerprints.py), which the test compares with the expected values';
- ``one-declines``: rank 1 runs with ODDL_IN_RANK=0, so no rank takes the lease;
- ``crash``: rank 3 leaves (os._exit) before the third all-reduce; the others report how
  their call ended and how long it took;
- ``broken-contract``: an `all_to_all_single` without split sizes where rank 3's blocks are
  longer than the others' (c10d's contract broken); every rank reports how its call ended;
- ``mixed-splits``: an even `all_to_all_single` where rank 0 passes no split sizes and the
  others pass them; every rank reports how its call ended.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import oddl.torch.backend  # noqa: F401  (registers the backend)
import oddl.torch.channel as oc
from oddl.torch.native import raw

sys.path.append(str(Path(__file__).resolve().parents[1] / "support"))
from fingerprints import fingerprint  # noqa: E402  (tests/support, beside this folder)

SIZES = (1, 7, 1000, 300_001)
"""Elements: one, an odd few, small, and more than one 1 MB chunk of float32 per step."""
KIND_SIZES = (1, 1000, 300_001)
"""Elements per rank of the all-gathers, reduce-scatters and broadcasts."""
KIND_DTYPES = (torch.int64, torch.float32, torch.bfloat16)


def _fp(t: torch.Tensor) -> dict[str, Any]:
    """What the rank reports of a result: its fingerprint as float32 (not its values)."""
    return fingerprint(t.float().numpy())


def inputs(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s tensor: integers, exact in every dtype used."""
    g = np.random.default_rng(300 + rank + n)
    return torch.from_numpy(g.integers(-100, 100, n)).to(dtype)


def _agent_done(channel: oc.Channel) -> int:
    return int(channel.client.status().get("collectives_done", -1))


def _in_ranks(channel: oc.Channel) -> int:
    return int(channel.client.status()["collectives_in_ranks"]["done"])


def _reported(channel: oc.Channel, want: int, within_s: float = 60.0) -> int:
    """The rank-path calls the agent heard of, once they reach `want` (or the deadline)."""
    deadline = time.monotonic() + within_s
    while (got := _in_ranks(channel)) < want and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


def exact(rank: int) -> dict[str, Any]:
    channel = oc._channel
    assert channel is not None
    out: dict[str, Any] = {"leased": channel.rank_path is not None,
                           "auth": type(channel.rank_path.link.auth).__name__
                           if channel.rank_path else "",
                           "agent_done_before": _agent_done(channel),
                           "in_ranks_before": _in_ranks(channel), "results": {}}
    for n in SIZES:
        for dtype, op in ((torch.int64, "SUM"), (torch.float32, "SUM"), (torch.float64, "MAX"),
                          (torch.float32, "AVG"), (torch.bfloat16, "SUM")):
            t = inputs(rank, n, dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            out["results"][f"{n}/{dtype}/{op}"] = _fp(t)
    strided = inputs(rank, 2000, torch.float32)[::2]  # not contiguous: a copy goes and returns
    dist.all_reduce(strided)
    out["results"]["strided"] = _fp(strided)
    out["calls"] = len(SIZES) * 5 + 1 + other_kinds(rank, out["results"]) \
        + complex_exchanges(rank, out["results"])
    out["agent_done_after"] = _agent_done(channel)
    out["rank_path_calls"] = calls = channel.rank_path.calls if channel.rank_path else 0
    out["in_ranks_after"] = _reported(channel, out["in_ranks_before"] + calls)
    return out


def other_kinds(rank: int, results: dict[str, Any]) -> int:
    """All-gathers, reduce-scatters, broadcasts, all-to-alls and barriers of `KIND_SIZES` x
    `KIND_DTYPES` into `results`; how many calls they made."""
    world, calls = dist.get_world_size(), 0
    # through the agents, an all-to-all of lists or with split sizes sums its sizes first
    sizes_round = int(oc._channel is None or oc._channel.rank_path is None)
    for n in KIND_SIZES:
        for dtype in KIND_DTYPES:
            mine, tag = inputs(rank, n, dtype), f"{n}/{dtype}"
            whole = torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(whole, mine)  # straight into the output's memory
            listed = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(listed, mine)  # straight into the list's tensors
            results[f"gather-list-work-buffers/{tag}"] = _work_buffers("all_gather", mine, n)
            results[f"gather/{tag}"] = _fp(whole)
            results[f"gather-list/{tag}"] = _fp(torch.cat(listed))
            blocks = inputs(rank, world * n, dtype)
            kept = blocks.clone()
            for op in ("SUM", "MAX") if dtype != torch.int64 else ("SUM",):
                part = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(part, blocks, op=getattr(dist.ReduceOp, op))
                results[f"scatter/{tag}/{op}"] = _fp(part)
                calls += 1
            results[f"scatter-input-kept/{tag}"] = bool(torch.equal(blocks, kept))
            dist.broadcast(mine, src=2)
            results[f"broadcast/{tag}"] = _fp(mine)
            # block j to rank j, uneven: rank r sends j + 1 rows of n to rank j (each block
            # at its own size: no sizes summed first)
            ins = [inputs(rank, (j + 1) * n, dtype) for j in range(world)]
            outs = [torch.empty((rank + 1) * n, dtype=dtype) for _ in range(world)]
            dist.all_to_all(outs, ins)
            results[f"all_to_all/{tag}"] = [_fp(o) for o in outs]
            # block j to rank j, even (all_to_all_single without split sizes: no sizes sum),
            # straight from the input's blocks into the output's; then the same in lists
            single = torch.empty(world * n, dtype=dtype)
            dist.all_to_all_single(single, blocks)
            results[f"all_to_all_single/{tag}"] = _fp(single)
            listed_out = list(torch.empty(world * n, dtype=dtype).split(n))
            dist.all_to_all(listed_out, list(blocks.split(n)))
            results[f"all_to_all-even/{tag}"] = _fp(torch.cat(listed_out))
            results[f"all_to_all-work-buffers/{tag}"] = _work_buffers("all_to_all", blocks, n)
            # in place: the output is the input, so the blocks go through the work buffer
            same = blocks.clone()
            dist.all_to_all_single(same, same)
            results[f"all_to_all_single-in-place/{tag}"] = _fp(same)
            # split sizes with empty blocks: rank r sends (j + r) % world rows of n to rank j
            rows_to = [(j + rank) % world * n for j in range(world)]
            rows_from = [(rank + i) % world * n for i in range(world)]
            split_in = inputs(rank, sum(rows_to), dtype)
            split_out = torch.empty(sum(rows_from), dtype=dtype)
            dist.all_to_all_single(split_out, split_in, rows_from, rows_to)
            results[f"all_to_all_single-splits/{tag}"] = _fp(split_out)
            dist.barrier()
            calls += 3 + 1 + 1 + 1 + 1 + 1 + 1 + 3 * sizes_round
    return calls


def complex_exchanges(rank: int, results: dict[str, Any]) -> int:
    """complex64 all-to-alls (each number travels as two reals): even, with split sizes and
    in lists; whether each got every rank's blocks exactly, into `results`; the calls made."""
    world, n = dist.get_world_size(), 5

    def of(r: int, m: int) -> torch.Tensor:
        return torch.complex(inputs(r, m, torch.float32), inputs(r + 50, m, torch.float32))

    single = torch.empty(world * n, dtype=torch.complex64)
    dist.all_to_all_single(single, of(rank, world * n))
    want = torch.cat([of(i, world * n)[rank * n:(rank + 1) * n] for i in range(world)])
    results["complex/single"] = bool(torch.equal(single, want))
    sizes = [j + 1 for j in range(world)]  # rank r sends j + 1 numbers to rank j
    split = torch.empty(world * (rank + 1), dtype=torch.complex64)
    dist.all_to_all_single(split, of(rank, sum(sizes)), [rank + 1] * world, sizes)
    want = torch.cat([of(i, sum(sizes))[sum(sizes[:rank]):sum(sizes[:rank + 1])]
                      for i in range(world)])
    results["complex/splits"] = bool(torch.equal(split, want))
    outs = [torch.empty(rank + 1, dtype=torch.complex64) for _ in range(world)]
    dist.all_to_all(outs, list(of(rank, sum(sizes)).split(sizes)))
    results["complex/list"] = bool(torch.equal(torch.cat(outs), want))
    sizes_round = int(oc._channel is None or oc._channel.rank_path is None)
    return 3 + 2 * sizes_round


def _work_buffers(kind: str, like: torch.Tensor, n: int) -> list[list[int]]:
    """The work buffers for calls of `kind` of blocks of `n` elements of `like`'s dtype this
    rank's path kept: none where the blocks went straight between the call's tensors."""
    path = oc._channel.rank_path if oc._channel else None
    dtype = raw(like, kind).dtype.str
    return [list(shape) for shape, kept in path.kept(kind)
            if shape[-1] == n and kept == dtype] if path else []


def crash(rank: int) -> dict[str, Any]:
    channel = oc._channel
    assert channel is not None
    t = torch.ones(300_001)
    for _ in range(2):
        dist.all_reduce(t)
    if rank == 3:
        print(json.dumps({"rank": rank, "left": True}), flush=True)
        os._exit(0)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        error = ""
    except Exception as exc:  # what the caller sees
        error = f"{type(exc).__name__}: {exc}"
    return {"leased": channel.rank_path is not None, "error": error,
            "took_s": time.monotonic() - start}


def broken_contract(rank: int) -> dict[str, Any]:
    return _one_exchange(rank, 5 if rank == 3 else 3, False)


def mixed_splits(rank: int) -> dict[str, Any]:
    return _one_exchange(rank, 3, rank != 0)


def sizes_disagree(rank: int) -> dict[str, Any]:
    """Split sizes whose pairs disagree: rank 1 expects 2 elements from rank 0, which sends
    it 3; rank 3 expects 1 element from rank 2, which sends it none."""
    world = dist.get_world_size()
    to = [3] * world
    got = [3] * world
    if rank == 1:
        got[0] = 2
    if rank == 2:
        to[3] = 0
    if rank == 3:
        got[2] = 1
    start = time.monotonic()
    try:
        dist.all_to_all_single(torch.empty(sum(got)), torch.ones(sum(to)), got, to)
        error = ""
    except Exception as exc:  # what the caller sees
        error = f"{type(exc).__name__}: {exc}"
    return {"leased": oc._channel is not None and oc._channel.rank_path is not None,
            "error": error, "took_s": time.monotonic() - start}


def _one_exchange(rank: int, n: int, with_splits: bool) -> dict[str, Any]:
    """One `all_to_all_single` of blocks of `n`; how it ended and how long it took."""
    channel = oc._channel
    assert channel is not None
    world = dist.get_world_size()
    out = torch.empty(world * n)
    splits = [n] * world if with_splits else None
    start = time.monotonic()
    try:
        dist.all_to_all_single(out, torch.arange(world * n, dtype=torch.float32), splits,
                               splits)
        error = ""
    except Exception as exc:  # what the caller sees
        error = f"{type(exc).__name__}: {exc}"
    return {"leased": channel.rank_path is not None, "error": error,
            "took_s": time.monotonic() - start}


SCENARIOS = {"crash": crash, "broken-contract": broken_contract, "mixed-splits": mixed_splits,
             "sizes-disagree": sizes_disagree}
"""The scenarios that end with the group broken (the others run `exact`)."""


def main() -> None:
    scenario = sys.argv[1]
    rank = int(os.environ["RANK"])
    if scenario == "one-declines" and rank == 1:
        os.environ["ODDL_IN_RANK"] = "0"
    torch.set_num_threads(1)
    dist.init_process_group("oddl", timeout=datetime.timedelta(seconds=120))
    try:
        result = SCENARIOS.get(scenario, exact)(rank)
    finally:
        if scenario not in SCENARIOS:
            dist.destroy_process_group()
    print(json.dumps({"rank": rank, **result}), flush=True)
    if scenario in SCENARIOS:
        os._exit(0)  # a peer is gone or the group broken: leave without its goodbyes


if __name__ == "__main__":
    main()
