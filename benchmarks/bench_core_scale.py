"""The controller's core alone at N agents: what a barrier and a restart cost it (issue 35).

No gRPC and no processes: one `ControllerCore` in this process, N agents registered with a
data address each, a halving-doubling job of all N (network ideal, as bench_control_plane.py
runs it). Measured, best of --repeats, per N:

- readies: N − 1 `ReadyCollective`s entering the barrier;
- go: the last ready, its schedule and every node's go queued (`CollectiveGo`), the first
  barrier's (the bucket's first) and the best of the later ones, and the size of one node's
  go;
- announce: the job announced to all N (what a burst of registrations ends in);
- opens: N schedule streams opened (each gets its job's assignment first), as after a
  controller restart.

    python benchmarks/bench_core_scale.py [--sizes 64,256,1024] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench_common import emit, run_meta

from oddl.common.config import parse_testbed
from oddl.controller.core import ControllerCore
from oddl.controller.devices import DeviceManager
from oddl.launch.shapes import control_plane
from oddl.protos import oddl_pb2 as pb


def _core(n: int) -> tuple[ControllerCore, list[str], str]:
    cfg = parse_testbed(control_plane(n), "control-plane.toml")
    core = ControllerCore(cfg, DeviceManager(cfg))
    nodes = [f"n{k}" for k in range(n)]
    for k, node in enumerate(nodes):
        core.register(pb.RegisterAgentRequest(node_id=node, data_address=f"tcp://h{k}:5600"))
    core.announcer.settle()
    job = core.submit(pb.SubmitJobRequest(name="all", nodes=nodes, collective="halving-doubling",
                                          network="ideal"))
    core.announcer.settle()
    return core, nodes, job.id


def _drain(core: ControllerCore, nodes: list[str]) -> int:
    """Empty every node's queue; the size of n0's last go."""
    size = 0
    for node in nodes:
        queue = core.registry.agents[node].events
        while (event := queue.get_nowait()) is not None:
            if node == nodes[0] and event.HasField("go"):
                size = event.ByteSize()
    return size


def measure(n: int, repeats: int) -> dict[str, Any]:
    core, nodes, job_id = _core(n)
    best: dict[str, float] = {}
    go_bytes = 0
    for seq in range(1, repeats + 1):
        reqs = [pb.ReadyCollectiveRequest(job_id=job_id, seq=seq, node_id=node, shape=[1 << 20],
                                          dtype="<f4") for node in nodes]
        _drain(core, nodes)
        t0 = time.perf_counter()
        for r in reqs[:-1]:
            core.ready(r)
        t1 = time.perf_counter()
        core.ready(reqs[-1])
        t2 = time.perf_counter()
        go_bytes = _drain(core, nodes)
        core._announce({job_id})  # noqa: SLF001 (what the announcer calls)
        t3 = time.perf_counter()
        for node in nodes:
            core.open_stream(node)
        t4 = time.perf_counter()
        _drain(core, nodes)
        for key, value in (("readies_ms", t1 - t0), ("go_ms", t2 - t1), ("announce_ms", t3 - t2),
                           ("opens_ms", t4 - t3)):
            best[key] = min(best.get(key, value), value)
        best.setdefault("first_go_ms", t2 - t1)
    core.close()
    return {"n": n, **{k: round(v * 1e3, 1) for k, v in best.items()}, "go_bytes": go_bytes}


def table(summary: dict[str, Any]) -> list[str]:
    lines = ["the controller's core alone, halving-doubling job of all N (best of the repeats)",
             f"{'N':>5} {'readies ms':>10} {'first go ms':>11} {'go ms':>7} {'go B':>7} "
             f"{'announce ms':>11} {'opens ms':>8}"]
    for r in summary["results"]:
        lines.append(f"{r['n']:>5} {r['readies_ms']:>10.1f} {r['first_go_ms']:>11.1f} "
                     f"{r['go_ms']:>7.1f} {r['go_bytes']:>7} {r['announce_ms']:>11.1f} "
                     f"{r['opens_ms']:>8.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64,256,1024", help="agents (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="barriers per size")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args(argv)
    results = [measure(int(s), args.repeats) for s in args.sizes.split(",")]
    return emit(run_meta("core_scale", results=results), args.json, table)


if __name__ == "__main__":
    sys.exit(main())
