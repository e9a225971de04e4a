"""Time plan + schedule of every registered collective at N = 4 and N = 1024.

    python benchmarks/bench_plans.py [--json] [--repeats R] [--sizes 4 1024]

Workload: VGG19's fp32 gradient (143,667,240 parameters, 574.67 MB, itemsize 4) on a one-WSS
TT-FR fabric at 100 Gbit/s with a fast tunable laser (the timing of bench_scheduler.py).
WRHT runs with W = 64 wavelengths, TotientPerms with degree 2 (its default), 4 and 8; a
variant a collective refuses at some N (e.g. degree 8 on 4 nodes) is listed with the reason.

Each time is the best of R repeats with `time.perf_counter` (fewer once a single call takes
over a second); ``total = best plan + best schedule``. Beside each N runs a trivial baseline —
the ring's per-step successor permutations built in plain Python, 2(N−1) lists of N ints — and
every total is also given as a ratio to it, so numbers compare across noisy machines. The aim
is total ≤ 50 ms per collective at N = 1024.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import bench_common
from bench_common import emit
from bench_scheduler import (
    ITEMSIZE,
    TIMING,
    VGG19_PARAMS,
    baseline_s,
    headline,
    parser,
    schedule_row,
    workload_meta,
)

from oddl.common.errors import PlanError
from oddl.controller.scheduling import (
    COLLECTIVES,
    Topology,
    make_plan,
    schedule_plan,
)

AIM_MS = 50.0
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "wrht": [{"wavelengths": 64}],
    "totientperms": [{}, {"degree": 4}, {"degree": 8}],
}
"""Parameter sets per collective (default: one run with no parameters)."""
def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """The best wall time of up to `repeats` calls, fewer once one takes over a second."""
    return bench_common.best_of(repeats, fn, patience_s=1.0)


def label(name: str, params: dict[str, Any]) -> str:
    """Return ``name`` with its parameters, e.g. ``totientperms degree=4``."""
    return " ".join([name, *(f"{k}={v}" for k, v in params.items())])


def measure(
    name: str, params: dict[str, Any], n: int, repeats: int, baseline_s: float
) -> dict[str, Any]:
    """Measure one collective variant at one size and return its row."""
    row: dict[str, Any] = {"collective": name, "params": params, "n_nodes": n}
    try:
        make_plan(name, n, VGG19_PARAMS, **params)
    except PlanError as exc:
        return {**row, "refused": str(exc)}
    topo = Topology.single_wss(n)
    nodes = topo.node_ids
    plan_s, plan = best_of(repeats, lambda: make_plan(name, n, VGG19_PARAMS, **params))
    if plan.n_ranks != n:
        # in-network devices are ranks of the plan (optinc): the testbed gives such a plan
        # its own two-slot schedule, not the TT-FR scheduler's
        return {**row, "steps": plan.n_steps, "plan_ms": plan_s * 1e3, "total_ms": plan_s * 1e3,
                "baseline_ms": baseline_s * 1e3, "ratio_to_baseline": plan_s / baseline_s,
                "within_aim": plan_s * 1e3 <= AIM_MS, "devices": plan.n_ranks - n}
    sched_s, sched = best_of(repeats, lambda: schedule_plan(plan, nodes, topo, TIMING, ITEMSIZE))
    total_s = plan_s + sched_s
    return {**row, **schedule_row(plan, sched, plan_s, sched_s, total_s, baseline_s),
            "within_aim": total_s * 1e3 <= AIM_MS}


def run(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    """Measure every registered collective (and variant) at every size."""
    rows = []
    for n in sizes:
        base = baseline_s(n, repeats)
        rows += [measure(name, params, n, repeats, base)
                 for name in sorted(COLLECTIVES) for params in VARIANTS.get(name, [{}])]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Format the rows as a fixed-width table."""
    head = (
        f"{'collective':<26}{'N':>5}{'steps':>7}{'slots':>7}{'retunes':>10}{'plan ms':>9}"
        f"{'sched ms':>11}{'total ms':>11}{'base ms':>9}{'ratio':>9}{'makespan ms':>13}"
        f"{'eta':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        name = label(r["collective"], r["params"])
        if "refused" in r:
            reason = r["refused"].split(";")[0]
            lines.append(f"{name:<26}{r['n_nodes']:>5}  refused: {reason}")
            continue
        flag = "" if r["within_aim"] or r["n_nodes"] < 1024 else " !"
        if "devices" in r:
            lines.append(f"{name:<26}{r['n_nodes']:>5}{r['steps']:>7}  plan {r['plan_ms']:.3f} ms "
                         f"with {r['devices']} in-network devices (own schedule){flag}")
            continue
        lines.append(
            f"{name:<26}{r['n_nodes']:>5}{r['steps']:>7}{r['slots']:>7}{r['retunes']:>10}"
            f"{r['plan_ms']:>9.3f}{r['schedule_ms']:>11.3f}{r['total_ms']:>11.3f}"
            f"{r['baseline_ms']:>9.3f}{r['ratio_to_baseline']:>9.2f}{r['makespan_ms']:>13.3f}"
            f"{r['efficiency']:>8.4f}{flag}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, or JSON with --json."""
    args = parser(__doc__.splitlines()[0], 5, [4, 1024]).parse_args(argv)
    rows = run(args.sizes, max(1, args.repeats))
    # one line: run_all.py reads the last line
    return emit({**workload_meta("bench_plans", args.repeats), "aim_ms_at_1024": AIM_MS,
                 "rows": rows}, args.json,
                lambda _: [f"{headline(args.repeats)}; total = plan + schedule; ratio = total / "
                           f"baseline; ! = over {AIM_MS:g} ms at N = 1024", table(rows)])


if __name__ == "__main__":
    sys.exit(main())
