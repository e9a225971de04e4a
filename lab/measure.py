"""Issue item 4 on the rig: ring and halving-doubling all-reduce at 1, 16 and 64 MB against
the bounds of the shaped links and against gloo on the same hosts, first call of a new size
against the rest.

Every host runs on one machine, so one clock times them all: a collective's time is from the
last rank's call to the last rank's result. The bounds:
- the line rate: 2(N−1)/N · S · 8 / 1 Gbit/s;
- TCP payload at the MTU (`lab.rig_plan.tcp_bound_s`): what the shaped link can carry of it;
- that, plus the retune guards of the schedule the job runs (`oddl schedule show`: the
  controller's slots for the size from the lasers' channels after the calls): a laser that
  retunes between steps sends nothing while it does, so no system on these links does better.
The baseline: torch's gloo backend under torchrun on the same four hosts and links
(`jobs.gloo_allreduces`), the same payloads, a new process per size as for oddl.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

from lab import jobs
from lab.procedure import DDP_PORT
from lab.report import CheckFailed, Report
from lab.rig import Rig
from lab.rig_plan import LINE_RATE_GBPS, line_rate_bound_s, tcp_bound_s
from lab.steps import TESTBED, ok_or_fail

SIZES_MB = (1, 16, 64)
CALLS = 5     # the first call of the size, then four more
ITEMSIZE = 8  # the workers' int64 payloads
RUNS = (("ring", None), ("halving-doubling", None), ("ring", "ideal"))
"""(collective, network) of the jobs measured; None: the lab file's network (optical)."""
GLOO_PORTS = {size: DDP_PORT + 10 + i for i, size in enumerate(SIZES_MB)}
TORCH_PORTS = {size: DDP_PORT + 20 + i for i, size in enumerate(SIZES_MB)}
"""Each size's torchrun rendezvous port: a new one per torchrun, apart from DDP's."""


def collective_times(calls: jobs.Calls) -> list[float]:
    """Per step: the last rank's end minus the last rank's start (s)."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for r in calls.exact:
        steps.setdefault(int(r["step"]), []).append(r)
    return [max(r["end"] for r in rs) - max(r["start"] for r in rs)
            for _, rs in sorted(steps.items())]


def timed_row(rig: Rig, collective: str, size_mb: int, tag: str, summary: str,
              guard_s: float) -> dict[str, Any]:
    """One size's times (from the calls of `tag`) against the bounds."""
    nbytes = size_mb * 1_000_000
    calls = jobs.read_calls(rig, tag)
    times = collective_times(calls)
    if len(times) != CALLS:
        raise CheckFailed(f"{tag}: {len(times)} complete steps of {CALLS} ({summary})")
    bound = line_rate_bound_s(nbytes, len(rig.plan.nodes))
    tcp = tcp_bound_s(nbytes, len(rig.plan.nodes), rig.plan.mtu)
    rest = statistics.median(times[1:])
    return {"collective": collective, "size_mb": size_mb, "first_s": times[0], "rest_s": rest,
            "bound_s": bound, "ratio": rest / bound, "first_over_rest_s": times[0] - rest,
            "mtu": rig.plan.mtu, "tcp_bound_s": tcp, "ratio_tcp": rest / tcp,
            "guard_s": guard_s, "ratio_guarded": rest / (tcp + guard_s),
            **_rank_path(calls)}


def _rank_path(calls: jobs.Calls) -> dict[str, Any]:
    """{"rank_path": whether every call ran on the rank path} where the calls say."""
    said = [r["rank_path"] for r in calls.exact if "rank_path" in r]
    return {"rank_path": all(said)} if said else {}


def retune_guards_s(rig: Rig, job: str, nbytes: int) -> float:
    """The retune guards (s) of the slots the controller gives `job` for `nbytes` now."""
    done = rig.oddl(rig.plan.controller, "schedule", "show", job, "--bytes", str(nbytes),
                    "--itemsize", str(ITEMSIZE), "--config", TESTBED, "--json")
    ok_or_fail(done, f"oddl schedule show {job} --bytes {nbytes}")
    return float(json.loads(done.stdout).get("guard_total_s", 0.0))


def measure_size(rig: Rig, job: str, label: str, size_mb: int, ideal: bool
                 ) -> dict[str, Any]:
    """`AgentClient.allreduce` on every host (the agent moves the bytes)."""
    nbytes = size_mb * 1_000_000
    tag = f"bench-{_slug(label)}-{size_mb}MB"
    summary = jobs.exact_allreduces(rig, job, tag, CALLS, nbytes // ITEMSIZE)
    guards = 0.0 if ideal else retune_guards_s(rig, job, nbytes)  # no laser on the ideal network
    return timed_row(rig, label, size_mb, tag, summary, guards)


def measure_torch(rig: Rig, size_mb: int, job: str | None, label: str) -> dict[str, Any]:
    """`dist.all_reduce` under torchrun: on gloo (`job` None) or on the oddl backend."""
    tag = f"bench-{_slug(label)}-{size_mb}MB"
    ports = GLOO_PORTS if job is None else TORCH_PORTS
    summary = jobs.torch_allreduces(rig, tag, CALLS, size_mb * 1_000_000 // ITEMSIZE,
                                    ports[size_mb], job)
    return timed_row(rig, label, size_mb, tag, summary, 0.0)


def _slug(label: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in label).split())


def against_gloo(rows: list[dict[str, Any]]) -> None:
    """Each oddl row's steady time and first call beside gloo's of its size."""
    gloo = {r["size_mb"]: r for r in rows if r["collective"] == "gloo"}
    for row in rows:
        base = gloo.get(row["size_mb"])
        if base is not None and row is not base:
            row["gloo_rest_s"], row["ratio_gloo"] = base["rest_s"], row["rest_s"] / base["rest_s"]
            row["gloo_first_over_rest_s"] = base["first_over_rest_s"]


def run(rig: Rig, report: Report) -> None:
    rows: list[dict[str, Any]] = []

    def measured(name: str, take: Callable[[], dict[str, Any]]) -> None:
        def one() -> str:
            row = take()
            rows.append(row)
            return (f"{row['rest_s'] * 1e3:.0f} ms = {row['ratio']:.2f}× the bound at "
                    f"{LINE_RATE_GBPS:g} Gbit/s; first call {row['first_s'] * 1e3:.0f} ms")
        report.check(f"measure: {name}", one)

    for size in SIZES_MB:
        measured(f"gloo {size} MB (the baseline)", partial(measure_torch, rig, size, None,
                                                           "gloo"))
    for collective, network in RUNS:
        job = jobs.submit(rig, collective, network)
        label = collective if network is None else f"{collective}, {network} network"
        for size in SIZES_MB:
            measured(f"{label} {size} MB", partial(measure_size, rig, job, label, size,
                                                   network == "ideal"))
        if network == "ideal":
            torch_label = f"{label}, dist.all_reduce"
            for size in SIZES_MB:
                measured(f"{torch_label} {size} MB",
                         partial(measure_torch, rig, size, job, torch_label))
        jobs.cancel(rig, job)
    against_gloo(rows)
    report.measurements["allreduce"] = rows
