"""A controller restart with real agent processes (issue 35, decision record 0038).

`bench_control_plane.py` restarts the controller under a fleet of protocol-speaking agents in
one process; this starts N real `oddl agent serve` processes (the emulated control-plane
testbed of oddl/launch/shapes.py `control_plane`, as `oddl testbed`/`oddl demo` start them, no
training traffic) against `oddl controller serve --state`, SIGKILLs the controller, starts it
again on the same port and state file, and measures:

- start: until every agent process printed its ready line; register: until `GetStatus`
  shows all N alive (registered, streaming, beating);
- each agent process's resident and proportional memory (RSS, PSS: shared pages split
  among the processes that map them), and what the machine has left (MemAvailable);
- restart: from the kill until all N are registered again, and until all N are alive;
  the agents the new controller declared dead on the way, and the sweeps it held.

    python benchmarks/bench_agent_restart.py [--sizes 16,64] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from bench_common import emit, run_meta
from bench_control_plane import Controller, cpu_s

from oddl.launch.processes import ManagedProcess, ProcessGroup
from oddl.launch.shapes import control_plane
from oddl.launch.testbed import agent_command, emulators_command
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc


def memory_mb(pid: int) -> tuple[float, float]:
    """A process's RSS and PSS, MB (/proc/PID/smaps_rollup)."""
    rss = pss = 0.0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Pss:"):
            pss = int(line.split()[1]) / 1024
    return rss, pss


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def counts(stub: pb_grpc.ControllerStub) -> tuple[int, int]:
    """(registered, alive) agents as `GetStatus` tells; (0, 0) while it does not answer."""
    try:
        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    except grpc.RpcError:
        return 0, 0
    return (sum(1 for a in status.agents if a.last_heartbeat_age_s >= 0),
            sum(1 for a in status.agents if a.alive))


def until(stub: pb_grpc.ControllerStub, n: int, since: float, deadline: float
          ) -> tuple[float | None, float | None]:
    """Seconds from `since` until all `n` are registered, and until all are alive (None:
    not by `deadline`)."""
    registered = None
    while time.perf_counter() < deadline:
        reg, alive = counts(stub)
        if registered is None and reg >= n:
            registered = time.perf_counter() - since
        if alive >= n:
            return registered, time.perf_counter() - since
        time.sleep(0.2)
    return registered, None


def start_agents(group: ProcessGroup, resolved: Path, controller: str, nodes: list[str],
                 timeout: float) -> list[ManagedProcess]:
    """Start every node's agent process at once and wait for all their ready lines."""
    procs = [ManagedProcess(f"agent-{n}", agent_command(resolved, n, controller), group.log_dir)
             for n in nodes]
    group.procs.extend(procs)
    with ThreadPoolExecutor(max_workers=min(32, len(procs))) as pool:
        list(pool.map(lambda p: p.wait_ready(timeout), procs))
    return procs


def measure(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    workdir.mkdir()
    config = workdir / f"control-plane-{n}.toml"
    config.write_text(control_plane(n, args.heartbeat_s), encoding="utf-8")
    resolved = workdir / f"control-plane-{n}.resolved.toml"
    out: dict[str, Any] = {"n": n, "mem_available_before_mb": round(mem_available_mb())}
    with ProcessGroup(workdir) as group:
        group.start("emulators", emulators_command(config, resolved), timeout=120)
        ctl = Controller(group, resolved, workdir)
        channel = grpc.insecure_channel(ctl.listen)
        stub = pb_grpc.ControllerStub(channel)
        nodes = [f"n{k}" for k in range(n)]
        t0 = time.perf_counter()
        agents = start_agents(group, resolved, ctl.listen, nodes, args.patience)
        out["start_s"] = round(time.perf_counter() - t0, 2)
        _, alive = until(stub, n, t0, t0 + args.patience)
        out["register_s"] = None if alive is None else round(alive, 2)
        time.sleep(args.steady_s)
        mem = [memory_mb(p.proc.pid) for p in agents]
        c0, w0 = sum(cpu_s(p.proc.pid) for p in agents), time.perf_counter()
        time.sleep(args.steady_s)
        out.update(
            agent_rss_mb=round(sum(m[0] for m in mem) / n, 1),
            agent_pss_mb=round(sum(m[1] for m in mem) / n, 1),
            agents_pss_total_mb=round(sum(m[1] for m in mem)),
            agents_cpu_pct=round(100 * (sum(cpu_s(p.proc.pid) for p in agents) - c0)
                                 / (time.perf_counter() - w0), 1),
            mem_available_mb=round(mem_available_mb()))
        killed = time.perf_counter()
        ctl.kill()
        log_from = ctl.log.stat().st_size
        ctl.start()
        out["restart_start_s"] = round(time.perf_counter() - killed, 2)
        registered, alive = until(stub, n, killed, killed + args.patience)
        out.update(back_registered_s=None if registered is None else round(registered, 2),
                   back_alive_s=None if alive is None else round(alive, 2),
                   agents_exited=sum(1 for p in agents if p.proc.poll() is not None))
        channel.close()
        with ctl.log.open("rb") as f:
            f.seek(log_from)
            log = f.read().decode(errors="replace")
    out["declared_dead"] = sum(1 for line in log.splitlines()
                               if "agent_registry" in line and "stopped answering" in line)
    out["sweeps_held"] = log.count("sweep held")
    return out


def table(summary: dict[str, Any]) -> list[str]:
    lines = [f"controller restart under real agent processes, heartbeat "
             f"{summary['heartbeat_s']} s",
             f"{'N':>4} {'start s':>7} {'reg s':>6} {'RSS MB':>7} {'PSS MB':>7} {'avail MB':>8} "
             f"{'CPU %':>6} {'back reg s':>10} {'back alive s':>12} {'dead':>5} {'held':>5}"]

    def s(v: Any) -> str:
        return "—" if v is None else f"{v}"
    for r in summary["results"]:
        lines.append(f"{r['n']:>4} {r['start_s']:>7} {s(r['register_s']):>6} "
                     f"{r['agent_rss_mb']:>7} {r['agent_pss_mb']:>7} {r['mem_available_mb']:>8} "
                     f"{r['agents_cpu_pct']:>6} {s(r['back_registered_s']):>10} "
                     f"{s(r['back_alive_s']):>12} {r['declared_dead']:>5} {r['sweeps_held']:>5}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16,64", help="agent processes (default: %(default)s)")
    ap.add_argument("--heartbeat-s", type=float, default=1.0,
                    help="[controller] heartbeat_s of the testbed file (default: %(default)s)")
    ap.add_argument("--steady-s", type=float, default=3.0,
                    help="seconds to settle, then to measure CPU over (default: %(default)s)")
    ap.add_argument("--patience", type=float, default=300.0,
                    help="seconds any one step may take (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="oddl-ar-") as tmp:
        for n in sizes:
            results.append(measure(n, args, Path(tmp) / f"n{n}"))
            print(f"[agent-restart] N={n}: {results[-1]}", file=sys.stderr, flush=True)
    summary = run_meta("agent_restart", sizes=sizes, heartbeat_s=args.heartbeat_s,
                       results=results)
    return emit(summary, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
