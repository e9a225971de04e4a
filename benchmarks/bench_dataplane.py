"""The data plane against what a user would pick instead and against the wire, in one run.

For each size: gloo (torch.distributed, 4 ranks on loopback, float32) and oddl's four agents
(float32 buckets handed over by `AgentClient.allreduce`, as a training process does), on
- direct links (the lab path: host-to-host TCP streams), ideal network;
- the emulated optical testbed (link = "fabric"), ideal and optical network;
each the median of R all-reduces, with ratios to gloo and to the line-rate bound
2(N−1)/N · S · 8 / rate of the testbed, time per byte at the largest size over the smallest
≥ 16 MB, slot overruns, the control overhead of the optical collectives (first slot's start
minus the last node's call at its agent; the ideal network has none: it starts at once) and the
bytes that crossed the local API socket (shared memory: 0).

It also measures the floor of slot gating on this machine: a bare sleep-then-spin loop at
1 ms edges, in the same run as the agents' gate error.

    python benchmarks/bench_dataplane.py [--sizes-mb 1,16,64,256] [--repeats 3]
        [--collectives ring,halving-doubling] [--modes direct,fabric] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import emit

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all
from oddl.demo.report import percentiles
from oddl.launch.testbed import DEFAULT_TESTBED, RunningTestbed, write_config
from oddl.operator.client import OperatorClient

N = 4


# ---- gloo ---------------------------------------------------------------------------------
def _gloo_rank(rank: int, port: int, sizes: list[int], repeats: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=N)
    result = {}
    for size in sizes:
        t = torch.ones(size // 4, dtype=torch.float32)
        dist.all_reduce(t)  # warm-up
        times = []
        for _ in range(repeats):
            t.fill_(1.0)
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            times.append(float(took))
        assert float(t[0]) == N
        result[size] = times
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def gloo_times(sizes: list[int], repeats: int) -> dict[int, list[float]] | None:
    """Seconds per all-reduce of each size with torch.distributed gloo (None without torch)."""
    try:
        import torch.multiprocessing as mp
    except ImportError:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, sizes, repeats, queue))
             for r in range(N)]
    for p in procs:
        p.start()
    result = queue.get(timeout=1800)
    for p in procs:
        p.join(60)
    return result


# ---- the gate floor -----------------------------------------------------------------------
def spin_floor(edges: int = 2000, period_s: float = 1e-3, spin_s: float = 300e-6) -> list[float]:
    """Release errors (s) of a bare sleep-then-spin loop at `period_s` edges: the precision
    this machine allows a Python thread, without any agent around it."""
    errs = []
    t = time.time() + period_s
    for _ in range(edges):
        remaining = t - time.time()
        if remaining > spin_s:
            time.sleep(remaining - spin_s)
        while time.time() < t:
            pass
        errs.append(time.time() - t)
        t += period_s
    return errs


class LoadedFloor:
    """The same loop in a process of its own while the agents work: the floor under load."""

    def __enter__(self) -> LoadedFloor:
        self.proc = subprocess.Popen([sys.executable, __file__, "--floor-until-eof"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate("", timeout=60)
        self.errors = json.loads(out or "[]")


def _floor_until_eof() -> None:
    errs: list[float] = []
    while not select.select([sys.stdin], [], [], 0)[0]:
        errs += spin_floor(100)
    print(json.dumps(errs))


# ---- oddl ---------------------------------------------------------------------------------
def _testbed_file(tmp: Path, mode: str, base: Path) -> Path:
    return write_config(base, tmp / f"testbed-{mode}.toml",
                        {'link = "fabric"': 'link = "direct"'} if mode == "direct" else None)


def oddl_times(mode: str, sizes: list[int], repeats: int, collectives: list[str],
               networks: list[str], base: Path) -> dict[str, Any]:
    """Start the emulated testbed with `mode` links and time every (collective, network)."""
    out: dict[str, Any] = {"times": {}, "overruns": {}, "late": {}, "control": {},
                           "gate_errors": []}
    with tempfile.TemporaryDirectory() as tmp, RunningTestbed(
            Path(tmp), _testbed_file(Path(tmp), mode, base), agent_timeout_s=None) as tb:
        out["line_rate_gbps"] = tb.cfg.fabric.line_rate_gbps
        clients, op = tb.clients, tb.operator
        api0 = sum(c.status()["local_api_bytes"] for c in clients)
        with LoadedFloor() as floor:
            _run_jobs(op, clients, collectives, networks, sizes, repeats, out,
                      zero_copy=mode == "direct")
        out["loaded_floor"] = floor.errors
        status = [c.status() for c in clients]
        out["gate_errors"] = [e for s in status for e in s["gate_errors"]]
        out["gate_scheduling"] = status[0].get("gate_scheduling", "")
        out["local_api_bytes"] = sum(s["local_api_bytes"] for s in status) - api0
        out["shared_memory_bytes"] = sum(s["shared_memory_bytes"] for s in status)
    return out


def _run_jobs(op: OperatorClient, clients: list[AgentClient], collectives: list[str],
              networks: list[str], sizes: list[int], repeats: int, out: dict[str, Any],
              zero_copy: bool) -> None:
    for collective in collectives:
        for network in networks:
            job = op.submit(f"bench-{collective}-{network}", [], collective, network)
            for size in sizes:
                # in place, as gloo's all_reduce is: the bucket goes to shared memory
                # and the sum comes back into it
                arrays = [np.empty(size // 4, dtype=np.float32) for r in range(N)]
                _measure(clients, arrays, f"{collective}/{network}/{size}", repeats, out)
                if network == "ideal" and zero_copy:
                    # the zero-copy API: the bucket already lives in shared memory
                    shared = [c.shared_array(size // 4, np.float32) for c in clients]
                    _measure(clients, shared, f"{collective}/{network}-zero-copy/{size}",
                             repeats, out)
            op.cancel(job["id"])


def _measure(clients: list[AgentClient], arrays: list[np.ndarray], key: str, repeats: int,
             out: dict[str, Any]) -> None:
    exact = np.full(arrays[0].size, N * (N + 1) / 2, dtype=np.float32)
    times = []
    for i in range(repeats + 1):  # the first is a warm-up
        for r, a in enumerate(arrays):
            a.fill(r + 1)
        took, outs = allreduce_all(clients, arrays, inplace=True)
        _check(outs, exact)
        if i == 0:
            before = sum(len(c.status()["overruns"]) for c in clients)
            late0 = _late(clients)
        else:
            times.append(took)
    out["times"][key] = times
    # the control overhead of the gated collectives: their first slot's start minus the
    # last node's all-reduce call at its agent (barrier or ready exchange, and the margin);
    # the agents share this machine's clock
    if "/optical/" in key:
        starts: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for c in clients:
            for job, seq, called, first in c.status()["collective_starts"]:
                starts.setdefault((job, seq), []).append((called, first))
        last = sorted(starts)[-repeats:]
        control = [float(np.median([f for _, f in starts[k]]) - max(c for c, _ in starts[k]))
                   for k in last if len(starts[k]) == len(clients)]
        if control:
            out["control"][key] = float(np.median(control))
    out["overruns"][key] = sum(len(c.status()["overruns"]) for c in clients) - before
    out["late"][key] = _late(clients) - late0


def _late(clients: list[AgentClient]) -> int:
    return sum(int(c.status().get("late_chunks", 0)) for c in clients)


def _check(outs: list[Any], exact: np.ndarray) -> None:
    for o in outs:
        if not isinstance(o, np.ndarray):
            raise AssertionError(f"all-reduce failed: {o}")
        if not np.array_equal(o, exact):
            raise AssertionError("wrong all-reduce result")


def _row(mode: str, res: dict[str, Any], key: str, sizes: list[int],
         gloo: dict[int, list[float]] | None) -> dict[str, Any]:
    """One (mode, collective, network, size): its median against gloo, the wire and ideal."""
    rate = res["line_rate_gbps"] * 1e9
    collective, network, size = key.split("/")
    size_i = int(size)
    med = float(np.median(res["times"][key]))
    bound = 2 * (N - 1) / N * size_i * 8 / rate
    row = {"mode": mode, "collective": collective, "network": network, "bytes": size_i,
           "ms": med * 1e3, "line_rate_bound_ms": bound * 1e3,
           "x_line_rate": med / bound, "overruns": res["overruns"][key],
           "late_chunks": res["late"][key]}
    if key in res["control"]:
        row["control_overhead_ms"] = res["control"][key] * 1e3
    if gloo is not None and size_i in gloo:
        row["gloo_ms"] = float(np.median(gloo[size_i])) * 1e3
        row["x_gloo"] = med / float(np.median(gloo[size_i]))
    ideal = res["times"].get(f"{collective}/ideal/{size}")
    if network == "optical" and ideal:
        row["x_ideal"] = med / float(np.median(ideal))
    small = res["times"].get(f"{collective}/{network}/{min(sizes)}")
    if small and size_i >= 16 * 2**20 - 1:
        fixed = float(np.median(small))
        row["fixed_overhead_ms"] = fixed * 1e3
        row["x_wire_plus_fixed"] = med / (bound + fixed)
    return row


def _per_byte(modes: dict[str, dict[str, Any]], collectives: list[str],
              sizes: list[int]) -> dict[str, float]:
    """Time per byte at the largest size over the smallest ≥ 16 MB."""
    per_byte = {}
    for mode, res in modes.items():
        for collective in collectives:
            for network in ("ideal", "optical"):
                big = [s for s in sizes if s >= 16 * 2**20 - 1]
                keys = [f"{collective}/{network}/{s}" for s in big]
                if len(big) >= 2 and all(k in res["times"] for k in keys):
                    lo, hi = (float(np.median(res["times"][k])) / s for k, s in
                              ((keys[0], big[0]), (keys[-1], big[-1])))
                    per_byte[f"{mode}/{collective}/{network}"] = hi / lo
    return per_byte


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    lines = [f"all-reduce on {N} nodes, float32, median of {summary['repeats']}; x gloo = oddl / "
             "gloo in this run; x wire = oddl / line-rate bound",
             f"{'mode':<7} {'collective':<17} {'network':<17} {'MB':>7} {'ms':>8} {'gloo ms':>8} "
             f"{'x gloo':>7} {'x wire':>7} {'x ideal':>8} {'overruns':>8} {'late':>5} "
             f"{'control ms':>10}"]
    for r in summary["rows"]:
        lines.append(
            f"{r['mode']:<7} {r['collective']:<17} {r['network']:<17} {r['bytes'] / 2**20:>7.3f} "
            f"{r['ms']:>8.1f} {r.get('gloo_ms', float('nan')):>8.1f} "
            f"{r.get('x_gloo', float('nan')):>7.2f} {r['x_line_rate']:>7.2f} "
            f"{r.get('x_ideal', float('nan')):>8.2f} {r['overruns']:>8} {r['late_chunks']:>5} "
            f"{r.get('control_overhead_ms', float('nan')):>10.2f}")
    for k, v in summary["time_per_byte_largest_over_16mb"].items():
        lines.append(f"time per byte, largest / 16 MB, {k}: {v:.2f}")
    f = summary["spin_floor_quiet"]
    lines.append(f"bare sleep-then-spin floor, quiet: p50 {f['p50_us']:.1f} µs, p99 "
                 f"{f['p99_us']:.1f} µs")
    for m, g in summary["gate_error"].items():
        lf = summary["spin_floor_loaded"][m]
        lines.append(
            f"{m}: bare loop during the runs p99 {lf['p99_us']:.1f} µs; agents' gate error "
            f"p50 {g['p50_us']:.1f} µs, p99 {g['p99_us']:.1f} µs ({g['samples']} sends), "
            f"p99 / loaded floor {summary['gate_p99_over_loaded_floor'][m]:.2f} "
            f"[{summary['gate_scheduling'][m] or 'normal scheduling'}]")
    for m in summary["gate_error"]:
        lines.append(f"{m}: bytes through the local API socket "
                     f"{summary['local_api_socket_bytes'][m]}, through shared memory "
                     f"{summary['shared_memory_bytes'][m]}")
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(DEFAULT_TESTBED))
    parser.add_argument("--sizes-mb", default="0.00390625,1,16,64,256",
                        help="sizes in MiB; the smallest (4 KiB) gives the fixed "
                             "per-collective overhead")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--collectives", default="ring,halving-doubling")
    parser.add_argument("--modes", default="direct,fabric")
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--floor-until-eof", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, or one JSON object with --json."""
    args = _parser().parse_args(argv)
    if args.floor_until_eof:
        _floor_until_eof()
        return 0
    sizes = [int(float(s) * 2**20) for s in args.sizes_mb.split(",")]
    collectives = args.collectives.split(",")
    floor = spin_floor()
    gloo = None if args.no_gloo else gloo_times(sizes, args.repeats)
    modes = {}
    for mode in args.modes.split(","):
        networks = ["ideal"] if mode == "direct" else ["ideal", "optical"]
        modes[mode] = oddl_times(mode, sizes, args.repeats, collectives, networks,
                                 Path(args.config))
    floor_after = spin_floor()
    rows = [_row(mode, res, key, sizes, gloo) for mode, res in modes.items()
            for key in res["times"]]
    gate = {m: percentiles(r["gate_errors"]) for m, r in modes.items()}
    loaded = {m: percentiles(r["loaded_floor"]) for m, r in modes.items()}
    summary = {"nodes": N, "repeats": args.repeats, "cpus": os.cpu_count(),
               "gloo_ms": {s: float(np.median(t)) * 1e3 for s, t in (gloo or {}).items()},
               "rows": rows, "time_per_byte_largest_over_16mb": _per_byte(modes, collectives,
                                                                          sizes),
               "spin_floor_quiet": percentiles(floor + floor_after),
               "spin_floor_loaded": loaded, "gate_error": gate,
               "gate_p99_over_loaded_floor": {m: g["p99_us"] / max(loaded[m]["p99_us"], 1e-3)
                                              for m, g in gate.items()},
               "gate_scheduling": {m: r["gate_scheduling"] for m, r in modes.items()},
               "local_api_socket_bytes": {m: r["local_api_bytes"] for m, r in modes.items()},
               "shared_memory_bytes": {m: r["shared_memory_bytes"] for m, r in modes.items()},
               "line_rate_gbps": {m: r["line_rate_gbps"] for m, r in modes.items()}}
    return emit(summary, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
