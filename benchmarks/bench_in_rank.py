"""What the rank moving its own bytes would buy: oddl's executor inside the training process,
against the agent path and gloo, in the same run (issue 36, decision record 0040).

Starts the emulated testbed with direct links and a ring job on its first `--ranks` nodes,
and the rank processes with torchrun's environment. Each joins `init_process_group("oddl")`
and a gloo group of the same ranks, opens a stream link of its own on loopback (the
addresses exchanged over the gloo group, as gloo exchanges its own through the store), and
per size times in alternation, float32, after the same barrier, `--repeats` times each:
- gloo: `dist.all_reduce(t, group=gloo)`;
- agent: `dist.all_reduce(t)` of an adopted tensor (the agent moves the bytes: the path
  users run today);
- in_rank: the same ring plan run by the agents' own executor (`run_collective`, pipelined
  chunks, posted landings) over the rank's stream link, then the outcome round of decision
  record 0016 over the same streams: every part of a call's data path, with no local hop, no
  agent thread hand-off and no agent process in the chunks' way. What it leaves out: the
  start (an ideal network starts at once), the slot gate (open on the ideal network) and the
  report to the controller (off the critical path).
Every result is checked exact against the expected sum. Prints rank 0's medians and the
ratios to gloo.

    python benchmarks/bench_in_rank.py [--sizes-mb 0.004096,1,16,64] [--repeats 9]
        [--ranks 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench_common import join_oddl_and_gloo, rank_worker_main, ranks_on_direct_links

MODES = ("gloo", "agent", "in_rank")


def _ring_steps(world: int, n_elems: int) -> tuple[Any, ...]:
    """The ring plan's steps as an agent decodes them from its schedule."""
    from oddl.controller.scheduling import make_plan
    from oddl.protos.schedule_wire import StepSpec

    plan = make_plan("ring", world, n_elems)
    return tuple(StepSpec(str(s.op), tuple(s.src.tolist()), tuple(s.dst.tolist()),
                          tuple(s.offset.tolist()), tuple(s.length.tolist()))
                 for s in plan.steps)


class InRankRing:
    """The agents' executor and outcome round, run by this rank over its own stream link."""

    def __init__(self, rank: int, world: int, gloo: Any):
        from concurrent.futures import ThreadPoolExecutor

        import torch.distributed as dist

        from oddl.agents.links.streams import StreamLink

        self.rank, self.nodes = rank, tuple(f"r{i}" for i in range(world))
        self.link = StreamLink(self.nodes[rank], "127.0.0.1:0")
        addresses: list[Any] = [None] * world
        dist.all_gather_object(addresses, self.link.address, group=gloo)
        self.link.set_peers({n: a for n, a in zip(self.nodes, addresses, strict=True)})
        self.sender = ThreadPoolExecutor(1, thread_name_prefix="in-rank-send")
        self.seq = 0
        self._steps: dict[int, tuple[Any, ...]] = {}

    def all_reduce(self, t: Any) -> None:
        from oddl.agents.clock import wall
        from oddl.agents.collective.context import CollectiveRun
        from oddl.agents.collective.outcome import agree_outcome
        from oddl.agents.collective.plan_run import run_collective
        from oddl.agents.slot_gate import SlotGate

        n = t.numel()
        steps = self._steps.get(n)
        if steps is None:
            steps = self._steps[n] = _ring_steps(len(self.nodes), n)
        self.seq += 1
        run = CollectiveRun("in-rank", self.seq, self.rank, self.nodes, steps,
                            network="ideal", receive_timeout_s=30)
        run_collective(run, t.numpy(), self.link, SlotGate(), inplace=True, sender=self.sender)
        me = self.nodes[self.rank]
        agree_outcome(self.link, me, "in-rank", self.seq, [p for p in self.nodes if p != me],
                      wall.now() + 60, None, ("all_reduce", "sum", 0))

    def close(self) -> None:
        self.sender.shutdown(wait=True)
        self.link.close()


def rank_main(sizes_mb: list[float], repeats: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_*, ODDL_LOCAL_API set by the parent)."""
    import torch
    import torch.distributed as dist

    import oddl.torch.channel as oc

    rank, gloo = join_oddl_and_gloo()
    world = dist.get_world_size()
    assert oc._channel is not None
    promoter = oc._channel.promoter
    in_rank = InRankRing(rank, world, gloo)
    out: dict[str, Any] = {"rank": rank, "sizes": {}}

    def call(mode: str, t: torch.Tensor) -> float:
        t.fill_(float(rank + 1))
        dist.barrier(group=gloo)
        start = time.perf_counter()
        if mode == "in_rank":
            in_rank.all_reduce(t)
        else:
            dist.all_reduce(t, group=gloo if mode == "gloo" else None)
        took = time.perf_counter() - start
        want = world * (world + 1) / 2
        if float(t[0]) != want or float(t[-1]) != want or float(t[len(t) // 2]) != want:
            raise SystemExit(f"{mode}: wrong sum {float(t[0])}, {float(t[-1])}, want {want}")
        return took

    try:
        for mb in sizes_mb:
            n = max(1, int(mb * 1e6) // 4)
            tensors = {m: torch.ones(n, dtype=torch.float32) for m in MODES}
            for m in MODES:  # warm-up; the agent's tensor is adopted at its first call
                call(m, tensors[m])
                call(m, tensors[m])
            times: dict[str, list[float]] = {m: [] for m in MODES}
            for _ in range(repeats):
                for m in MODES:
                    times[m].append(call(m, tensors[m]))
            out["sizes"][str(mb)] = times
            del tensors
        out["promoted"] = promoter.promoted
    finally:
        in_rank.close()
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def run(config: Path, sizes_mb: list[float], repeats: int, ranks: int) -> dict[str, Any]:
    """Start the testbed (direct links) and `ranks` ranks; return the summary."""
    import os

    results, _rate = ranks_on_direct_links(__file__, config, "bench-in-rank", "ring", "ideal",
                                           sizes_mb, repeats, ranks)
    r0 = next(r for r in results if r["rank"] == 0)
    rows = []
    for mb in sizes_mb:
        med = {m: median(r0["sizes"][str(mb)][m]) for m in MODES}
        rows.append({"size_mb": mb, **{f"{m}_ms": med[m] * 1e3 for m in MODES},
                     "agent_x_gloo": med["agent"] / med["gloo"],
                     "in_rank_x_gloo": med["in_rank"] / med["gloo"]})
    return {"bench": "in_rank", "collective": "ring", "links": "direct", "repeats": repeats,
            "nodes": ranks, "rows": rows, "load": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="0.004096,1,16,64")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--ranks", type=int, default=4,
                        help="ranks on the testbed's first nodes (default %(default)s)")
    return rank_worker_main(parser, argv, rank_main, lambda a, sizes: run(
        Path(a.config), sizes, a.repeats, a.ranks), table)


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    return [f"all-reduce, ring on direct links, {summary['nodes']} ranks, float32, median of "
            f"{summary['repeats']} (rank 0); load {summary['load']}",
            f"{'size':>10}{'gloo':>10}{'agent':>10}{'in rank':>10}{'agent/gloo':>12}"
            f"{'in rank/gloo':>14}",
            *(f"{r['size_mb']:>8g}MB{r['gloo_ms']:>8.2f}ms{r['agent_ms']:>8.2f}ms"
              f"{r['in_rank_ms']:>8.2f}ms{r['agent_x_gloo']:>12.2f}{r['in_rank_x_gloo']:>14.2f}"
              for r in summary["rows"])]


if __name__ == "__main__":
    sys.exit(main())
