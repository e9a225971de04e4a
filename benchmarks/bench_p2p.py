"""`dist.send` / `dist.recv` on the `oddl` backend (flows on their own circuits, decision record
0020) against gloo's, in the same run, on direct links; and the line rate as the bound.

Starts the emulated testbed with direct links (host-to-host TCP streams, as in a lab; its
lasers and WSS are the emulated devices, so a flow whose circuit is elsewhere is retuned
through the real driver) and a job on its four nodes, and four rank processes with torchrun's
environment. Each joins `init_process_group("oddl")` and a gloo group of the same ranks. Per
size (float32, after a gloo barrier, R times each, alternating):
- shift: every rank sends to rank+1 and receives from rank-1 (`irecv` first, then `send`), as
  pipeline stages pass activations; the circuits are the ring's, no retune;
- pair-retune (oddl only, small sizes): rank 0 sends to 1, 2, 3 in turn, so every flow moves
  its laser first: the cost of a retune per flow.
The time is rank 0's from the barrier to its receive's end (shift), or to the last send's
return (pair-retune). Prints medians, the ratio to gloo and the bound (bytes at the testbed's
line rate).

    python benchmarks/bench_p2p.py [--sizes-mb 1,16,64] [--repeats 7] [--json]
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

N = 4


def rank_main(sizes_mb: list[float], repeats: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_*, ODDL_LOCAL_API set by the parent)."""
    import torch
    import torch.distributed as dist

    rank, gloo = join_oddl_and_gloo()
    out: dict[str, Any] = {"rank": rank, "sizes": {}}

    def shift(group: Any, t: torch.Tensor, got: torch.Tensor) -> float:
        got.zero_()
        dist.barrier(group=gloo)
        start = time.perf_counter()
        work = dist.irecv(got, (rank - 1) % N, group=group)
        dist.send(t, (rank + 1) % N, group=group)
        work.wait()
        took = time.perf_counter() - start
        if float(got[0]) != (rank - 1) % N or float(got[-1]) != (rank - 1) % N:
            raise SystemExit(f"shift: rank {rank} got {float(got[0])}, {float(got[-1])}")
        return took

    def pair_retune(t: torch.Tensor, got: torch.Tensor) -> float:
        dist.barrier(group=gloo)
        start = time.perf_counter()
        if rank == 0:
            for dst in range(1, N):
                dist.send(t, dst)
        else:
            dist.recv(got, 0)
        return time.perf_counter() - start

    try:
        for mb in sizes_mb:
            n = max(1, int(mb * 1e6) // 4)
            t = torch.full((n,), float(rank), dtype=torch.float32)
            got = torch.empty(n, dtype=torch.float32)
            times: dict[str, list[float]] = {"gloo": [], "oddl": [], "oddl_retune": []}
            for _ in range(2):  # warm-up
                shift(gloo, t, got)
                shift(None, t, got)
            for _ in range(repeats):
                times["gloo"].append(shift(gloo, t, got))
                times["oddl"].append(shift(None, t, got))
                if mb <= 1:
                    times["oddl_retune"].append(pair_retune(t, got))
            out["sizes"][str(mb)] = times
    finally:
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def run(config: Path, sizes_mb: list[float], repeats: int) -> dict[str, Any]:
    """Start the testbed (direct links) and the ranks; return the summary."""
    results, line_rate_bps = ranks_on_direct_links(__file__, config, "bench-p2p", "ring",
                                                   "optical", sizes_mb, repeats, N)
    r0 = next(r for r in results if r["rank"] == 0)
    rows = []
    for mb in sizes_mb:
        times = r0["sizes"][str(mb)]
        med = {m: median(v) for m, v in times.items() if v}
        bound = max(1, int(mb * 1e6) // 4) * 4 * 8 / line_rate_bps
        rows.append({"size_mb": mb, **{f"{m}_ms": v * 1e3 for m, v in med.items()},
                     "oddl_x_gloo": med["oddl"] / med["gloo"], "line_rate_ms": bound * 1e3,
                     "oddl_x_line_rate": med["oddl"] / bound})
    return {"bench": "p2p", "links": "direct", "repeats": repeats, "nodes": N,
            "line_rate_gbps": line_rate_bps / 1e9, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="0.004,1,16,64")
    parser.add_argument("--repeats", type=int, default=7)
    return rank_worker_main(parser, argv, rank_main,
                            lambda a, sizes: run(Path(a.config), sizes, a.repeats), table)


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    lines = [f"send/recv shift (every rank to rank+1), {N} ranks on direct links, float32, "
             f"median of {summary['repeats']} (rank 0); line rate "
             f"{summary['line_rate_gbps']:g} Gb/s",
             f"{'size':>9}{'gloo':>11}{'oddl':>11}{'oddl/gloo':>11}{'line rate':>11}"
             f"{'oddl/bound':>12}{'retune/flow':>13}"]
    for r in summary["rows"]:
        retune = (f"{r['oddl_retune_ms'] / 3:>11.2f}ms" if "oddl_retune_ms" in r
                  else f"{'':>13}")
        lines.append(f"{r['size_mb']:>7g}MB{r['gloo_ms']:>9.2f}ms{r['oddl_ms']:>9.2f}ms"
                     f"{r['oddl_x_gloo']:>11.2f}{r['line_rate_ms']:>9.3f}ms"
                     f"{r['oddl_x_line_rate']:>12.1f}{retune}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
