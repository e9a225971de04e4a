"""`dist.all_reduce` of a reused tensor, as DDP runs it: oddl's copy path, oddl's zero-copy
path (decision record 0017) and gloo, in the same run, on direct links.

Starts the emulated testbed with direct links (host-to-host TCP streams, as in a lab) and a
job on its four nodes, and four rank processes with torchrun's environment. Each joins
`init_process_group("oddl")` and a gloo group of the same four ranks, and per size times in
alternation (float32, after the same barrier, R times each):
- gloo: `dist.all_reduce(t, group=gloo)`;
- oddl copy: `dist.all_reduce(t)` with promotion off (the tensor is copied into the client's
  bucket and back, two memcpy per call);
- oddl adopted: `dist.all_reduce(t)` of a tensor whose storage the backend moved into shared
  memory and the agent adopted (promoted at the second call, during the warm-up).
Prints per size the medians of rank 0 (which waits, as every rank, for the slowest) and the
ratios to gloo; the issue's aim is oddl within 1.1x gloo at 16-256 MB.

    python benchmarks/bench_zero_copy.py [--sizes-mb 16,64,256] [--repeats 5]
        [--collective ring] [--ranks 4] [--json]

`--ranks 2` is the control of decision record 0023: the same call with half the processes.
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

MODES = ("gloo", "copy", "adopted")


def rank_main(sizes_mb: list[float], repeats: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_*, ODDL_LOCAL_API set by the parent)."""
    import torch
    import torch.distributed as dist

    import oddl.torch.channel as oc

    rank, gloo = join_oddl_and_gloo()
    world = dist.get_world_size()
    assert oc._channel is not None
    promoter = oc._channel.promoter
    out: dict[str, Any] = {"rank": rank, "sizes": {}}

    def call(mode: str, t: torch.Tensor) -> float:
        promoter.enabled = mode == "adopted"
        t.fill_(1.0)
        dist.barrier(group=gloo)
        start = time.perf_counter()
        dist.all_reduce(t, group=gloo if mode == "gloo" else None)
        took = time.perf_counter() - start
        if float(t[0]) != world or float(t[-1]) != world:
            raise SystemExit(f"{mode}: wrong sum {float(t[0])}, {float(t[-1])}")
        return took

    try:
        for mb in sizes_mb:
            n = int(mb * 1e6) // 4
            tensors = {m: torch.ones(n, dtype=torch.float32) for m in MODES}
            for m in MODES:  # warm-up; the adopted one is promoted at its second call
                call(m, tensors[m])
                call(m, tensors[m])
            if not tensors["adopted"].untyped_storage().is_shared():
                raise SystemExit("the reused tensor was not promoted")
            times: dict[str, list[float]] = {m: [] for m in MODES}
            for _ in range(repeats):
                for m in MODES:
                    times[m].append(call(m, tensors[m]))
            out["sizes"][str(mb)] = times
            del tensors
        out["promoted"] = promoter.promoted
    finally:
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def run(config: Path, sizes_mb: list[float], repeats: int, collective: str,
        ranks: int = 4) -> dict[str, Any]:
    """Start the testbed (direct links) and `ranks` ranks; return the summary."""
    results, _rate = ranks_on_direct_links(__file__, config, "bench-zero-copy", collective,
                                           "ideal", sizes_mb, repeats, ranks)
    r0 = next(r for r in results if r["rank"] == 0)
    rows = []
    for mb in sizes_mb:
        med = {m: median(r0["sizes"][str(mb)][m]) for m in MODES}
        rows.append({"size_mb": mb, **{f"{m}_ms": med[m] * 1e3 for m in MODES},
                     "copy_x_gloo": med["copy"] / med["gloo"],
                     "adopted_x_gloo": med["adopted"] / med["gloo"],
                     "adopted_x_copy": med["adopted"] / med["copy"]})
    return {"bench": "zero_copy", "collective": collective, "links": "direct",
            "repeats": repeats, "nodes": ranks, "rows": rows, "promoted_rank0": r0["promoted"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="16,64,256")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--collective", default="ring")
    parser.add_argument("--ranks", type=int, default=4,
                        help="ranks on the testbed's first nodes (default %(default)s)")
    return rank_worker_main(parser, argv, rank_main, lambda a, sizes: run(
        Path(a.config), sizes, a.repeats, a.collective, a.ranks), table)


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    return [f"dist.all_reduce of a reused tensor, {summary['collective']} on direct links, "
            f"{summary['nodes']} ranks, float32, median of {summary['repeats']} (rank 0)",
            f"{'size':>8}{'gloo':>11}{'copy':>11}{'adopted':>11}{'copy/gloo':>11}"
            f"{'adopted/gloo':>14}{'adopted/copy':>14}",
            *(f"{r['size_mb']:>6g}MB{r['gloo_ms']:>9.1f}ms{r['copy_ms']:>9.1f}ms"
              f"{r['adopted_ms']:>9.1f}ms{r['copy_x_gloo']:>11.2f}{r['adopted_x_gloo']:>14.2f}"
              f"{r['adopted_x_copy']:>14.2f}" for r in summary["rows"])]


if __name__ == "__main__":
    sys.exit(main())
