"""The rig of one run: its hosts, users, venv, services and emulators, and taking it all
down again (also after a failure, on Ctrl-C, or for a run that crashed or was kept)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from lab import users
from lab.devices import Emulators
from lab.hosts import Hosts, delete_netns, kill_netns_processes
from lab.rig_plan import STATE_ROOT, Host, LabPlan, run_id_of
from lab.services import Service, as_user, clean_env, stop
from lab.shell import pid_alive, run, spawn

ODDL = "/opt/oddl/.venv/bin/oddl"
PYTHON = "/opt/oddl/.venv/bin/python"
REPO = Path(__file__).resolve().parent.parent


class Rig:
    """Everything one run made, so that `teardown` removes exactly that."""

    def __init__(self, plan: LabPlan) -> None:
        self.plan = plan
        self.hosts: Hosts | None = None
        self.services: dict[str, Service] = {}
        self.emulators: Emulators | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.made_users: list[str] = []
        self.seen_buckets: dict[str, set[str]] = {}
        self.logs = plan.run_dir / "logs"

    # ---- state file: what a later `--down` or the next run needs to clean up ----------
    def save_state(self, kept: bool = False) -> None:
        self.plan.run_dir.mkdir(parents=True, exist_ok=True)
        (self.plan.run_dir / "state.json").write_text(json.dumps(
            {"pid": os.getpid(), "made_users": self.made_users, "kept": kept,
             "netns": [h.netns for h in self.plan.hosts] + [self.plan.bridge_netns]}),
            encoding="utf-8")

    @property
    def h(self) -> Hosts:
        assert self.hosts is not None, "the hosts are not up"
        return self.hosts

    # ---- running things inside a host --------------------------------------------------
    def oddl(self, host: Host, *args: str, user: str | None = None, timeout: float = 120,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`oddl ARGS` inside the host, as root (the lab's admin) or as `user`."""
        prefix = self.h.enter(host) + (as_user(user) if user else [])
        return run(prefix + [ODDL, *args], check=False, timeout=timeout,
                   env=clean_env(user or "root", env))

    def worker(self, host: Host, script: str, args: list[str], log_name: str,
               env: dict[str, str] | None = None, argv0: str = PYTHON,
               launcher_args: list[str] | None = None) -> subprocess.Popen[bytes]:
        """A training user's process in the host, running a script of lab/workers (with
        `argv0` and its `launcher_args` before the script, e.g. torchrun's)."""
        path = self.plan.run_dir / "workers" / script
        proc = spawn(self.h.enter(host) + as_user(users.TRAINING_USER)
                     + [argv0, *(launcher_args or []), str(path), *args], self.logs / log_name,
                     env=clean_env(users.TRAINING_USER, {"HOME": "/tmp", **(env or {})}))
        self.workers.append(proc)
        return proc

    def install_workers(self) -> None:
        dest = self.plan.run_dir / "workers"
        shutil.copytree(REPO / "lab" / "workers", dest, dirs_exist_ok=True)
        for path in [self.plan.run_dir, dest, *dest.iterdir()]:
            path.chmod(0o755)
        out = self.plan.run_dir / "out"
        out.mkdir(exist_ok=True)
        out.chmod(0o1777)

    # ---- taking it down ------------------------------------------------------------------
    def teardown(self) -> list[str]:
        """Stop everything and remove what this run made; the problems met (never raises)."""
        problems: list[str] = []
        for proc in self.workers + (self.emulators.procs if self.emulators else []):
            kill_group(proc)
        for service in self.services.values():
            try:
                stop(service, signal.SIGTERM, timeout_s=15)
            except Exception as exc:  # keep tearing down
                problems.append(str(exc))
        problems += remove_rig(self.plan.run_dir, [h.netns for h in self.plan.hosts]
                               + [self.plan.bridge_netns], self.made_users)
        return problems


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def other_live_rigs(own: Path) -> list[Path]:
    found = []
    for state in STATE_ROOT.glob("oddl-lab-*/state.json"):
        if state.parent == own:
            continue
        try:
            info = json.loads(state.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if info.get("kept") or pid_alive(int(info.get("pid", 0))):
            found.append(state.parent)
    return found


def remove_rig(run_dir: Path, netns: list[str], made_users: list[str]) -> list[str]:
    """Kill every process in the rig's namespaces, delete them, remove the users the run
    made (unless another rig is up) and its folder."""
    problems = []
    for name in netns:
        try:
            kill_netns_processes(name)
            delete_netns(name)
        except Exception as exc:  # keep tearing down
            problems.append(f"{name}: {exc}")
    if not other_live_rigs(run_dir):  # the last rig removes what earlier ones left it
        made = list(dict.fromkeys(made_users + users.take_owed(STATE_ROOT)))
        if made:
            users.remove_made(made)
    elif made_users:
        users.owe(made_users, STATE_ROOT)
        problems.append(f"left users {made_users} for the last rig to remove: another rig "
                        "is up")
    shutil.rmtree(run_dir, ignore_errors=True)
    return problems


def stale_rigs(include_kept: bool) -> list[tuple[Path, dict[str, Any]]]:
    """Rigs whose run is gone (crashed), and with `include_kept` the ones kept with --keep."""
    found = []
    for folder in STATE_ROOT.glob("oddl-lab-*"):
        if run_id_of(folder.name) is None:
            continue
        try:
            info = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            info = {"pid": run_id_of(folder.name), "made_users": [], "kept": False,
                    "netns": []}
        if (info.get("kept") and include_kept) or (not info.get("kept")
                                                    and not pid_alive(int(info["pid"]))):
            found.append((folder, info))
    return found


def orphan_netns() -> list[str]:
    """Namespaces of rigs whose run is gone and whose folder is gone too."""
    listed = run(["ip", "netns", "list"], check=False).stdout.split("\n")
    names = [line.split()[0] for line in listed if line.strip()]
    return [n for n in names if (rid := run_id_of(n)) is not None and not pid_alive(rid)
            and not (STATE_ROOT / f"oddl-lab-{rid}").exists()]


def clean_stale(include_kept: bool) -> list[str]:
    """Remove crashed (and kept) rigs; what was removed."""
    removed = []
    for folder, info in stale_rigs(include_kept):
        remove_rig(folder, list(info.get("netns", [])), list(info.get("made_users", [])))
        removed.append(folder.name)
    for name in orphan_netns():
        kill_netns_processes(name)
        delete_netns(name)
        removed.append(name)
    return removed
