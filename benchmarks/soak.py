"""`make soak`: training-like traffic on the emulated testbed while a chaos schedule kills,
stalls and restarts its processes; counts what a lab would quote.

    python benchmarks/soak.py                  # 10 minutes
    python benchmarks/soak.py --minutes 60 --fault-every 20 --json soak.json

Two jobs run at once on disjoint nodes (ring on n0, n1; halving-doubling on n2, n3), each a
loop of all-reduces of mixed sizes (1 k – 1 M int64 elements, every result checked exactly).
Every `--fault-every` seconds the next fault of the schedule strikes:

- agent-kill: SIGKILL of one agent, restarted 1 s later on the same local API address (as
  a unit with a fixed `--local-api` does), the training loop keeping its client;
- agent-stall: SIGSTOP of one agent for 2 s (longer than three heartbeats), then SIGCONT;
- agent-pause: SIGSTOP for 0.2 s (frames delayed, not a detectable death);
- stream-cut: every TCP data stream into one node destroyed by the kernel (`ss -K`, frames
  in flight dropped; the senders reconnect and resend);
- controller-kill: SIGKILL of the controller, restarted from its state file; jobs, device
  configuration and the event log are compared before and after;
- emulators-kill: SIGKILL of the emulator host (every laser, switch, meter and the light),
  restarted 1 s later where it was, in its power-on state: the controller must notice and
  restore the devices, the agents must find the new light table.

Reported: collectives run, completed, failed with a reason (and the reasons), wrong results
(must be 0), unclear failures (an error without a reason: must be 0), and per fault the time
to detection (the first failure a participant saw, or the controller marking the agent dead)
and to recovery (the next exact result of every affected job), and the state lost over
controller restarts (must be none).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oddl.agents.client.every_rank import allreduce_all
from oddl.common.errors import OddlError
from oddl.launch.testbed import DEFAULT_TESTBED, RestartableTestbed
from oddl.operator.client import OperatorClient

JOBS = {"soak-ring": (("n0", "n1"), "ring"), "soak-hd": (("n2", "n3"), "halving-doubling")}
SIZES = (1_000, 10_000, 100_000, 1_000_000)
SCHEDULE = ("agent-kill", "stream-cut", "agent-pause", "controller-kill", "agent-stall",
            "emulators-kill")


@dataclass
class JobTraffic:
    """What one job's loop saw."""

    name: str
    nodes: tuple[str, ...]
    run: int = 0
    ok: int = 0
    failed: int = 0
    wrong: int = 0
    unclear: int = 0
    reasons: Counter = field(default_factory=Counter)
    last_ok: float = 0.0
    failures: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _reason(exc: BaseException) -> str:
    """A short class of the error message (node ids and numbers folded)."""
    text = re.sub(r"\bn\d+\b", "nX", str(exc))
    text = re.sub(r"[\d.]+", "#", text)
    return text[:110]


