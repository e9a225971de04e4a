"""Native all-gather and reduce-scatter against gloo's, in the same run, on direct links.

For each size S (the whole work buffer, as nccl-tests counts it: all-gather's output,
reduce-scatter's input; each rank sends (N−1)/N of it): gloo (torch.distributed, 4 ranks on
loopback, float32, `all_gather_single` and `reduce_scatter_single`, formerly
`all_gather_into_tensor` and `reduce_scatter_tensor`) and oddl's four
agents on the emulated testbed with direct host links (`link = "direct"`), a ring job on the
ideal network, through `AgentClient.all_gather`/`reduce_scatter` with a preallocated `out`
(as gloo writes into its output tensor) and, for all-gather, with `out` a `shared_array()`
(the result lands in the shared bucket: no copy). Each the median of R calls, all ranks
released together.

    python benchmarks/bench_collectives.py [--sizes 16MB,64MB] [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import emit

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import collective_all
from oddl.cli.byte_sizes import parse_size
from oddl.launch.testbed import DEFAULT_TESTBED, RunningTestbed, write_config

N = 4
KINDS = ("all_gather", "reduce_scatter")


# ---- gloo ---------------------------------------------------------------------------------
def _gloo_rank(rank: int, port: int, sizes: list[int], repeats: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=N)
    result: dict[str, list[float]] = {}
    for size in sizes:
        whole = torch.empty(size // 4, dtype=torch.float32)
        block = torch.full((size // 4 // N,), float(rank + 1))
        # the names torch 2.13 prefers, the older ones before
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        calls = {"all_gather": (gather, (whole, block)),
                 "reduce_scatter": (scatter, (block, whole))}
        for kind, (call, tensors) in calls.items():
            call(*tensors)  # warm-up
            times = []
            for _ in range(repeats):
                whole.fill_(float(rank + 1))
                dist.barrier()
                start = time.perf_counter()
                call(*tensors)
                took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                times.append(float(took))
            result[f"{kind}/{size}"] = times
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def gloo_times(sizes: list[int], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each kind and size with torch.distributed gloo."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, sizes, repeats, queue))
             for r in range(N)]
    for p in procs:
        p.start()
    result: dict[str, list[float]] = queue.get(timeout=1800)
    for p in procs:
        p.join(60)
    return result


# ---- oddl ---------------------------------------------------------------------------------
def _calls(clients: list[AgentClient], size: int, job: str) -> dict[str, Any]:
    """Per variant: (prepare(), call(client, rank), check(outs))."""
    m = size // 4 // N
    blocks = [np.full(m, r + 1, np.float32) for r in range(N)]
    wholes = [np.full((N, m), r + 1, np.float32) for r in range(N)]
    gathered = [np.empty((N, m), np.float32) for _ in range(N)]
    scattered = [np.empty(m, np.float32) for _ in range(N)]
    expect_gather = np.repeat(np.arange(1, N + 1, dtype=np.float32)[:, None], m, 1)
    expect_scatter = np.full(m, N * (N + 1) / 2, np.float32)

    def check_gather(outs: list[Any]) -> None:
        assert all(np.array_equal(o, expect_gather) for o in outs), outs[0]

    def check_scatter(outs: list[Any]) -> None:
        assert all(np.array_equal(o, expect_scatter) for o in outs), outs[0]

    def shared_gather(c: AgentClient, r: int) -> Any:
        return c.all_gather(blocks[r], out=c.shared_array((N, m), np.float32), job=job)

    return {
        "all_gather": (lambda c, r: c.all_gather(blocks[r], out=gathered[r], job=job),
                       check_gather),
        "all_gather-shared": (shared_gather, check_gather),
        "reduce_scatter": (lambda c, r: c.reduce_scatter(wholes[r], out=scattered[r], job=job),
                           check_scatter),
    }


def oddl_times(sizes: list[int], repeats: int, collective: str) -> dict[str, list[float]]:
    """Seconds per call of each variant and size on the emulated testbed, direct links."""
    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_config(DEFAULT_TESTBED, Path(tmp) / "direct.toml",
                            {'link = "fabric"': 'link = "direct"'})
        with RunningTestbed(Path(tmp), path, agent_timeout_s=None) as tb:
            job = tb.operator.submit(f"bench-{collective}", [], collective, "ideal")["id"]
            for size in sizes:
                for variant, (call, check) in _calls(tb.clients, size, job).items():
                    times = []
                    for i in range(repeats + 1):  # the first is a warm-up
                        took, outs = collective_all(tb.clients, call)
                        bad = [o for o in outs if isinstance(o, Exception)]
                        if bad:
                            raise bad[0]
                        check(outs)
                        if i:
                            times.append(took)
                    out[f"{variant}/{size}"] = times
            tb.operator.cancel(job)
    return out


def table(summary: dict[str, Any]) -> list[str]:
    """The summary as text lines."""
    lines = [f"{summary['collective']} on {N} nodes, direct links, ideal network, float32, "
             f"median of {summary['repeats']}; S = the whole buffer, each rank sends (N-1)/N "
             "of it; x gloo = oddl / gloo in this run",
             f"{'kind':<20} {'MB':>6} {'oddl ms':>9} {'gloo ms':>9} {'x gloo':>7}"]
    for r in summary["rows"]:
        lines.append(f"{r['variant']:<20} {r['mb']:>6.0f} {r['ms']:>9.1f} {r['gloo_ms']:>9.1f} "
                     f"{r['x_gloo']:>7.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16MB,64MB")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--collective", default="ring", help="the job's algorithm")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) // (4 * N) * 4 * N for s in args.sizes.split(",")]
    gloo = gloo_times(sizes, args.repeats)
    oddl = oddl_times(sizes, args.repeats, args.collective)
    rows = []
    for key, times in oddl.items():
        variant, size = key.rsplit("/", 1)
        med = float(np.median(times))
        g = float(np.median(gloo[f"{variant.split('-')[0]}/{size}"]))
        rows.append({"variant": variant, "mb": int(size) / 1e6, "ms": med * 1e3,
                     "gloo_ms": g * 1e3, "x_gloo": med / g})
    summary = {"collective": args.collective, "repeats": args.repeats, "rows": rows}
    return emit(summary, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
