"""The rank moving its own bytes (decision record 0040) against the agent path and gloo, in
the same run (issue 36): all-reduce, all-gather, reduce-scatter and all-to-all.

Starts the emulated testbed with direct links and a ring job on its first `--ranks` nodes,
and the rank processes with torchrun's environment. Each joins `init_process_group("oddl")`
and a gloo group of the same ranks (`oddl.torch.in_rank`: the agents lease the data path to
the ranks), and per kind and size S (as nccl-tests counts it: the all-reduce's tensor, the
all-gather's output, the reduce-scatter's and the all-to-all's input) times in alternation, float32, after the
same barrier, `--repeats` times each:
- gloo: the call on the gloo group;
- agent: the call on the oddl group with its rank path set aside (the agent moves the
  bytes, as with ``ODDL_IN_RANK=0``; reused tensors adopted into shared memory);
- in_rank: the call on the rank path: the job's schedule, leased once per size and kind,
  run by the agents' executor and outcome round in the rank, over its own stream link.
The calls are `dist.all_reduce(t)`, `dist.all_gather_into_tensor(whole, block)`,
`dist.reduce_scatter_tensor(block, whole)` and `dist.all_to_all_single(out, whole)`; with
`--kinds` also `dist.all_gather` into a list (`all_gather_list`) and `all_to_all_single`
with equal or skewed split sizes (`all_to_all_splits`, `all_to_all_skewed`: `KINDS`).
Every result is checked exact. Prints rank 0's
medians, the ratios to gloo, the CPU time rank 0's process spent in a gloo call and in a
call on the rank path (all its threads; the agent path's work is in the agent, not counted
there) and the minor page faults it took in each, and what each mode's first call of a size
and kind took over its median (a new tensor: the rank path leases the schedule then, the
agent adopts the tensor's memory).

    python benchmarks/bench_in_rank.py [--sizes-mb 0.004096,1,16,64] [--repeats 9]
        [--ranks 4] [--kinds all_reduce,all_to_all] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench_common import join_oddl_and_gloo, rank_worker_main, ranks_on_direct_links

MODES = ("gloo", "agent", "in_rank")
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_splits",
         "all_to_all_skewed", "all_gather_list")
"""What can be timed; ``all_to_all_splits`` is `all_to_all_single` given (equal) split sizes,
as a mixture-of-experts layer calls it, ``all_to_all_skewed`` the same with uneven ones
(`_skewed`: the largest block 4× the smallest), ``all_gather_list`` `dist.all_gather` into
a list of tensors (the blocks of S)."""
DEFAULT_KINDS = KINDS[:4]
KINDS_ENV = "ODDL_BENCH_KINDS"
"""The kinds the ranks time (comma-separated; `--kinds` sets it for them)."""


def _kinds() -> tuple[str, ...]:
    """The kinds this run times (`KINDS_ENV`, in `KINDS`' order)."""
    import os

    wanted = os.environ.get(KINDS_ENV, ",".join(DEFAULT_KINDS)).split(",")
    unknown = set(wanted) - set(KINDS)
    if unknown:
        raise SystemExit(f"unknown kinds {sorted(unknown)}: choose from {', '.join(KINDS)}")
    return tuple(k for k in KINDS if k in wanted)


def rank_main(sizes_mb: list[float], repeats: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_*, ODDL_LOCAL_API set by the parent)."""
    import torch
    import torch.distributed as dist

    import oddl.torch.channel as oc

    rank, gloo = join_oddl_and_gloo(rank_path=True)
    world = dist.get_world_size()
    channel = oc._channel
    assert channel is not None
    path = channel.rank_path
    if path is None:
        raise SystemExit("the agents did not lease the data path to the ranks (see the "
                         "ranks' log): this benchmark needs direct links, the ideal network")
    out: dict[str, Any] = {"rank": rank, "sizes": {}, "cpu": {}, "faults": {}, "first": {}}
    total = world * (world + 1) / 2

    def call(kind: str, mode: str, whole: torch.Tensor, block: torch.Tensor,
             exchanged: torch.Tensor) -> tuple[float, float, int]:
        (block if kind.startswith("all_gather") else whole).fill_(float(rank + 1))
        channel.rank_path = path if mode == "in_rank" else None  # as users get each
        group = gloo if mode == "gloo" else None
        dist.barrier(group=gloo)
        start, cpu, faults = time.perf_counter(), time.process_time(), _minor_faults()
        _collective(kind, whole, block, exchanged, group)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        faults = _minor_faults() - faults
        _check(kind, mode, exchanged if kind.startswith("all_to_all") else whole, block, world,
               total)
        return took, cpu, faults

    try:
        for mb in sizes_mb:
            n = max(world, int(mb * 1e6) // 4 // world * world)
            for kind in _kinds():
                spare = world * world if kind == "all_to_all_skewed" else 0  # rounding
                tensors = {m: (torch.ones(n), torch.ones(n // world), torch.ones(n + spare))
                           for m in MODES}
                first = {}
                for m in MODES:  # warm-up; the agent's tensor is adopted at its first calls
                    first[m] = call(kind, m, *tensors[m])[0]
                    call(kind, m, *tensors[m])
                times: dict[str, list[tuple[float, float, int]]] = {m: [] for m in MODES}
                for _ in range(repeats):
                    for m in MODES:
                        times[m].append(call(kind, m, *tensors[m]))
                at = f"{kind} {mb}"
                for name, i in (("sizes", 0), ("cpu", 1), ("faults", 2)):
                    out[name][at] = {m: [x[i] for x in v] for m, v in times.items()}
                out["first"][at] = first
                del tensors
        out["rank_path_calls"] = path.calls
    finally:
        channel.rank_path = path
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def _collective(kind: str, whole: Any, block: Any, exchanged: Any, group: Any) -> None:
    """One call of `kind` (the module docstring's) on `group` (None: the oddl world)."""
    import torch.distributed as dist

    if kind == "all_reduce":
        dist.all_reduce(whole, group=group)
    elif kind == "all_gather":
        dist.all_gather_into_tensor(whole, block, group=group)
    elif kind == "all_gather_list":
        dist.all_gather(list(whole.split(block.numel())), block, group=group)
    elif kind == "reduce_scatter":
        dist.reduce_scatter_tensor(block, whole, group=group)
    elif kind == "all_to_all":
        dist.all_to_all_single(exchanged, whole, group=group)
    elif kind == "all_to_all_splits":
        splits = [whole.numel() // dist.get_world_size(group)] * dist.get_world_size(group)
        dist.all_to_all_single(exchanged, whole, splits, splits, group=group)
    else:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        sent = _skewed(whole.numel(), world, rank)
        got = [_skewed(whole.numel(), world, i)[rank] for i in range(world)]
        dist.all_to_all_single(exchanged[:sum(got)], whole, got, sent, group=group)


def _skewed(n: int, world: int, rank: int) -> list[int]:
    """What `rank` sends each rank of its `n` elements in the skewed all-to-all: shares 1, 2,
    ..., world of the sum of them, turned by the rank (a mixture of experts' uneven routing);
    the last rank gets what rounding left."""
    weights = [1 + (j + rank) % world for j in range(world)]
    out = [n * w // sum(weights) for w in weights]
    out[-1] += n - sum(out)
    return out


def _minor_faults() -> int:
    """This process's minor page faults so far (all threads): a call that maps fresh
    buffers pays one per page it touches."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _check(kind: str, mode: str, whole: Any, block: Any, world: int, total: float) -> None:
    """SystemExit unless the call's result is exact (spot checks at both ends and inside)."""
    if kind == "all_to_all_skewed":  # block i from rank i, of the sizes `_skewed` says
        got = [float(whole[0]), float(whole[-1])] if whole.numel() else []
        if got and got[0] != 1.0:
            raise SystemExit(f"{mode} {kind}: got {got[0]} first, want 1.0")
        return
    if kind in ("all_gather", "all_gather_list", "all_to_all",
                "all_to_all_splits"):  # block i from rank i
        got = [float(whole[i]) for i in (0, len(whole) // 2, len(whole) - 1)]
        want = [1.0, float(world // 2 + 1), float(world)]
    else:
        t = whole if kind == "all_reduce" else block
        got = [float(t[i]) for i in (0, len(t) // 2, len(t) - 1)]
        want = [total] * 3
    if got != want:
        raise SystemExit(f"{mode} {kind}: got {got}, want {want}")


def run(config: Path, sizes_mb: list[float], repeats: int, ranks: int,
        collective: str = "ring", kinds: str = ",".join(DEFAULT_KINDS)) -> dict[str, Any]:
    """Start the testbed (direct links), a job of `collective` and `ranks` ranks; time
    `kinds` (comma-separated); return the summary."""
    import os

    os.environ[KINDS_ENV] = kinds
    results, _rate = ranks_on_direct_links(__file__, config, "bench-in-rank", collective,
                                           "ideal", sizes_mb, repeats, ranks)
    r0 = next(r for r in results if r["rank"] == 0)
    rows = []
    for kind in _kinds():
        for mb in sizes_mb:
            med = {m: median(r0["sizes"][f"{kind} {mb}"][m]) for m in MODES}
            cpu = {m: median(r0["cpu"][f"{kind} {mb}"][m]) for m in MODES}
            faults = {m: median(r0["faults"][f"{kind} {mb}"][m]) for m in MODES}
            rows.append({"kind": kind, "size_mb": mb, **{f"{m}_ms": med[m] * 1e3 for m in MODES},
                         **{f"{m}_cpu_ms": cpu[m] * 1e3 for m in MODES},
                         **{f"{m}_minor_faults": faults[m] for m in MODES},
                         **{f"{m}_first_extra_ms": (r0["first"][f"{kind} {mb}"][m] - med[m]) * 1e3
                            for m in MODES},
                         "agent_x_gloo": med["agent"] / med["gloo"],
                         "in_rank_x_gloo": med["in_rank"] / med["gloo"]})
    return {"bench": "in_rank", "collective": collective, "links": "direct", "repeats": repeats,
            "nodes": ranks, "rows": rows, "load": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="0.004096,1,16,64")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--ranks", type=int, default=4,
                        help="ranks on the testbed's first nodes (default %(default)s)")
    parser.add_argument("--collective", default="ring", choices=("ring", "halving-doubling"),
                        help="the job's collective (default %(default)s)")
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                        help=f"the kinds to time, comma-separated, of {', '.join(KINDS)} "
                             "(default %(default)s)")
    return rank_worker_main(parser, argv, rank_main, lambda a, sizes: run(
        Path(a.config), sizes, a.repeats, a.ranks, a.collective, a.kinds), table)


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    return [f"{summary['collective']} on direct links, {summary['nodes']} ranks, float32, median of "
            f"{summary['repeats']} (rank 0); load {summary['load']}",
            f"{'kind':>15}{'size':>10}{'gloo':>10}{'agent':>10}{'in rank':>10}{'agent/gloo':>12}"
            f"{'in rank/gloo':>14}{'rank CPU ms: gloo / in rank':>30}"
            f"{'first call +ms: gloo / agent / in rank':>42}{'faults: gloo / in rank':>24}",
            *(f"{r['kind']:>15}{r['size_mb']:>8g}MB{r['gloo_ms']:>8.2f}ms{r['agent_ms']:>8.2f}ms"
              f"{r['in_rank_ms']:>8.2f}ms{r['agent_x_gloo']:>12.2f}{r['in_rank_x_gloo']:>14.2f}"
              f"{r['gloo_cpu_ms']:>21.2f} / {r['in_rank_cpu_ms']:<6.2f}"
              f"{r['gloo_first_extra_ms']:>20.1f} / {r['agent_first_extra_ms']:.1f} / "
              f"{r['in_rank_first_extra_ms']:.1f}"
              f"{r['gloo_minor_faults']:>16g} / {r['in_rank_minor_faults']:g}"
              for r in summary["rows"])]


if __name__ == "__main__":
    sys.exit(main())