class Soak:
    """The testbed, the two traffic loops and the chaos schedule."""

    def __init__(self, workdir: Path, seed: int):
        self.tb = RestartableTestbed(workdir, DEFAULT_TESTBED, heartbeat_s=0.3,
                                     agent_timeout_s=15.0)
        self.op = OperatorClient(self.tb.address, timeout_s=10)
        self.rng = np.random.default_rng(seed)
        self.stop = threading.Event()
        self.traffic = {name: JobTraffic(name, nodes) for name, (nodes, _) in JOBS.items()}
        self.job_ids = {name: self.op.submit(name, list(nodes), coll, "optical")["id"]
                        for name, (nodes, coll) in JOBS.items()}
        self.client_lock = threading.Lock()
        self.faults: list[dict[str, Any]] = []
        self.state_checks: list[dict[str, Any]] = []

    # ---- traffic ----------------------------------------------------------------------
    def loop(self, t: JobTraffic, seed: int) -> None:
        rng = np.random.default_rng(seed)
        iteration = 0
        while not self.stop.is_set():
            iteration += 1  # the loop's own step number: clients made anew after an agent
            n = int(rng.choice(SIZES))  # restart pair with the others' calls (`step=`)
            arrays = [rng.integers(-1000, 1000, n) for _ in t.nodes]
            exact = np.sum(arrays, axis=0)
            with self.client_lock:
                clients = [self.tb.clients[node] for node in t.nodes]
            _, outs = allreduce_all(clients, arrays, step=iteration)
            now = time.monotonic()
            with t.lock:
                t.run += 1
                bad = [o for o in outs if not isinstance(o, np.ndarray)]
                if not bad:
                    if all(np.array_equal(o, exact) for o in outs):
                        t.ok += 1
                        t.last_ok = now
                    else:
                        t.wrong += 1
                    continue
                t.failed += 1
                t.failures.append(now)
                for o in bad:
                    if isinstance(o, OddlError) and str(o):
                        t.reasons[_reason(o)] += 1
                    else:
                        t.unclear += 1
                        t.reasons[f"UNCLEAR {type(o).__name__}: {_reason(o)}"] += 1
            time.sleep(0.2)  # a failing job does not spin

    # ---- chaos ------------------------------------------------------------------------
    def _job_of(self, node: str) -> JobTraffic:
        return next(t for t in self.traffic.values() if node in t.nodes)

    def _first_failure_after(self, jobs: list[JobTraffic], t0: float, until: float) -> float | None:
        times = [f for t in jobs for f in t.failures if t0 <= f <= until]
        return min(times) - t0 if times else None

    def _wait_recovered(self, jobs: list[JobTraffic], since: float, timeout: float = 120.0
                        ) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stop.is_set():
            if all(t.last_ok > since for t in jobs):
                return max(t.last_ok for t in jobs) - since
            time.sleep(0.05)
        return None

    def _marked_dead(self, node: str, timeout: float) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                agents = {a["node_id"]: a for a in self.op.status()["agents"]}
                if not agents[node]["alive"]:
                    return time.monotonic() - t0
            except OddlError:
                pass
            time.sleep(0.05)
        return None

    def strike(self, kind: str) -> dict[str, Any]:
        node = str(self.rng.choice(["n0", "n1", "n2", "n3"]))
        t0 = time.monotonic()
        rec: dict[str, Any] = {"fault": kind, "at_s": round(t0 - self.t_start, 1)}
        if kind == "agent-kill":
            rec["node"] = node
            jobs = [self._job_of(node)]
            os.kill(self.tb.proc(f"agent-{node}").proc.pid, signal.SIGKILL)
            dead = self._marked_dead(node, 10)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
            with self.client_lock:
                self.tb.start_agent(node, keep_address=True)
            back = time.monotonic()
            rec["controller_marked_dead_s"] = dead
        elif kind in ("agent-stall", "agent-pause"):
            rec["node"] = node
            jobs = [self._job_of(node)]
            pause = 2.0 if kind == "agent-stall" else 0.2
            pid = self.tb.proc(f"agent-{node}").proc.pid
            os.kill(pid, signal.SIGSTOP)
            dead = self._marked_dead(node, pause) if kind == "agent-stall" else None
            time.sleep(max(0.0, pause - (time.monotonic() - t0)))
            os.kill(pid, signal.SIGCONT)
            back = time.monotonic()
            rec["controller_marked_dead_s"] = dead
        elif kind == "emulators-kill":
            jobs = list(self.traffic.values())
            os.kill(self.tb.proc("emulators").proc.pid, signal.SIGKILL)
            time.sleep(1.0)
            self.tb.restart_emulators()
            back = time.monotonic()
        elif kind == "stream-cut":
            rec["node"] = node
            jobs = [self._job_of(node)]
            port = self.tb.data_port(node)
            cut = subprocess.run(["ss", "-K", f"( sport = :{port} or dport = :{port} )"],
                                 capture_output=True, text=True)
            rec["streams_cut"] = max(0, len(cut.stdout.splitlines()) - 1)
            back = time.monotonic()
        else:
            jobs = list(self.traffic.values())
            before = self._state()
            os.kill(self.tb.proc("controller").proc.pid, signal.SIGKILL)
            time.sleep(0.5)
            self.tb.restart_controller()
            back = time.monotonic()
            self._wait_agents_alive(60)
            after = self._state()
            lost = _state_lost(before, after)
            self.state_checks.append({"at_s": rec["at_s"], "lost": lost})
            rec["state_lost"] = lost
        rec["recovered_s"] = self._wait_recovered(jobs, back)
        rec["first_failure_s"] = self._first_failure_after(jobs, t0, time.monotonic())
        rec["down_s"] = round(back - t0, 2)
        return rec

    def _wait_agents_alive(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if all(a["alive"] for a in self.op.status()["agents"]):
                    return
            except OddlError:
                pass
            time.sleep(0.1)

    def _state(self) -> dict[str, Any]:
        jobs = {j["id"]: j["state"] for j in self.op.jobs()}
        devices = {d["id"]: d.get("channel") for d in self.op.devices()["devices"]}
        events = len(self.op.device_log(limit=100000))
        return {"jobs": jobs, "devices": devices, "events": events}

    def run(self, minutes: float, fault_every: float, schedule: tuple[str, ...] = SCHEDULE
            ) -> dict[str, Any]:
        self.t_start = time.monotonic()
        threads = [threading.Thread(target=self.loop, args=(t, i), daemon=True)
                   for i, t in enumerate(self.traffic.values())]
        for th in threads:
            th.start()
        end = self.t_start + minutes * 60
        i = 0
        while time.monotonic() + fault_every < end:
            if self.stop.wait(fault_every):
                break
            rec = self.strike(schedule[i % len(schedule)])
            self.faults.append(rec)
            print(json.dumps(rec), flush=True)
            i += 1
        self.stop.wait(max(0.0, end - time.monotonic()))
        self.stop.set()
        for th in threads:
            th.join(timeout=60)
        return self.report(time.monotonic() - self.t_start)

    def report(self, seconds: float) -> dict[str, Any]:
        jobs = {t.name: {"run": t.run, "ok": t.ok, "failed_with_reason": t.failed - 0,
                         "wrong": t.wrong, "unclear": t.unclear,
                         "reasons": dict(t.reasons.most_common(12))}
                for t in self.traffic.values()}
        by_kind: dict[str, dict[str, Any]] = {}
        for kind in SCHEDULE:
            recs = [f for f in self.faults if f["fault"] == kind]
            if not recs:
                continue
            rec_times = [f["recovered_s"] for f in recs if f["recovered_s"] is not None]
            det = [f.get("controller_marked_dead_s") or f.get("first_failure_s")
                   for f in recs]
            det = [d for d in det if d is not None]
            by_kind[kind] = {"count": len(recs),
                             "detect_s_median": _med(det), "detect_s_max": _max(det),
                             "recover_s_median": _med(rec_times), "recover_s_max": _max(rec_times),
                             "not_recovered": sum(f["recovered_s"] is None for f in recs)}
        return {"seconds": round(seconds, 1), "jobs": jobs, "faults": by_kind,
                "collectives": sum(t.run for t in self.traffic.values()),
                "completed": sum(t.ok for t in self.traffic.values()),
                "failed_with_reason": sum(t.failed for t in self.traffic.values()),
                "wrong_results": sum(t.wrong for t in self.traffic.values()),
                "unclear_failures": sum(t.unclear for t in self.traffic.values()),
                "state_lost": [c for c in self.state_checks if c["lost"]],
                "controller_restarts": len(self.state_checks),
                "fault_log": self.faults}

    def close(self) -> None:
        self.op.close()
        self.tb.close()


def _state_lost(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    lost = [f"job {j} ({s} before, {after['jobs'].get(j, 'missing')} after)"
            for j, s in before["jobs"].items() if after["jobs"].get(j) != s]
    lost += [f"device {d}: channel {c} before, {after['devices'].get(d)} after"
             for d, c in before["devices"].items() if after["devices"].get(d) != c]
    if after["events"] < before["events"]:
        lost.append(f"event log: {before['events']} events before, {after['events']} after")
    return lost


def _med(values: list[float]) -> float | None:
    return round(float(np.median(values)), 2) if values else None


def _max(values: list[float]) -> float | None:
    return round(float(max(values)), 2) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fault-every", type=float, default=15.0, help="seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=",".join(SCHEDULE),
                        help="the schedule, cycled (default %(default)s)")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the processes' logs (in a printed folder) even when it passed")
    args = parser.parse_args(argv)
    unknown = set(args.faults.split(",")) - set(SCHEDULE)
    if unknown:
        parser.error(f"unknown faults {', '.join(sorted(unknown))}; known: {', '.join(SCHEDULE)}")
    tmp = Path(tempfile.mkdtemp(prefix="oddl-soak-"))
    soak = Soak(tmp, args.seed)
    try:
        result = soak.run(args.minutes, args.fault_every, tuple(args.faults.split(",")))
    except BaseException:
        print(f"the soak stopped; the processes' logs are in {tmp}", file=sys.stderr)
        raise
    finally:
        soak.close()
    result["command"] = "python benchmarks/soak.py " + " ".join(argv or sys.argv[1:])
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    ok = (result["wrong_results"] == 0 and result["unclear_failures"] == 0
          and not result["state_lost"]
          and not any(f["not_recovered"] for f in result["faults"].values()))
    if ok and not args.keep_logs:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"the processes' logs are in {tmp}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
