"""FSDP's two collectives through `torch.distributed` on the `oddl` backend against gloo's, in
the same run, on direct links.

Starts the emulated testbed with direct links and a ring job on the ideal network, and four
rank processes with torchrun's environment. Each joins `init_process_group("oddl")` and a
gloo group of the same ranks, and per size S (as nccl-tests counts it: all-gather's output,
reduce-scatter's input; each rank sends (N−1)/N of it) times in alternation, after the same
barrier, R times each (float32, the output tensors reused as FSDP's are not, so this is the
backend's own cost: no adoption of memory):
- `dist.all_gather_into_tensor(out, inp)` on gloo and on oddl;
- `dist.reduce_scatter_tensor(out, inp)` on gloo and on oddl.
Prints per size the medians of rank 0 and oddl / gloo; the issue's aim is 1.2x.

    python benchmarks/bench_torch_collectives.py [--sizes-mb 16,64] [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench_common import join_oddl_and_gloo, rank_worker_main, ranks_on_direct_links

N = 4
KINDS = ("all_gather", "reduce_scatter")


def rank_main(sizes_mb: list[float], repeats: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_*, ODDL_LOCAL_API set by the parent)."""
    import torch
    import torch.distributed as dist

    rank, gloo = join_oddl_and_gloo()
    out: dict[str, Any] = {"rank": rank, "sizes": {}}

    def call(kind: str, group: Any, big: torch.Tensor, small: torch.Tensor) -> float:
        dist.barrier(group=gloo)
        start = time.perf_counter()
        if kind == "all_gather":
            dist.all_gather_into_tensor(big, small, group=group)
        else:
            dist.reduce_scatter_tensor(small, big, group=group)
        return time.perf_counter() - start

    try:
        for mb in sizes_mb:
            n = int(mb * 1e6) // 4 // N * N
            big = torch.empty(n, dtype=torch.float32)
            small = torch.full((n // N,), float(rank + 1))
            times: dict[str, list[float]] = {}
            for kind in KINDS:
                for backend, group in (("gloo", gloo), ("oddl", None)):
                    call(kind, group, big, small)  # warm-up
                    times[f"{kind} {backend}"] = []
                for _ in range(repeats):
                    for backend, group in (("gloo", gloo), ("oddl", None)):
                        if kind == "reduce_scatter":
                            big.fill_(float(rank + 1))
                        times[f"{kind} {backend}"].append(call(kind, group, big, small))
                        expect = float(N * (N + 1) // 2) if kind == "reduce_scatter" else None
                        if expect is not None and float(small[0]) != expect:
                            raise SystemExit(f"{backend} reduce_scatter: {float(small[0])}")
                        if kind == "all_gather" and (float(big[0]), float(big[-1])) != (1, N):
                            raise SystemExit(f"{backend} all_gather: blocks "
                                             f"{float(big[0])}..{float(big[-1])}, not 1..{N}")
                small.fill_(float(rank + 1))
            out["sizes"][str(mb)] = times
    finally:
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def run(config: Path, sizes_mb: list[float], repeats: int) -> dict[str, Any]:
    """Start the testbed (direct links) and the ranks; return the summary."""
    results, _rate = ranks_on_direct_links(__file__, config, "bench-torch-collectives", "ring",
                                           "ideal", sizes_mb, repeats, N)
    r0 = next(r for r in results if r["rank"] == 0)
    rows = []
    for mb in sizes_mb:
        for kind in KINDS:
            gloo = median(r0["sizes"][str(mb)][f"{kind} gloo"])
            oddl = median(r0["sizes"][str(mb)][f"{kind} oddl"])
            rows.append({"kind": kind, "size_mb": mb, "gloo_ms": gloo * 1e3,
                         "oddl_ms": oddl * 1e3, "oddl_x_gloo": oddl / gloo})
    return {"bench": "torch_collectives", "links": "direct", "collective": "ring",
            "repeats": repeats, "nodes": N, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="16,64")
    parser.add_argument("--repeats", type=int, default=7)
    return rank_worker_main(parser, argv, rank_main,
                            lambda a, sizes: run(Path(a.config), sizes, a.repeats), table)


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    return [f"torch.distributed on direct links, ring job, {N} ranks, float32, median of "
            f"{summary['repeats']} (rank 0); S = all-gather's output, reduce-scatter's input",
            f"{'kind':<16}{'MB':>6}{'gloo ms':>10}{'oddl ms':>10}{'x gloo':>8}",
            *(f"{r['kind']:<16}{r['size_mb']:>6g}{r['gloo_ms']:>10.1f}{r['oddl_ms']:>10.1f}"
              f"{r['oddl_x_gloo']:>8.2f}" for r in summary["rows"])]


if __name__ == "__main__":
    raise SystemExit(main())
