"""Where each millisecond of one `dist.all_reduce` goes, beside gloo in the same run (issue 36).

Starts the emulated testbed with direct links (as `bench_zero_copy.py`) with
``ODDL_CALL_MARKS`` set, so the agents and the ranks note the time at each point of a call's
path (`oddl.common.call_marks`): the rank's hand-off (torch → the client's request), the
local hop in (the request → the agent's API thread), the agent's queue (API thread →
collectives thread), the start (the schedule on a size's first call; the barrier or the
standing exchange on gated networks), the data steps (each step's send, receive-wait and
reduce time, summed over its chunks), the outcome round (decision record 0016), the reply
inside the agent (collectives thread → API thread), the hop back, and the return to torch.
Per size, each rank makes a first call on a new tensor (a new schedule; its storage moved into
shared memory and adopted at once, decision record 0035), a second and R more, alternating
with gloo's. Before them, from 512 KiB, the rule of decision record 0017 on a tensor 4 KiB
smaller, in the same run (`first0`, `second0`: a new bucket for the first call, the move into
shared memory at the second).

Prints per rank count and size: gloo's and oddl's median (rank 0, which waits for the
slowest, as every rank), their ratio, and the phases of rank 0's median call and of its first
call (ms; faults = minor page faults in the rank / its agent during the call); then each
step of the median call.

    python benchmarks/bench_call_breakdown.py [--sizes-mb 0.004096,1,16,64] [--repeats 7]
        [--ranks 4,2] [--network ideal|optical] [--json]
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

from bench_common import (
    join_oddl_and_gloo,
    rank_worker_main,
    ranks_on_direct_links,
)

from oddl.common.call_marks import ENV as MARKS_ENV

PHASES = (("handoff", "t_call", "client_send"), ("hop_in", "client_send", "agent_in"),
          ("queue", "agent_in", "agent_picked"), ("start", "agent_picked", "data_start"),
          ("data", "data_start", "data_end"), ("outcome", "data_end", "outcome_end"),
          ("reply", "outcome_end", "reply_sent"), ("hop_back", "reply_sent", "client_reply"),
          ("return", "client_reply", "t_return"))
"""(name, from mark, to mark): the phases of one call, in order; they add up to the call."""


def rank_main(sizes_mb: list[float], repeats: int) -> None:
    """One rank: per size a first, a second and `repeats` more calls, gloo's alternating."""
    import torch
    import torch.distributed as dist

    import oddl.torch.channel as oc
    from oddl.common.call_marks import MARKS

    rank, gloo = join_oddl_and_gloo()
    world = dist.get_world_size()
    assert oc._channel is not None
    client = oc._channel.client
    calls: list[dict[str, Any]] = []

    def oddl_call(t: torch.Tensor, mb: float, what: str) -> None:
        t.fill_(1.0)
        dist.barrier(group=gloo)
        MARKS.begin()
        MARKS.mark("t_call")
        dist.all_reduce(t)
        MARKS.mark("t_return")
        record = MARKS.take()
        if float(t[0]) != world or float(t[-1]) != world:
            raise SystemExit(f"oddl: wrong sum {float(t[0])}, {float(t[-1])}")
        record.update(size_mb=mb, what=what, step=max(client.steps.last.values()))
        calls.append(record)

    def gloo_call(t: torch.Tensor, mb: float, what: str) -> None:
        t.fill_(1.0)
        dist.barrier(group=gloo)
        start = time.time_ns()
        dist.all_reduce(t, group=gloo)
        calls.append({"size_mb": mb, "what": what, "gloo_ns": time.time_ns() - start})

    promoter = oc._channel.promoter
    try:
        for mb in sizes_mb:
            n = max(1, int(mb * 1e6) // 4)
            g, o = torch.ones(n), torch.ones(n)
            gloo_call(g, mb, "first")
            if 4 * n >= 2 * promoter.min_bytes:  # promoted: the rule before 0035 first, on a
                # tensor 4 KiB smaller (the bucket it grows cannot hold `o`)
                promoter.eager = False
                old = torch.ones(n - 1024)
                oddl_call(old, mb, "first0")
                oddl_call(old, mb, "second0")
                promoter.eager = True
                del old
            oddl_call(o, mb, "first")
            oddl_call(o, mb, "second")
            for _ in range(repeats):
                gloo_call(g, mb, "steady")
                oddl_call(o, mb, "steady")
            del g, o
    finally:
        dist.destroy_process_group()
    print(json.dumps({"rank": rank, "calls": calls}), flush=True)


def _agent_records(folder: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Every agent's records, by (node, step)."""
    out = {}
    for path in folder.glob("agent-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out[(rec["node"], int(rec["step"]))] = rec
    return out


def phases(rank_rec: dict[str, Any], agent_rec: dict[str, Any]) -> dict[str, Any]:
    """One call's phases (ms) and steps, from the rank's and its agent's marks."""
    marks = {**agent_rec, **rank_rec}
    if "client_send" not in marks:  # a call that sent its bytes over the socket
        marks["client_send"] = marks.get("client_bucket", marks["t_call"])
    out: dict[str, Any] = {}
    for name, a, b in PHASES:
        out[name] = (marks[b] - marks[a]) / 1e6 if a in marks and b in marks else float("nan")
    out["total"] = (marks["t_return"] - marks["t_call"]) / 1e6
    out["faults_rank"] = rank_rec.get("minflt", 0)
    out["faults_agent"] = agent_rec.get("minflt", 0)
    steps = sorted({int(k[1:].split(".")[0]) for k in agent_rec if k.startswith("s")
                    and "." in k and k[1:].split(".")[0].isdigit()})
    start = agent_rec.get("data_start", 0)
    out["steps"] = [{"step": k, **{f: agent_rec.get(f"s{k}.{f}", 0) / 1e6
                                   for f in ("send", "recv", "reduce")},
                     "in_at": (agent_rec.get(f"s{k}.in", start) - start) / 1e6}
                    for k in steps]
    return out


def summarise(results: list[dict[str, Any]], agents: dict[tuple[str, int], dict[str, Any]],
              nodes: list[str], sizes_mb: list[float]) -> list[dict[str, Any]]:
    """Per size: gloo's and oddl's medians at rank 0, their ratio, and the phases of rank 0's
    median and first calls."""
    r0 = next(r for r in results if r["rank"] == 0)
    rows = []
    for mb in sizes_mb:
        mine = [c for c in r0["calls"] if c["size_mb"] == mb]
        gloo = [c["gloo_ns"] / 1e6 for c in mine if "gloo_ns" in c and c["what"] == "steady"]
        gloo_first = next(c["gloo_ns"] / 1e6 for c in mine if "gloo_ns" in c)
        calls = [c for c in mine if "gloo_ns" not in c]
        oddl = {c["what"]: phases(c, agents.get((nodes[0], c["step"]), {})) for c in calls
                if c["what"] != "steady"}
        steady = sorted((phases(c, agents.get((nodes[0], c["step"]), {})) for c in calls
                         if c["what"] == "steady"), key=lambda p: p["total"])
        mid = steady[len(steady) // 2]
        rows.append({"size_mb": mb, "gloo_ms": median(gloo), "gloo_first_ms": gloo_first,
                     "oddl_ms": mid["total"], "x_gloo": mid["total"] / median(gloo),
                     "median": mid, **oddl})
    return rows


def new_bucket_ab(sizes_mb: list[float], repeats: int) -> list[dict[str, Any]]:
    """The first call's copy into a new bucket (a sealed memfd as `MemfdBucket` makes it, and
    the copy of the tensor into it): its pages faulted in one at a time by the copy (as the
    client does) or made when it is mapped (MAP_POPULATE), alternating in this process; the
    medians (ms)."""
    import mmap

    import numpy as np

    rows = []
    for mb in (m for m in sizes_mb if m >= 1):
        src = np.ones(int(mb * 1e6) // 4, dtype=np.float32)
        took: dict[int, list[float]] = {0: [], mmap.MAP_POPULATE: []}
        for _ in range(repeats):
            for flag in took:
                start = time.perf_counter()
                fd = os.memfd_create("bench", os.MFD_CLOEXEC)
                os.ftruncate(fd, src.nbytes)
                mapped = mmap.mmap(fd, src.nbytes, flags=mmap.MAP_SHARED | flag)
                np.copyto(np.frombuffer(mapped, dtype=src.dtype), src)
                took[flag].append((time.perf_counter() - start) * 1e3)
                mapped.close()
                os.close(fd)
        rows.append({"size_mb": mb, "faulted_ms": median(took[0]),
                     "populated_ms": median(took[mmap.MAP_POPULATE])})
    return rows


def run(config: Path, sizes_mb: list[float], repeats: int, ranks: int,
        network: str = "ideal") -> dict[str, Any]:
    """Start the testbed (direct links) with marks on, run `ranks` ranks on a ring job on
    `network` (ideal: no slots; optical: slots, the barrier, then standing schedules); the
    summary."""
    with tempfile.TemporaryDirectory(prefix="call-marks-") as folder:
        os.environ[MARKS_ENV] = folder
        try:
            results, _ = ranks_on_direct_links(__file__, config, "bench-breakdown", "ring",
                                               network, sizes_mb, repeats, ranks)
        finally:
            os.environ.pop(MARKS_ENV, None)
        agents = _agent_records(Path(folder))
    nodes = sorted({n for n, _ in agents})
    return {"ranks": ranks, "repeats": repeats, "loadavg": _loadavg(), "network": network,
            "rows": summarise(results, agents, nodes, sizes_mb)}


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="0.004096,1,16,64")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ranks", default="4,2", help="rank counts, one testbed each")
    parser.add_argument("--network", default="ideal", choices=("ideal", "optical"),
                        help="the job's network: ideal (no slots) or optical (slots gated "
                        "by the schedule: the barrier, then standing schedules)")
    return rank_worker_main(parser, argv, rank_main, lambda a, sizes: {
        "bench": "call_breakdown", "collective": "ring", "links": "direct",
        "runs": [run(Path(a.config), sizes, a.repeats, int(r), a.network)
                 for r in a.ranks.split(",")],
        "new_bucket": new_bucket_ab(sizes, a.repeats), "loadavg": _loadavg()}, table)


def _size(mb: float) -> str:
    return f"{mb * 1e6 / 1024:g}KiB" if mb < 0.5 else f"{mb:g}MB"


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    names = [p[0] for p in PHASES]
    lines = []
    for run_ in summary["runs"]:
        lines += [f"dist.all_reduce, ring on direct links ({run_.get('network', 'ideal')} "
                  f"network), {run_['ranks']} ranks, float32, "
                  f"rank 0's median of {run_['repeats']} and its first call (ms); load "
                  f"{run_['loadavg']}",
                  f"{'size':>9}{'call':>7}{'gloo':>8}{'oddl':>8}{'x gloo':>7}"
                  + "".join(f"{n:>9}" for n in names) + f"{'faults':>12}"]
        for r in run_["rows"]:
            for what in ("median", "second", "first", "second0", "first0"):
                if what not in r:
                    continue
                p = r[what]
                gloo = r["gloo_ms"] if what == "median" else r["gloo_first_ms"]
                shown = gloo if not what.startswith("second") else float("nan")
                lines.append(f"{_size(r['size_mb']):>9}{what:>7}{shown:>8.2f}{p['total']:>8.2f}"
                             f"{p['total'] / gloo:>7.2f}"
                             + "".join(f"{p[n]:>9.2f}" for n in names)
                             + f"{p['faults_rank']:>6}/{p['faults_agent']:<5}")
        lines.append("  first0/second0: the rule before decision record 0035 (promoted at the "
                     "second call)")
        lines.append("  steps of the median call (ms: send, receive wait, reduce; last "
                     "arrival after the data start)")
        for r in run_["rows"]:
            lines.append(f"{_size(r['size_mb']):>9}  " + "  ".join(
                f"s{s['step']} {s['send']:.2f}/{s['recv']:.2f}/{s['reduce']:.2f}@{s['in_at']:.2f}"
                for s in r["median"]["steps"]))
    lines.append(f"a new bucket and the copy into it (median ms; load {summary['loadavg']}):")
    lines += [f"{_size(r['size_mb']):>9}  one fault at a time {r['faulted_ms']:.1f}, "
              f"populated when mapped {r['populated_ms']:.1f} "
              f"(x{r['populated_ms'] / r['faulted_ms']:.2f})" for r in summary["new_bucket"]]
    return lines


if __name__ == "__main__":
    sys.exit(main())
