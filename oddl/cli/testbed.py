"""`oddl testbed up|down`: the emulated testbed in the background for interactive use.

`up` starts the emulator host, the controller and one agent per node as detached processes
(the same commands as `oddl demo` and a lab), with logs and a `state.json` under the run
folder; `down` stops everything `up` started. Operator commands find the controller through
that state file when no --controller or ODDL_CONTROLLER is given.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from oddl.common.config import load_testbed
from oddl.common.errors import ConfigError, OddlError
from oddl.launch.processes import ProcessGroup
from oddl.launch.shipped import find_testbed
from oddl.launch.testbed import DEFAULT_TESTBED, Launched, launch_emulated

DEFAULT_RUN_DIR = Path("runs") / "testbed"
STATE_FILE = "state.json"


def load_state(run_dir: Path = DEFAULT_RUN_DIR) -> dict[str, Any] | None:
    """The state of a testbed started with `oddl testbed up`, or None."""
    path = Path(run_dir) / STATE_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _ours(pid: int) -> bool:
    """True if `pid` still runs an oddl command (so a reused pid is never signalled)."""
    try:
        return b"oddl" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _state(launched: Launched, group: ProcessGroup, run_dir: Path) -> dict[str, Any]:
    """What `state.json` keeps: addresses, metrics and the pid of every process."""
    return {"controller": launched.controller,
            "controller_metrics": launched.controller_info.get("metrics", ""),
            "testbed": launched.cfg.name, "resolved": str(launched.resolved),
            "run_dir": str(run_dir), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "agents": {n: {"local_api": a["local_api"], "metrics": a.get("metrics", "")}
                       for n, a in launched.agents.items()},
            "pids": {p.name: p.proc.pid for p in group.procs}}


def cmd_up(args: argparse.Namespace) -> int:
    """Start the emulated testbed in the background."""
    run_dir = Path(args.run_dir)
    state = load_state(run_dir)
    if state and any(_ours(p) for p in state["pids"].values()):
        raise ConfigError(f"a testbed already runs from {run_dir} (controller "
                          f"{state['controller']}); stop it with `oddl testbed down`")
    config = find_testbed(args.config) if args.config else DEFAULT_TESTBED
    load_testbed(config)  # a broken file fails here, before the run folder is made
    run_dir.mkdir(parents=True, exist_ok=True)
    group = ProcessGroup(run_dir)
    try:
        launched = launch_emulated(
            group, config, run_dir, state=run_dir / "controller.sqlite", detach=True,
            trace=Path(args.trace).resolve() if args.trace else None,
            progress=None if args.json else
            lambda step, steps, what: print(f"[{step}/{steps}] {what}", flush=True))
    except BaseException:
        group.stop_all()
        raise
    state = _state(launched, group, run_dir)
    state["trace"] = str(Path(args.trace).resolve()) if args.trace else ""
    for p in group.procs:
        p.release()
    (run_dir / STATE_FILE).write_text(json.dumps(state, indent=1), encoding="utf-8")
    if args.json:
        print(json.dumps(state))
    else:
        print(f"testbed {launched.cfg.name} is up: controller {launched.controller}, "
              f"{len(launched.agents)} agents, logs in {run_dir}")
        print(f"  export ODDL_CONTROLLER={launched.controller}")
        print("  oddl status   # …   oddl testbed down  # to stop it")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """Stop everything `oddl testbed up` started."""
    run_dir = Path(args.run_dir)
    state = load_state(run_dir)
    if state is None:
        raise OddlError(f"no testbed state in {run_dir}; nothing to stop (start one with "
                        "`oddl testbed up`)")
    pids = [p for p in reversed(list(state["pids"].values())) if _ours(p)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + (60 if state.get("trace") else 10)  # traces to write
    while time.monotonic() < deadline and any(_ours(p) for p in pids):
        time.sleep(0.1)
    killed = [p for p in pids if _ours(p)]
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    (run_dir / STATE_FILE).unlink(missing_ok=True)
    msg = {"stopped": len(pids), "killed": len(killed), "run_dir": str(run_dir)}
    print(json.dumps(msg) if args.json else
          f"stopped {len(pids)} processes" + (f" ({len(killed)} had to be killed)" if killed else ""))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `oddl testbed up|down`."""
    tb = sub.add_parser("testbed", help="run the emulated testbed in the background")
    tsub = tb.add_subparsers(dest="testbed_cmd", required=True)
    up = tsub.add_parser("up", help="start it (logs and state under the run folder)")
    up.add_argument("--config", help="testbed file (default: the emulated four-node testbed)")
    up.add_argument("--run-dir", default=str(DEFAULT_RUN_DIR))
    up.add_argument("--json", action="store_true")
    up.add_argument("--trace", metavar="DIR", help="every process records its timeline into "
                    "DIR/<process>.trace.json, written when `oddl testbed down` stops it "
                    "(docs/how-to/trace-a-run.md)")
    up.set_defaults(func=cmd_up)
    down = tsub.add_parser("down", help="stop everything `up` started")
    down.add_argument("--run-dir", default=str(DEFAULT_RUN_DIR))
    down.add_argument("--json", action="store_true")
    down.set_defaults(func=cmd_down)
