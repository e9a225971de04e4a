"""`oddl demo` (= `make demo`): the emulated four-node testbed, end to end.

Starts the emulated devices and optical fabric, the controller and four agents as separate
processes (the same commands a lab runs), trains a small numpy MLP data-parallel on four
workers whose gradient all-reduce goes through the agents, first over the scheduled optical
circuits and then over an ideal electrical network (ungated full mesh, same line rate), and
prints a summary. Every all-reduce result is checked against the exact reduction; the demo
exits 1 if any differs. Everything it started is stopped, also on Ctrl-C and on failure.

On a testbed whose hosts' ports go to an optical circuit switch (``topoopt-12node``) the
collective is TopoOpt's (``topoopt``: its rings on every port, the switch set at admission) on
the circuit network, then a plain ring on one port of the same switch, then the ideal
electrical network with each host's bandwidth that of all its ports.

With ``--collective optinc`` the two runs are ring all-reduce and optinc (both on the optical
network): optinc's results are checked against the exact *quantised* reduction
(`oddl.agents.collective.optinc.optinc_expected`), which they equal except where the OptINC device's
noisy optics missed a level — the device counts those elements, and the demo fails unless every
difference is one of them. The summary compares final accuracy and all-reduce time to ring.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oddl.agents.collective.optinc import optinc_expected
from oddl.common.config import OPTINC, TestbedConfig
from oddl.common.errors import OddlError
from oddl.demo.report import DemoOutcome, build_summary, device_delta, format_summary
from oddl.demo.workload import integer_check, train
from oddl.launch.shipped import find_testbed
from oddl.launch.testbed import DEFAULT_TESTBED, Progress, RunningTestbed, fabric_stats

logger = logging.getLogger(__name__)

def demo_progress(say: Callable[[str], None], config: Path, run_dir: Path) -> Progress:
    """The demos' start-up lines ("starting the controller", ...) as a `launch` progress."""

    def progress(step: int, steps: int, what: str) -> None:
        if step == 1:
            say(f"starting {what} ({config.name}); logs in {run_dir}")
        else:
            say(f"starting {'the ' if what == 'controller' else ''}{what}")

    return progress


def _legs(collective: str, circuit_switched: bool) -> list[tuple[str, str, str]]:
    """(run name, collective, network): optinc is compared with ring, the others with ideal;
    on a circuit switch, also with a ring on one port."""
    if collective == OPTINC:
        return [("ring", "ring", "optical"), (OPTINC, OPTINC, "optical")]
    if circuit_switched:
        return [("optical", collective, "circuit"), ("ring_one_port", "ring", "circuit"),
                ("ideal", collective, "ideal")]
    return [("optical", collective, "optical"), ("ideal", collective, "ideal")]


def default_collective(cfg: TestbedConfig) -> str:
    """ring on ODDL's WSS fabric; TopoOpt's rings where the hosts' ports go to a switch."""
    return "ring" if all(n.on_wss for n in cfg.nodes) else "topoopt"


def _optinc_stats(tb: RunningTestbed, device_id: str) -> dict[str, Any]:
    stats: dict[str, Any] = fabric_stats(tb.launched.fabric).get(OPTINC, {}).get(device_id, {})
    return stats


def _run_leg(tb: RunningTestbed, out: DemoOutcome, leg: tuple[str, str, str],
             iterations: int, say: Callable[[str], None]) -> None:
    """Submit one run's job, train through it, check it, cancel it; results into `out`."""
    name, coll, network = leg
    job = tb.operator.submit(f"demo-{name}", tb.launched.node_ids, coll, network)
    say(f"{job['id']}: {coll} all-reduce on the {network} network")
    expect = None
    if coll == OPTINC:
        dev = tb.cfg.optinc_device(None)
        if dev is None:
            raise OddlError(f"{tb.cfg.name}: no OptINC device; the optinc demo needs one")
        expect = functools.partial(optinc_expected, bits=dev.bits)
        before = _optinc_stats(tb, dev.id)
    else:
        out.problems += integer_check(tb.clients)
    run = out.runs[name] = train(tb.clients, iterations, out.n_params, network, expect=expect)
    if coll == OPTINC:
        assert dev is not None
        out.device = device_delta(dev.id, dev.bits, before, _optinc_stats(tb, dev.id))
        inexact = out.device.get("inexact_elements", 0)
        if run.mismatched_elements > inexact:
            out.problems.append(
                f"optinc: {run.mismatched_elements} result elements differ from the exact "
                f"quantised mean, but the device's optics missed only {inexact}")
    s = run.summary()
    say(f"  {s['iterations']} iterations, median {s['iteration_ms_median']:.1f} ms, "
        f"loss {s['first_loss'] or 0:.3f} → {s['final_loss'] or 0:.3f}, "
        f"accuracy {s['final_accuracy']:.2f}")
    out.jobs[name] = tb.operator.cancel(job["id"])


def run_testbed_demo(config: Path, run_dir: Path, iterations: int, n_params: int,
                     collective: str | None, progress: bool = True,
                     trace: Path | None = None) -> dict[str, Any]:
    """Start everything, run both trainings, stop everything; return the summary. With
    `trace`, every process records its timeline into that folder (docs/how-to/trace-a-run.md)."""
    run_dir.mkdir(parents=True, exist_ok=True)

    def say(msg: str) -> None:
        if progress:
            print(f"[demo] {msg}", flush=True)

    with RunningTestbed(run_dir, config, agent_timeout_s=None,
                         state=run_dir / "controller.sqlite",
                         progress=demo_progress(say, config, run_dir), trace=trace) as tb:
        out = DemoOutcome(tb.cfg, n_params, run_dir)
        collective = collective or default_collective(tb.cfg)
        circuit_switched = not all(n.on_wss for n in tb.cfg.nodes)
        for leg in _legs(collective, circuit_switched):
            _run_leg(tb, out, leg, iterations, say)
        out.status = tb.operator.status()
        out.agent_status = [c.status() for c in tb.clients]
        out.fabric = fabric_stats(tb.launched.fabric) if tb.launched.fabric else {}
        say("stopping everything")
    return build_summary(out, collective)


def run_demo(args: argparse.Namespace) -> int:
    """The `oddl demo` command."""
    config = find_testbed(args.config) if args.config else DEFAULT_TESTBED
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    trace = Path(args.trace) if args.trace else None
    summary = run_testbed_demo(config, run_dir, args.iterations, args.params, args.collective,
                               progress=not args.json, trace=trace)
    if trace is not None:
        from oddl.trace.merge import merge_paths, write_json

        write_json(merge_paths([str(trace)]), str(trace / "timeline.json"))
        if not args.json:
            print(f"[demo] timeline of every process in {trace}/*.trace.json, merged into "
                  f"{trace}/timeline.json (docs/how-to/trace-a-run.md)")
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0 if summary["all_results_exact"] else 1
