"""What a small call on the rank path costs the rank, thread by thread (issue 36).

Starts the emulated testbed with direct links and a ring job on 4 nodes, and 4 rank
processes that join `init_process_group("oddl")` (the agents lease the data path to the
ranks, decision record 0040) and a gloo group beside. Per size, float32, each rank first
makes `--calls` all-reduces back to back on the rank path, then as many on gloo, and
rank 0 reports per call: the wall time, its process's CPU time (all threads), that CPU time
by thread (the caller's, the stream readers', gloo's own threads), and its voluntary and
involuntary context switches (each a wake-up). On two shared cores four ranks' CPU and
wake-ups are the call's latency. The last result of each mode is checked exact.

    python benchmarks/bench_small_calls.py [--sizes-mb 0.004096,1] [--calls 1500]
        [--kind all_to_all] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench_common import join_oddl_and_gloo, rank_worker_main, ranks_on_direct_links

MODES = ("in_rank", "gloo")


def _threads_cpu() -> dict[str, float]:
    """CPU seconds (user + system) per thread of this process, by thread name with digits
    folded (the stream readers `n0-from-n1`... sum up as `n#-from-n#`)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = names.get(int(tid), stat[stat.index("(") + 1:stat.rindex(")")])
        key = "".join("#" if c.isdigit() else c for c in name)
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _loop(calls: int, call: Any) -> dict[str, Any]:
    """Time `calls` calls of `call` back to back: per call, wall and CPU ms, CPU ms by
    thread, context switches."""
    before, usage = _threads_cpu(), resource.getrusage(resource.RUSAGE_SELF)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after, used = _threads_cpu(), resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_ms": wall / calls * 1e3, "cpu_ms": cpu / calls * 1e3,
            "threads_ms": {k: (v - before.get(k, 0.0)) / calls * 1e3 for k, v in after.items()
                           if v > before.get(k, 0.0)},
            "vcsw": (used.ru_nvcsw - usage.ru_nvcsw) / calls,
            "ivcsw": (used.ru_nivcsw - usage.ru_nivcsw) / calls}


PROFILE_DIR = "ODDL_BENCH_PROFILE"
"""Set to a folder: each rank's loops run under cProfile, their statistics written there as
`<mode>-<size>MB-rank<r>.pstats` (read them with `python -m pstats`). The profiler slows the
calls: the timings of such a run are not the benchmark's."""


def _profiled(name: str, fn: Any, *args: Any) -> Any:
    """`fn(*args)`, under cProfile when `PROFILE_DIR` names a folder."""
    folder = os.environ.get(PROFILE_DIR)
    if not folder:
        return fn(*args)
    import cProfile

    profile = cProfile.Profile()
    try:
        return profile.runcall(fn, *args)
    finally:
        profile.dump_stats(os.path.join(folder, f"{name}.pstats"))


KIND_ENV = "ODDL_BENCH_KIND"
"""The call the ranks time (`--kind` sets it for them): ``all_reduce`` (default) or
``all_to_all`` (`dist.all_to_all_single` of equal blocks)."""


def _call(kind: str, t: Any, out: Any, group: Any) -> None:
    """One call of `kind` on `t` (its result in `t`, or in `out` for the all-to-all)."""
    import torch.distributed as dist

    if kind == "all_to_all":
        dist.all_to_all_single(out, t, group=group)
    else:
        dist.all_reduce(t, group=group)


def _check(kind: str, mode: str, t: Any, out: Any, world: int) -> None:
    """SystemExit unless the call on `t` filled with rank + 1 gave the exact result."""
    if kind == "all_to_all":  # block i from rank i
        got, want = [float(out[0]), float(out[-1])], [1.0, float(world)]
    else:
        got, want = [float(t[0]), float(t[-1])], [world * (world + 1) / 2] * 2
    if got != want:
        raise SystemExit(f"{mode} {kind}: got {got}, want {want}")


def rank_main(sizes_mb: list[float], calls: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_*, ODDL_LOCAL_API set by the parent)."""
    import torch
    import torch.distributed as dist

    import oddl.torch.channel as oc

    kind = os.environ.get(KIND_ENV, "all_reduce")
    rank, gloo = join_oddl_and_gloo(rank_path=True)
    world = dist.get_world_size()
    if oc._channel is None or oc._channel.rank_path is None:
        raise SystemExit("the agents did not lease the data path to the ranks (see the "
                         "ranks' log): this benchmark needs direct links, the ideal network")
    out: dict[str, Any] = {"rank": rank, "sizes": {}}
    try:
        for mb in sizes_mb:
            t = torch.ones(max(world, int(mb * 1e6) // 4 // world * world))
            result = torch.empty_like(t)
            out["sizes"][str(mb)] = {}
            for mode in MODES:
                group = gloo if mode == "gloo" else None
                for _ in range(20):  # warm-up: the lease, the buffers
                    _call(kind, t.fill_(1.0), result, group)
                dist.barrier(group=gloo)
                out["sizes"][str(mb)][mode] = _profiled(
                    f"{mode}-{mb}MB-rank{rank}", _loop,
                    calls, lambda g=group, x=t, y=result: _call(kind, x, y, g))
                t.fill_(float(rank + 1))
                _call(kind, t, result, group)
                _check(kind, mode, t, result, world)
    finally:
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def run(config: Path, sizes_mb: list[float], calls: int, kind: str = "all_reduce"
        ) -> dict[str, Any]:
    """Start the testbed (direct links) and 4 ranks timing `kind`; return rank 0's
    summary."""
    os.environ[KIND_ENV] = kind
    load_before = [round(x, 2) for x in os.getloadavg()]
    results, _rate = ranks_on_direct_links(__file__, config, "bench-small-calls", "ring",
                                           "ideal", sizes_mb, calls, 4)
    r0 = next(r for r in results if r["rank"] == 0)
    return {"bench": "small_calls", "kind": kind, "collective": "ring", "links": "direct",
            "calls": calls,
            "nodes": 4, "sizes": r0["sizes"], "load_before": load_before,
            "load": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="0.004096,1")
    parser.add_argument("--calls", "--repeats", dest="repeats", type=int, default=1500,
                        help="calls per size and mode (default %(default)s)")
    parser.add_argument("--kind", default="all_reduce", choices=("all_reduce", "all_to_all"),
                        help="the call to time (default %(default)s)")
    return rank_worker_main(parser, argv, rank_main,
                            lambda a, sizes: run(Path(a.config), sizes, a.repeats, a.kind),
                            table)


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    lines = [f"{summary.get('kind', 'all_reduce')} back to back, ring on direct links, 4 ranks, float32, "
             f"{summary['calls']} calls (rank 0); load {summary['load_before']} -> "
             f"{summary['load']}",
             f"{'size MB':>9}{'mode':>9}{'wall ms':>9}{'CPU ms':>8}{'vcsw':>7}{'ivcsw':>7}"
             "  CPU ms by thread"]
    for mb, modes in summary["sizes"].items():
        for mode, m in modes.items():
            threads = ", ".join(f"{k} {v:.3f}" for k, v in sorted(
                m["threads_ms"].items(), key=lambda kv: -kv[1]) if v >= 0.005)
            lines.append(f"{float(mb):>9g}{mode:>9}{m['wall_ms']:>9.3f}{m['cpu_ms']:>8.3f}"
                         f"{m['vcsw']:>7.1f}{m['ivcsw']:>7.1f}  {threads}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
