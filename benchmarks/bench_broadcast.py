"""Broadcast on the emulated optical fabric against its bounds: the pipelined chain (N−1 pieces
down root → root+1 → …, `controller/scheduling/native.broadcast_chain`) and the chain of whole
buffers it replaced, both as wire time at the testbed's line rate.

Starts the emulated 4-node testbed (the fabric paces every chunk at the line rate and delivers
it only where the light goes), submits a ring job on the optical network and times
`AgentClient.broadcast` from rank 0 on all four agents at once (after one warm-up; median of R;
every result checked). Prints the time, the pipelined chain's wire time (2N−3)/(N−1) · S/rate
and the whole-buffer chain's (N−1) · S/rate.

    python benchmarks/bench_broadcast.py [--sizes-mb 4,16] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from bench_common import emit

from oddl.agents.client.every_rank import collective_all
from oddl.launch.testbed import DEFAULT_TESTBED, RunningTestbed

N = 4


def run(config: Path, sizes_mb: list[float], repeats: int) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-broadcast-") as tmp, \
            RunningTestbed(Path(tmp), config) as tb:
        job = tb.operator.submit("bench-broadcast", [], "ring", "optical")["id"]
        rate = tb.cfg.fabric.line_rate_gbps * 1e9
        clients = tb.clients[:N]
        for mb in sizes_mb:
            n = int(mb * 1e6) // 4
            times = []
            for k in range(repeats + 1):
                bufs = [np.full(n, float(r), np.float32) for r in range(N)]
                start = time.perf_counter()
                outs = collective_all(clients, lambda c, r, b=bufs: c.broadcast(
                    b[r], root=0, job=job))[1]
                took = time.perf_counter() - start
                if not all(isinstance(o, np.ndarray) and not o.any() for o in outs):
                    raise SystemExit(f"broadcast of {mb} MB: a rank got something else: {outs}")
                if k:
                    times.append(took)
            wire = n * 4 * 8 / rate
            rows.append({"size_mb": mb, "ms": median(times) * 1e3,
                         "pipelined_bound_ms": wire * (2 * N - 3) / (N - 1) * 1e3,
                         "whole_chain_bound_ms": wire * (N - 1) * 1e3})
    return {"bench": "broadcast", "nodes": N, "repeats": repeats,
            "line_rate_gbps": rate / 1e9, "rows": rows}


def table(summary: dict[str, Any]) -> list[str]:
    return [f"broadcast from rank 0, {N} agents, emulated fabric at "
            f"{summary['line_rate_gbps']:g} Gb/s, ring job, median of {summary['repeats']}",
            f"{'size':>8}{'time':>11}{'pipelined bound':>17}{'whole-chain bound':>19}",
            *(f"{r['size_mb']:>6g}MB{r['ms']:>9.1f}ms{r['pipelined_bound_ms']:>15.1f}ms"
              f"{r['whole_chain_bound_ms']:>17.1f}ms" for r in summary["rows"])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_TESTBED))
    parser.add_argument("--sizes-mb", default="4,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    return emit(run(Path(args.config), sizes, args.repeats), args.json, table)


if __name__ == "__main__":
    sys.exit(main())
