"""The control plane at scale (issue 35): one controller process and N lightweight agents.

For each N of --sizes, a testbed of N one-port hosts (oddl/launch/shapes.py `control_plane`,
emulated circuit switches), the emulator host and `oddl controller serve` as processes of
their own, and a `Fleet` of N agents (oddl/launch/fleet.py: the agent's real gRPC and UDP
protocol, one connection each, no data plane) on this process's event loop. Measured:

- register: from the fleet's start until `GetStatus` shows all N alive (registered,
  streaming, beating);
- load: the controller's CPU (% of one core) and resident memory while N agents beat once a
  second, each after four UDP clock probes, over --steady-s; RSS per agent above the idle
  controller's;
- push: `SubmitJob` of a job of all N until every agent heard its assignment;
- barrier: all N send `ReadyCollective` at once; each agent's go arrives t after the sends
  (p50, p99), and the go's size: the largest one an agent got, and all of them together;
- restart: SIGKILL the controller, start it again on the same port and state file; the time
  until all N are back (from the kill and from the new controller's ready line); with
  --kill-in-restart K, K agents killed while it catches up and the time until it declares
  them dead (--kill-at held: once it held a sweep);
- with --throttle-s S, the controller kept behind for S s (benchmarks/throttle.py), agents
  killed meanwhile, and the time until it declares them dead (decision record 0038).

    python benchmarks/bench_control_plane.py [--sizes 4,16,64,256,1024] [--json] [--plot PNG]
    python benchmarks/bench_control_plane.py --replot after=a.json before=b.json --plot PNG
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from bench_common import emit, run_meta
from controller_log import declared_dead, found_held, held_seen
from fleet_procs import LocalCrowd, ProcCrowd
from throttle import throttled

from oddl.launch.processes import ProcessGroup, free_port
from oddl.launch.shapes import control_plane
from oddl.launch.testbed import controller_command, emulators_command
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

TICK = os.sysconf("SC_CLK_TCK")
Crowd = LocalCrowd | ProcCrowd


def cpu_s(pid: int) -> float:
    """A process's user and system CPU time so far, s (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    """A process's resident memory, MB (/proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def alive(stub: pb_grpc.ControllerStub) -> int:
    try:
        status = await stub.GetStatus(pb.GetStatusRequest(), timeout=30)
    except grpc.aio.AioRpcError:
        return 0
    return sum(1 for a in status.agents if a.alive)


async def until_alive(stub: pb_grpc.ControllerStub, n: int, timeout: float) -> float:
    """Seconds until `n` agents are alive (TimeoutError after `timeout`)."""
    t0 = time.perf_counter()
    while await alive(stub) < n:
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"fewer than {n} agents alive after {timeout:.0f} s")
        await asyncio.sleep(max(0.1, n / 2048))  # a status of 1024 agents is not free
    return time.perf_counter() - t0


class Controller:
    """`oddl controller serve` on a fixed port with a state file (so it can restart)."""

    def __init__(self, group: ProcessGroup, resolved: Path, workdir: Path):
        self.group, self.resolved = group, resolved
        self.listen = f"127.0.0.1:{free_port()}"
        self.state = workdir / "controller.sqlite"
        self.start()

    def start(self) -> None:
        self.group.start("controller", controller_command(self.resolved, self.listen,
                                                          self.state), timeout=120)
        self.proc = self.group.procs[-1]

    def kill(self) -> None:
        self.proc.proc.kill()
        self.proc.proc.wait(10)
        self.proc.release()
        self.group.procs.remove(self.proc)

    @property
    def log(self) -> Path:
        return self.group.log_dir / "controller.log"

    @property
    def pid(self) -> int:
        return self.proc.proc.pid


