"""Time plan + schedule for ring and halving-doubling all-reduce at N = 4, 64, 1024.

    python benchmarks/bench_scheduler.py [--json] [--repeats R] [--sizes 4 64 1024]

Workload: VGG19's fp32 gradient (143,667,240 parameters, 574.67 MB, itemsize 4) on a one-WSS
TT-FR fabric at 100 Gbit/s with a fast tunable laser (timing below). Each figure is the best
of R repeats with `time.perf_counter`. Beside it runs a trivial baseline at the same N — the
ring's per-step successor permutations built in plain Python, 2(N−1) lists of N ints — and
each result is also given as a ratio to it, so numbers compare across noisy machines.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench_common import best_of, emit, run_meta

from oddl.controller.scheduling import (
    Plan,
    Schedule,
    TimingModel,
    Topology,
    make_plan,
    schedule_plan,
)

VGG19_PARAMS = 143_667_240
ITEMSIZE = 4
COLLECTIVES = ("ring", "halving-doubling")
TIMING = TimingModel(
    tune_s=1e-6,  # fast laser retune (docs/sources.md §6)
    skew_s=1e-7,  # hardware-timestamped PTP
    cdr_s=1e-6,  # receiver clock-recovery lock
    command_s=0.0,  # agents gate from the published schedule: no per-slot command
    wss_settle_s=0.1,  # LCoS, job scale only
    slot_margin_s=1e-6,
    line_rate_bps=100e9,
)


def ring_permutations_baseline(n: int) -> list[list[int]]:
    """The trivial baseline: the ring's successor permutation for each of its 2(N−1) steps."""
    return [[(i + 1) % n for i in range(n)] for _ in range(2 * (n - 1))]


def measure(name: str, n: int, repeats: int, baseline_s: float) -> dict[str, Any]:
    """Measure one collective at one size and return its row."""
    topo = Topology.single_wss(n)
    nodes = topo.node_ids

    def plan_only() -> Plan:
        return make_plan(name, n, VGG19_PARAMS)

    def plan_and_schedule() -> Schedule:
        return schedule_plan(plan_only(), nodes, topo, TIMING, ITEMSIZE)

    plan_s, plan = best_of(repeats, plan_only)
    sched_s, sched = best_of(repeats, lambda: schedule_plan(plan, nodes, topo, TIMING, ITEMSIZE))
    total_s, _ = best_of(repeats, plan_and_schedule)
    return {"collective": name, "n_nodes": n,
            **schedule_row(plan, sched, plan_s, sched_s, total_s, baseline_s)}


def schedule_row(plan: Plan, sched: Schedule, plan_s: float, sched_s: float, total_s: float,
                 baseline_s: float) -> dict[str, Any]:
    """A row's figures: the plan and schedule's size, their times and the baseline's."""
    return {
        "steps": plan.n_steps,
        "slots": len(sched.slots),
        "retunes": sched.reconfigurations,
        "plan_ms": plan_s * 1e3,
        "schedule_ms": sched_s * 1e3,
        "total_ms": total_s * 1e3,
        "baseline_ms": baseline_s * 1e3,
        "ratio_to_baseline": total_s / baseline_s,
        "makespan_ms": sched.makespan_s * 1e3,
        "efficiency": sched.efficiency,
    }


def baseline_s(n: int, repeats: int) -> float:
    """The best time of the trivial baseline at `n` nodes (s)."""
    best, _ = best_of(repeats, lambda: ring_permutations_baseline(n))
    return float(best)


def run(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    """Measure every collective at every size, each beside its baseline, one row per pair."""
    rows = []
    for n in sizes:
        base = baseline_s(n, repeats)
        rows += [measure(name, n, repeats, base) for name in COLLECTIVES]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Format the rows as a fixed-width table."""
    head = (
        f"{'collective':<17}{'N':>5}{'slots':>7}{'retunes':>9}{'plan ms':>9}{'sched ms':>10}"
        f"{'total ms':>10}{'base ms':>9}{'ratio':>7}{'makespan ms':>13}{'eta':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['collective']:<17}{r['n_nodes']:>5}{r['slots']:>7}{r['retunes']:>9}"
            f"{r['plan_ms']:>9.3f}{r['schedule_ms']:>10.3f}{r['total_ms']:>10.3f}"
            f"{r['baseline_ms']:>9.3f}{r['ratio_to_baseline']:>7.2f}{r['makespan_ms']:>13.3f}"
            f"{r['efficiency']:>8.4f}"
        )
    return "\n".join(lines)


def parser(description: str, repeats: int, sizes: list[int]) -> argparse.ArgumentParser:
    """The options of the schedule benchmarks (this one and bench_plans.py)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--repeats", type=int, default=repeats,
                    help="repeats per figure (best is kept)")
    ap.add_argument("--sizes", type=int, nargs="+", default=sizes, help="node counts")
    return ap


def workload_meta(benchmark: str, repeats: int) -> dict[str, Any]:
    """The JSON metadata of the schedule benchmarks: machine, workload and baseline."""
    return run_meta(
        benchmark, repeats=repeats,
        workload=f"VGG19 fp32, {VGG19_PARAMS} params x {ITEMSIZE} B, 100 Gbit/s",
        baseline="ring successor permutations in plain Python, 2(N-1) lists of N ints")


def headline(repeats: int) -> str:
    """The first line of the schedule benchmarks' tables."""
    return (f"VGG19 fp32 ({VGG19_PARAMS * ITEMSIZE / 1e6:.2f} MB), 100 Gbit/s, guard "
            f"{TIMING.guard_s * 1e6:.2f} us, best of {repeats}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, or JSON with --json."""
    args = parser(__doc__.splitlines()[0], 7, [4, 64, 1024]).parse_args(argv)
    rows = run(args.sizes, max(1, args.repeats))
    return emit({**workload_meta("bench_scheduler", args.repeats), "rows": rows}, args.json,
                lambda _: [f"{headline(args.repeats)}; ratio = total / baseline", table(rows)],
                indent=2)


if __name__ == "__main__":
    sys.exit(main())
