"""What the `oddl` torch.distributed backend adds to the agent's own all-reduce.

Starts the emulated testbed with a job on its four nodes and four rank processes; each joins
`init_process_group("oddl")` and, per size, times in alternation (same process, same agent,
float32, after the same barrier) `dist.all_reduce(tensor)` through the backend and
`AgentClient.allreduce(array, out=array)` straight to the agent, R times each. Prints per size
the medians (rank 0, which waits like every rank for the slowest) and the ratio backend /
agent (aim ≤ 1.05 at ≥ 1 MB, issue 16), the median of the per-pair ratios, and the same call
with `async_op=True` then `wait()` (through the backend's worker thread, as DDP's buckets go).

    python benchmarks/bench_torch_backend.py [--sizes-mb 1,16,64] [--repeats 5]
        [--collective ring] [--network optical] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench_common import rank_worker_main, run_rank_workers

from oddl.launch.testbed import RunningTestbed

N = 4


def rank_main(sizes_mb: list[float], repeats: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_*, ODDL_LOCAL_API set by the parent)."""
    import datetime

    import numpy as np
    import torch
    import torch.distributed as dist

    import oddl.torch.backend as ob
    from oddl.agents.client.agent_client import AgentClient

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("oddl", timeout=datetime.timedelta(seconds=300))
    client = AgentClient(os.environ["ODDL_LOCAL_API"].split(",")[rank], timeout_s=300)
    out: dict[str, Any] = {"rank": rank, "sizes": {}}
    try:
        for mb in sizes_mb:
            n = int(mb * 1e6) // 4
            tensor = torch.ones(n, dtype=torch.float32)
            array = np.ones(n, dtype=np.float32)
            dist.all_reduce(tensor)  # warm-up: both paths map their shared-memory buckets
            client.allreduce(array, out=array)
            backend, agent, queued = [], [], []
            for _ in range(repeats):
                tensor.fill_(1.0)
                dist.barrier()
                t = time.perf_counter()
                dist.all_reduce(tensor)
                backend.append(time.perf_counter() - t)
                tensor.fill_(1.0)
                dist.barrier()
                t = time.perf_counter()
                dist.all_reduce(tensor, async_op=True).wait()  # through the worker thread
                queued.append(time.perf_counter() - t)
                array.fill(1.0)
                dist.barrier()
                t = time.perf_counter()
                client.allreduce(array, out=array)
                agent.append(time.perf_counter() - t)
            if float(tensor[0]) != N or float(array[0]) != N:
                raise SystemExit(f"wrong sums: {float(tensor[0])}, {float(array[0])}")
            out["sizes"][str(mb)] = {"backend_s": backend, "agent_s": agent,
                                     "async_s": queued}
        out["counters"] = ob.counters()["total"]
    finally:
        client.close()
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def run(config: Path, sizes_mb: list[float], repeats: int, collective: str,
        network: str) -> dict[str, Any]:
    """Start the testbed and the ranks; return the summary."""
    with tempfile.TemporaryDirectory(prefix="bench-torch-backend-") as tmp, \
            RunningTestbed(Path(tmp), config, agent_timeout_s=None) as tb:
        nodes = tb.launched.node_ids[:N]
        tb.operator.submit("bench-torch-backend", nodes, collective, network)
        apis = [tb.launched.agents[n]["local_api"] for n in nodes]
        results = run_rank_workers(__file__, apis, ["--sizes-mb", ",".join(map(str, sizes_mb)),
                                                    "--repeats", str(repeats)], 1800)
    rows = []
    r0 = next(r for r in results if r["rank"] == 0)
    for mb in sizes_mb:
        times = r0["sizes"][str(mb)]
        b, a = median(times["backend_s"]), median(times["agent_s"])
        q = median(times["async_s"])
        pairs = [x / y for x, y in zip(times["backend_s"], times["agent_s"], strict=True)]
        rows.append({"size_mb": mb, "backend_ms": b * 1e3, "agent_ms": a * 1e3,
                     "ratio": b / a, "pair_ratio_median": median(pairs),
                     "async_ms": q * 1e3, "async_ratio": q / a,
                     "meets_1_05": b / a <= 1.05})
    return {"bench": "torch_backend", "collective": collective, "network": network,
            "repeats": repeats, "nodes": N, "rows": rows, "counters_rank0": r0["counters"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--collective", default="ring")
    parser.add_argument("--network", default="optical", choices=["optical", "ideal"])
    return rank_worker_main(parser, argv, rank_main, lambda a, sizes: run(
        Path(a.config), sizes, a.repeats, a.collective, a.network), table)


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    return [f"oddl torch backend vs the agent's own all-reduce ({summary['collective']}, "
            f"{summary['network']} network, {N} ranks, median of {summary['repeats']}, rank 0)",
            f"{'size':>8}{'backend':>12}{'agent':>12}{'ratio':>8}{'pairs':>8}"
            f"{'async_op':>12}{'ratio':>8}",
            *(f"{r['size_mb']:>6g}MB{r['backend_ms']:>10.1f}ms{r['agent_ms']:>10.1f}ms"
              f"{r['ratio']:>8.3f}{r['pair_ratio_median']:>8.3f}{r['async_ms']:>10.1f}ms"
              f"{r['async_ratio']:>8.3f}{'' if r['meets_1_05'] else '  (aim ≤ 1.05)'}"
              for r in summary["rows"])]


if __name__ == "__main__":
    sys.exit(main())