async def measure(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    workdir.mkdir()
    config = workdir / f"control-plane-{n}.toml"
    config.write_text(control_plane(n, args.heartbeat_s), encoding="utf-8")
    resolved = workdir / f"control-plane-{n}.resolved.toml"
    with ProcessGroup(workdir) as group:
        group.start("emulators", emulators_command(config, resolved), timeout=120)
        ctl = Controller(group, resolved, workdir)
        await asyncio.sleep(1.0)
        idle_rss = rss_mb(ctl.pid)
        operator = grpc.aio.insecure_channel(ctl.listen)
        stub = pb_grpc.ControllerStub(operator)
        nodes = [f"n{k}" for k in range(n)]
        fleet: Crowd = (ProcCrowd(ctl.listen, nodes, args.heartbeat_s, args.procs)
                        if args.procs > 1 else LocalCrowd(ctl.listen, nodes, args.heartbeat_s))
        out: dict[str, Any] = {"n": n, "idle_rss_mb": round(idle_rss, 1)}
        try:
            await fleet.start()
            out["register_s"] = await until_alive(stub, n, args.patience)
            await asyncio.sleep(1.0)  # the registrations' burst is over
            h0 = (await fleet.stats())["heartbeats"]
            c0, t0 = cpu_s(ctl.pid), time.perf_counter()
            await asyncio.sleep(args.steady_s)
            cpu = (cpu_s(ctl.pid) - c0) / (time.perf_counter() - t0)
            beats = (await fleet.stats())["heartbeats"] - h0
            rss = rss_mb(ctl.pid)
            out.update(cpu_pct=round(100 * cpu, 1), rss_mb=round(rss, 1),
                       rss_kb_per_agent=round(1024 * (rss - idle_rss) / n, 1),
                       heartbeats_per_s=round(beats / args.steady_s, 1),
                       cpu_us_per_heartbeat=round(1e6 * cpu * args.steady_s / max(1, beats), 1))
            progress(n, "registered and measured the load", out)
            out.update(await collective(fleet, stub, args))
            progress(n, "pushed a job and passed its barrier", out)
            out.update(await restart(fleet, stub, ctl, n, args))
            if args.throttle_s:
                out.update(await throttled(fleet, ctl.pid, ctl.log, args.kill_in_restart or 4,
                                           out.get("killed_nodes", []), args.throttle_s, 4.0,
                                           args.patience))
            stats = await fleet.stats()
            out["fleet_errors"] = stats["errors"]
            out["fleet_beat_gap_max_s"] = stats["beat_gap_max_s"]
        finally:
            await fleet.close()
            await operator.close()
            if args.keep_logs:
                controller_log(workdir, n, args.keep_logs)
    log = controller_log(workdir, n, args.keep_logs)
    # one line of the registry's per loss (the device log repeats each: not counted)
    out["declared_dead"] = sum(1 for line in log.splitlines()
                               if "agent_registry" in line and "stopped answering" in line)
    out["declared_dead_nodes"] = sorted({line.split("node ", 1)[1].split()[0]
                                         for line in log.splitlines() if "agent_registry" in line
                                         and "stopped answering" in line})[:50]
    out["sweeps_held"] = log.count("sweep held")
    return out


def controller_log(workdir: Path, n: int, keep: str | None) -> str:
    """The controller's log (both of its runs), copied to `keep` as controller-N.log."""
    log = (workdir / "controller.log").read_text(errors="replace")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"controller-{n}.log").write_text(log, encoding="utf-8")
    return log


async def measure_all(sizes: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="oddl-cp-") as tmp:
        for n in sizes:
            results.append(await measure(n, args, Path(tmp) / f"n{n}"))
            print(f"[control-plane] N={n}: {results[-1]}", file=sys.stderr, flush=True)
    return results


def progress(n: int, what: str, out: dict[str, Any]) -> None:
    print(f"[control-plane] N={n}: {what}: {out}", file=sys.stderr, flush=True)


async def collective(fleet: Crowd, stub: pb_grpc.ControllerStub,
                     args: argparse.Namespace) -> dict[str, Any]:
    """A job of all N: the push of its assignment, then one barrier and its go."""
    t0 = time.time_ns()
    job = await stub.SubmitJob(pb.SubmitJobRequest(
        name="all", nodes=fleet.nodes, collective=args.collective, network="ideal"),
        timeout=args.patience)
    heard = await fleet.heard("assigned", job.id, t0, args.patience)
    push = [(t - t0) / 1e9 for t in heard["at"]]
    sent = time.time_ns()
    await fleet.ready_all(job.id, 1, [args.elements])
    gone = await fleet.heard("go", job.id, sent, args.patience)
    if gone["errors"]:
        raise RuntimeError(f"the barrier failed: {gone['errors'][0]}")
    lat = np.array([(t - sent) / 1e9 for t in gone["at"]])
    return {"push_s": round(max(push), 4), "barrier_p50_s": round(float(np.percentile(lat, 50)), 4),
            "barrier_p99_s": round(float(np.percentile(lat, 99)), 4),
            "go_bytes": gone["bytes"], "go_bytes_total": gone["bytes_total"], "job": job.id}


