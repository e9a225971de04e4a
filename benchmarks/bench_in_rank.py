"""The rank moving its own bytes (decision record 0040) against the agent path and gloo, in
the same run (issue 36).

Starts the emulated testbed with direct links and a ring job on its first `--ranks` nodes,
and the rank processes with torchrun's environment. Each joins `init_process_group("oddl")`
and a gloo group of the same ranks (`oddl.torch.in_rank`: the agents lease the data path to
the ranks), and per size times in alternation, float32, after the
same barrier, `--repeats` times each:
- gloo: `dist.all_reduce(t, group=gloo)`;
- agent: `dist.all_reduce(t)` of an adopted tensor with the group's rank path set aside (the
  agent moves the bytes, as with ``ODDL_IN_RANK=0``);
- in_rank: `dist.all_reduce(t)` on the rank path: the job's schedule, leased once per size,
  run by the agents' executor and outcome round in the rank, over its own stream link.
Every result is checked exact against the expected sum. Prints rank 0's medians, the ratios
to gloo, and the CPU time rank 0's process spent in a gloo call and in a call on the rank
path (all its threads; the agent path's work is in the agent, not counted there).

    python benchmarks/bench_in_rank.py [--sizes-mb 0.004096,1,16,64] [--repeats 9]
        [--ranks 4] [--json]
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
    out: dict[str, Any] = {"rank": rank, "sizes": {}, "cpu": {}}

    def call(mode: str, t: torch.Tensor) -> tuple[float, float]:
        t.fill_(float(rank + 1))
        channel.rank_path = path if mode == "in_rank" else None
        channel.promoter.enabled = mode == "agent"
        dist.barrier(group=gloo)
        start, cpu = time.perf_counter(), time.process_time()
        dist.all_reduce(t, group=gloo if mode == "gloo" else None)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        want = world * (world + 1) / 2
        if float(t[0]) != want or float(t[-1]) != want or float(t[len(t) // 2]) != want:
            raise SystemExit(f"{mode}: wrong sum {float(t[0])}, {float(t[-1])}, want {want}")
        return took, cpu

    try:
        for mb in sizes_mb:
            n = max(1, int(mb * 1e6) // 4)
            tensors = {m: torch.ones(n, dtype=torch.float32) for m in MODES}
            for m in MODES:  # warm-up; the agent's tensor is adopted at its first call
                call(m, tensors[m])
                call(m, tensors[m])
            times: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
            for _ in range(repeats):
                for m in MODES:
                    times[m].append(call(m, tensors[m]))
            out["sizes"][str(mb)] = {m: [t for t, _ in v] for m, v in times.items()}
            out["cpu"][str(mb)] = {m: [c for _, c in v] for m, v in times.items()}
            del tensors
        out["rank_path_calls"] = path.calls
    finally:
        channel.rank_path = path
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def run(config: Path, sizes_mb: list[float], repeats: int, ranks: int) -> dict[str, Any]:
    """Start the testbed (direct links) and `ranks` ranks; return the summary."""
    import os

    results, _rate = ranks_on_direct_links(__file__, config, "bench-in-rank", "ring", "ideal",
                                           sizes_mb, repeats, ranks)
    r0 = next(r for r in results if r["rank"] == 0)
    rows = []
    for mb in sizes_mb:
        med = {m: median(r0["sizes"][str(mb)][m]) for m in MODES}
        cpu = {m: median(r0["cpu"][str(mb)][m]) for m in MODES}
        rows.append({"size_mb": mb, **{f"{m}_ms": med[m] * 1e3 for m in MODES},
                     **{f"{m}_cpu_ms": cpu[m] * 1e3 for m in MODES},
                     "agent_x_gloo": med["agent"] / med["gloo"],
                     "in_rank_x_gloo": med["in_rank"] / med["gloo"]})
    return {"bench": "in_rank", "collective": "ring", "links": "direct", "repeats": repeats,
            "nodes": ranks, "rows": rows, "load": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="0.004096,1,16,64")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--ranks", type=int, default=4,
                        help="ranks on the testbed's first nodes (default %(default)s)")
    return rank_worker_main(parser, argv, rank_main, lambda a, sizes: run(
        Path(a.config), sizes, a.repeats, a.ranks), table)


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    return [f"all-reduce, ring on direct links, {summary['nodes']} ranks, float32, median of "
            f"{summary['repeats']} (rank 0); load {summary['load']}",
            f"{'size':>10}{'gloo':>10}{'agent':>10}{'in rank':>10}{'agent/gloo':>12}"
            f"{'in rank/gloo':>14}{'rank CPU ms: gloo / in rank':>30}",
            *(f"{r['size_mb']:>8g}MB{r['gloo_ms']:>8.2f}ms{r['agent_ms']:>8.2f}ms"
              f"{r['in_rank_ms']:>8.2f}ms{r['agent_x_gloo']:>12.2f}{r['in_rank_x_gloo']:>14.2f}"
              f"{r['gloo_cpu_ms']:>21.2f} / {r['in_rank_cpu_ms']:.2f}"
              for r in summary["rows"])]


if __name__ == "__main__":
    sys.exit(main())
