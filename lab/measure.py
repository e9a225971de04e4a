"""Issue item 4 on the rig: ring and halving-doubling all-reduce at 1, 16 and 64 MB against
the line-rate bound of the shaped links, first call of a new size against the rest.

Every host runs on one machine, so one clock times them all: a collective's time is from the
last rank's call to the last rank's result.
"""

from __future__ import annotations

import statistics
from typing import Any

from lab import jobs
from lab.report import CheckFailed, Report
from lab.rig import Rig
from lab.rig_plan import LINE_RATE_GBPS, line_rate_bound_s, tcp_bound_s

SIZES_MB = (1, 16, 64)
CALLS = 5     # the first call of the size, then four more


def collective_times(calls: jobs.Calls) -> list[float]:
    """Per step: the last rank's end minus the last rank's start (s)."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for r in calls.exact:
        steps.setdefault(int(r["step"]), []).append(r)
    return [max(r["end"] for r in rs) - max(r["start"] for r in rs)
            for _, rs in sorted(steps.items())]


def measure_size(rig: Rig, job: str, collective: str, size_mb: int) -> dict[str, Any]:
    nbytes = size_mb * 1_000_000
    tag = f"bench-{collective}-{size_mb}MB"
    summary = jobs.exact_allreduces(rig, job, tag, CALLS, nbytes // 8)
    times = collective_times(jobs.read_calls(rig, tag))
    if len(times) != CALLS:
        raise CheckFailed(f"{tag}: {len(times)} complete steps of {CALLS} ({summary})")
    bound = line_rate_bound_s(nbytes, len(rig.plan.nodes))
    tcp = tcp_bound_s(nbytes, len(rig.plan.nodes), rig.plan.mtu)
    rest = statistics.median(times[1:])
    return {"collective": collective, "size_mb": size_mb, "first_s": times[0], "rest_s": rest,
            "bound_s": bound, "ratio": rest / bound, "first_over_rest_s": times[0] - rest,
            "mtu": rig.plan.mtu, "tcp_bound_s": tcp, "ratio_tcp": rest / tcp}


def run(rig: Rig, report: Report) -> None:
    rows: list[dict[str, Any]] = []
    for collective in ("ring", "halving-doubling"):
        job = jobs.submit(rig, collective)
        for size in SIZES_MB:
            def one(collective: str = collective, size: int = size, job: str = job) -> str:
                row = measure_size(rig, job, collective, size)
                rows.append(row)
                return (f"{row['rest_s'] * 1e3:.0f} ms = {row['ratio']:.2f}× the bound at "
                        f"{LINE_RATE_GBPS:g} Gbit/s; first call {row['first_s'] * 1e3:.0f} ms")
            report.check(f"measure: {collective} {size} MB", one)
        jobs.cancel(rig, job)
    report.measurements["allreduce"] = rows