async def restart(fleet: Crowd, stub: pb_grpc.ControllerStub, ctl: Controller, n: int,
                  args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL the controller and start it again; the time until all N are back. With
    --kill-in-restart K, the first K agents whose heartbeat the new controller took are
    killed (while it catches up), and the time until it declares them dead is measured."""
    before = await fleet.registrations()
    victims: list[str] = []
    killed = time.perf_counter()
    ctl.kill()
    log_from = ctl.log.stat().st_size
    ctl.start()
    ready = time.perf_counter()
    deadline = ready + args.patience
    out: dict[str, Any] = {"restart_start_s": round(ready - killed, 3)}
    found: asyncio.Task[dict[str, float]] | None = None
    try:
        while True:
            regs, beats = await fleet.registrations(), await fleet.beats()
            if (found or not args.kill_in_restart) and all(
                    c > before[node] for node, c in regs.items() if node not in victims):
                break
            beaten = [v for v, c in regs.items() if c > before[v] and beats[v] >= 1]
            if args.kill_in_restart and not found and len(beaten) >= args.kill_in_restart and (
                    args.kill_at == "beaten" or held_seen(ctl.log, log_from)):
                victims = beaten[:args.kill_in_restart]
                await fleet.kill(victims)
                out["killed_after_ready_s"] = round(time.perf_counter() - ready, 3)
                found = asyncio.create_task(declared_dead(ctl.log, log_from, victims,
                                                          time.perf_counter(), deadline))
            if time.perf_counter() > deadline:
                raise TimeoutError("agents did not re-register after the restart")
            await asyncio.sleep(0.2)
        await until_alive(stub, n - len(victims), max(1.0, deadline - time.perf_counter()))
        back = time.perf_counter()
        out.update(back_after_ready_s=round(back - ready, 3), back_after_kill_s=round(
            back - killed, 3))
        if found is not None:
            times = await found
            out.update(killed_in_restart=len(victims), killed_found=len(times),
                       killed_found_s=round(max(times.values()), 2) if times else None,
                       killed_nodes=victims, killed_found_held=found_held(ctl.log, victims))
    except TimeoutError as exc:  # measured as not back, not a crash of the whole run
        out.update(back_after_ready_s=None, back_after_kill_s=None,
                   restart_error=f"{exc} ({args.patience:.0f} s)")
    return out


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def table(summary: dict[str, Any]) -> list[str]:
    head = (f"{'N':>5} {'register s':>10} {'CPU %':>6} {'RSS MB':>7} {'kB/agent':>8} "
            f"{'µs/beat':>7} {'push s':>7} {'go p50 s':>8} {'go p99 s':>8} {'go kB':>7} {'all MB':>7} "
            f"{'back s':>7} {'dead':>5} {'held':>5} killed found, s")
    lines = [f"control plane: {summary['collective']} job of all N, heartbeat "
             f"{summary.get('heartbeat_s', 1.0)} s, 4 clock probes per beat", head]
    for r in summary["results"]:
        lines.append(f"{r['n']:>5} {r['register_s']:>10.2f} {r['cpu_pct']:>6.1f} "
                     f"{r['rss_mb']:>7.1f} {r['rss_kb_per_agent']:>8.1f} "
                     f"{r['cpu_us_per_heartbeat']:>7.0f} {r['push_s']:>7.3f} "
                     f"{r['barrier_p50_s']:>8.3f} {r['barrier_p99_s']:>8.3f} "
                     f"{r['go_bytes'] / 1e3:>7.1f} "
                     f"{r.get('go_bytes_total', r['go_bytes'] * r['n']) / 1e6:>7.2f} {_s(r['back_after_kill_s']):>7} "
                     f"{r.get('declared_dead', 0):>5} {r.get('sweeps_held', 0):>5} "
                     f"{r.get('killed_found', 0)}/{r.get('killed_in_restart', 0)} "
                     f"{_s(r.get('killed_found_s'))}")
    return lines


PANELS = (
    ("register_s", "registration of all (s)"),
    ("cpu_pct", "controller CPU under heartbeats (% of a core)"),
    ("rss_kb_per_agent", "controller RSS per agent (kB)"),
    ("push_s", "assignment pushed to all (s)"),
    ("barrier_p99_s", "barrier to go, p99 (s)"),
    ("back_after_kill_s", "all back after a controller SIGKILL (s)"),
)


def plot(runs: dict[str, dict[str, Any]], path: str) -> None:
    """Each figure against N (log-log), one line per labelled run, with N and N log N
    guides through the middle size of the first run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    for ax, (key, title) in zip(axes.flat, PANELS, strict=True):
        for label, summary in runs.items():
            rows = [r for r in summary["results"] if r.get(key) is not None]
            ax.plot([r["n"] for r in rows], [r[key] for r in rows], "o-", label=label)
        first = next(iter(runs.values()))["results"]
        mid = first[len(first) // 2]  # the guides pass through the middle size
        n0, y0 = mid["n"], mid.get(key) or 1e-4
        ns = np.array(sorted({r["n"] for s in runs.values() for r in s["results"]}))
        ax.plot(ns, y0 * ns / n0, ":", color="grey", label="∝ N")
        ax.plot(ns, y0 * ns * np.log2(ns) / (n0 * np.log2(n0)), "--", color="grey",
                label="∝ N log N")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("agents N")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("One controller, N agents (benchmarks/bench_control_plane.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4,16,64,256,1024",
                    help="agent counts, comma-separated (default: %(default)s)")
    ap.add_argument("--collective", default="halving-doubling",
                    help="the job's collective (default: %(default)s)")
    ap.add_argument("--elements", type=int, default=1 << 20,
                    help="float32 elements the collective reduces (default: %(default)s)")
    ap.add_argument("--heartbeat-s", type=float, default=1.0,
                    help="the agents' heartbeat interval, [controller] heartbeat_s "
                         "(default: %(default)s)")
    ap.add_argument("--procs", type=int, default=1,
                    help="processes the agents are spread over (default: %(default)s: all on "
                         "this one's event loop)")
    ap.add_argument("--steady-s", type=float, default=5.0,
                    help="seconds of heartbeats to measure the load over (default: %(default)s)")
    ap.add_argument("--patience", type=float, default=600.0,
                    help="seconds any one step may take (default: %(default)s)")
    ap.add_argument("--kill-in-restart", type=int, default=0, metavar="K",
                    help="kill K agents while the restarted controller catches up and time "
                         "until it declares them dead (default: %(default)s)")
    ap.add_argument("--kill-at", choices=("beaten", "held"), default="beaten",
                    help="kill them once they beat to the new controller, or once it also "
                         "held a sweep (default: %(default)s)")
    ap.add_argument("--throttle-s", type=float, default=0.0, metavar="S",
                    help="then keep the controller behind for S s (SIGSTOP 3 s of every 4), "
                         "kill agents and time until it declares them dead (benchmarks/"
                         "throttle.py; default: not)")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy each controller's log here")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    ap.add_argument("--plot", metavar="PNG", help="draw each figure against N into PNG")
    ap.add_argument("--replot", nargs="+", metavar="LABEL=JSON",
                    help="draw --plot from saved --json outputs instead of measuring")
    args = ap.parse_args(argv)
    if args.replot:
        runs = {}
        for item in args.replot:
            label, _, path = item.partition("=")
            runs[label] = json.loads(Path(path).read_text(encoding="utf-8").splitlines()[-1])
        plot(runs, args.plot or "control-plane.png")
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    results = asyncio.run(measure_all(sizes, args))  # one loop: gRPC's asyncio state is per loop
    summary = run_meta("control_plane", collective=args.collective, sizes=sizes,
                       steady_s=args.steady_s, heartbeat_s=args.heartbeat_s, procs=args.procs,
                       results=results)
    if args.plot:
        plot({"measured": summary}, args.plot)
    return emit(summary, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
