"""Helpers the benchmarks share: timing, result checks, the run's metadata and the output.

The benchmarks run as scripts (`python benchmarks/bench_x.py`), so this module is imported as
`bench_common` (the script's folder is first on sys.path).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all
from oddl.launch.testbed import DEFAULT_TESTBED, RunningTestbed, write_config


def best_of(repeats: int, fn: Callable[[], Any],
            patience_s: float = float("inf")) -> tuple[float, Any]:
    """Return the best wall time of up to `repeats` calls (seconds) and the last result.

    Stops repeating once one call takes longer than `patience_s`.
    """
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - t0
        best = min(best, elapsed)
        if elapsed > patience_s:
            break
    return best, result


def run_meta(benchmark: str, **extra: Any) -> dict[str, Any]:
    """The metadata every benchmark's JSON starts with, and `extra`."""
    return {"benchmark": benchmark, "python": platform.python_version(),
            "machine": platform.machine(), **extra}


def emit(summary: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any]], list[str]],
         indent: int | None = None) -> int:
    """Print `summary` as one JSON line (run_all.py reads the last line) or as the text of
    `table`; returns the exit code 0."""
    if as_json:
        print(json.dumps(summary, indent=indent))
    else:
        print("\n".join(table(summary)))
    return 0


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of |values| in s, and their count (0s for none)."""
    a = np.abs(np.array(values)) if len(values) else np.zeros(1)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max()), "samples": len(values)}


def allreduce_results(clients: list[AgentClient], arrays: list[np.ndarray],
                      **kw: Any) -> tuple[float, list[np.ndarray]]:
    """All nodes at once; the wall time from the common start to the last result, and the
    results (raises if any node failed)."""
    elapsed, outs = allreduce_all(clients, arrays, **kw)
    for out in outs:
        if not isinstance(out, np.ndarray):
            raise RuntimeError(f"all-reduce failed: {out}")
    return elapsed, outs


def check_exact(outs: list[np.ndarray], exact: np.ndarray) -> None:
    """Every result equals `exact` bit for bit."""
    for out in outs:
        if not np.array_equal(out, exact):
            raise RuntimeError("wrong all-reduce result")


def check_float_sum(outs: list[np.ndarray], arrays: list[np.ndarray]) -> None:
    """Every result is within float32 summation error ((N-1)·eps·Σ|x|) of the exact sum."""
    stacked = np.stack(arrays).astype(np.float64)
    bound = (len(arrays) - 1) * np.finfo(np.float32).eps * np.abs(stacked).sum(axis=0)
    for out in outs:
        if not np.all(np.abs(out - stacked.sum(axis=0)) <= bound * 1.01 + 1e-30):
            raise RuntimeError("ring all-reduce differs from the sum")


def run_rank_workers(script: str, apis: list[str], worker_args: list[str],
                     timeout_s: float) -> list[dict[str, Any]]:
    """Run `script --rank-worker WORKER_ARGS` once per agent API as torchrun would (rank r on
    apis[r]); each rank's last stdout line as JSON, in rank order. SystemExit naming a failed
    rank's error output."""
    import subprocess
    import sys

    from oddl.launch.processes import free_port
    from oddl.launch.testbed import torchrun_env

    port = free_port()
    procs = [subprocess.Popen([sys.executable, script, "--rank-worker", *worker_args],
                              env=torchrun_env(rank, len(apis), port, apis),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(len(apis))]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout_s)
        if p.returncode != 0:
            raise SystemExit(f"a rank failed:\n{stderr[-3000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def rank_worker_main(parser: argparse.ArgumentParser, argv: list[str] | None,
                     rank_main: Callable[[list[float], int], None],
                     run: Callable[[argparse.Namespace, list[float]], dict[str, Any]],
                     table: Callable[[dict[str, Any]], list[str]]) -> int:
    """The command line of a benchmark whose ranks are processes of its own script: `parser`
    with the benchmark's own options (`--sizes-mb` and `--repeats` among them) gains
    `--config`, `--json` and the hidden `--rank-worker`; as a rank it runs `rank_main(sizes,
    repeats)`, else `run(args, sizes)` and prints the summary (`emit`)."""
    parser.add_argument("--config", default=str(DEFAULT_TESTBED))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    if args.rank_worker:
        rank_main(sizes, args.repeats)
        return 0
    return emit(run(args, sizes), args.json, table)


def ranks_on_direct_links(script: str, config: Any, job: str, collective: str, network: str,
                          sizes_mb: list[float], repeats: int, ranks: int = 4
                          ) -> tuple[list[dict[str, Any]], float]:
    """Start the emulated testbed of `config` with direct host links, submit a `collective`
    job on `network` over its first `ranks` nodes, and run `script`'s rank workers on them
    (`run_rank_workers`); (each rank's result in rank order, the links' line rate in bit/s)."""
    with tempfile.TemporaryDirectory(prefix=f"{job}-") as tmp, \
            RunningTestbed(Path(tmp), write_config(Path(config), Path(tmp) / "direct.toml",
                                                   {'link = "fabric"': 'link = "direct"'}),
                           agent_timeout_s=None) as tb:
        nodes = tb.launched.node_ids[:ranks]
        tb.operator.submit(job, nodes, collective, network)
        apis = [tb.launched.agents[n]["local_api"] for n in nodes]
        results = run_rank_workers(script, apis, ["--sizes-mb", ",".join(map(str, sizes_mb)),
                                                  "--repeats", str(repeats)], 3600)
        return results, tb.cfg.fabric.line_rate_gbps * 1e9


def join_oddl_and_gloo(rank_path: bool = False) -> tuple[int, Any]:
    """In a rank worker (torchrun's environment and ODDL_LOCAL_API set by the parent): one
    torch thread, `init_process_group("oddl")` and a gloo group of the same ranks beside;
    (this rank, the gloo group). Without `rank_path` the agents move every call's bytes
    (``ODDL_IN_RANK=0``: what these benchmarks measure), with it the ranks move their
    all-reduces' bytes where the job allows it (decision record 0040)."""
    import datetime
    import os

    os.environ["ODDL_IN_RANK"] = "1" if rank_path else "0"

    import torch
    import torch.distributed as dist

    import oddl.torch.backend  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group("oddl", timeout=datetime.timedelta(seconds=600))
    return int(os.environ["RANK"]), dist.new_group(backend="gloo")
