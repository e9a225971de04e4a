"""Starting the services as systemd would from their units: `ExecStartPre`, then `ExecStart`,
under `setpriv` as `User=`/`Group=` with the user's supplementary groups, in a clean
environment, with `RuntimeDirectory=`/`StateDirectory=` made for that user.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.hosts import Hosts
from lab.rig_plan import Host
from lab.shell import LabError, pid_alive, run, spawn, wait_until
from lab.units import Unit

CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def as_user(user: str, group: str | None = None, no_new_privs: bool = False) -> list[str]:
    """The setpriv prefix that runs a command as `user` (primary group `group` or the user's
    own) with the user's supplementary groups."""
    entry = pwd.getpwnam(user)
    gid = grp.getgrnam(group).gr_gid if group else entry.pw_gid
    argv = [str(shutil.which("setpriv")), f"--reuid={entry.pw_uid}", f"--regid={gid}",
            "--init-groups"]
    if no_new_privs:
        argv.append("--no-new-privs")
    return [*argv, "--"]


def clean_env(user: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment systemd gives a service (no variable of the rig leaks in)."""
    return {"PATH": CLEAN_PATH, "LANG": "C.UTF-8", "USER": user, "LOGNAME": user,
            "HOME": "/", **(extra or {})}


@dataclass
class Service:
    """One started unit on one host."""

    host: Host
    unit: Unit
    proc: subprocess.Popen[bytes]
    log: Path
    ready_file: str | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""


def _ready_file(unit: Unit) -> str | None:
    argv = list(unit.exec_start)
    return argv[argv.index("--ready-file") + 1] if "--ready-file" in argv else None


def prepare_directories(hosts: Hosts, host: Host, unit: Unit) -> None:
    """`RuntimeDirectory=` emptied and handed to the user (systemd makes it afresh at each
    start), `StateDirectory=` handed to the user (kept)."""
    entry = pwd.getpwnam(unit.user)
    gid = grp.getgrnam(unit.group).gr_gid if unit.group else entry.pw_gid
    root = hosts.root(host)
    for sub, mode, fresh in ((f"run/{unit.runtime_directory}", unit.runtime_directory_mode, True),
                             (f"var/lib/{unit.state_directory}", unit.state_directory_mode,
                              False)):
        if sub.endswith("/None"):
            continue
        path = root / sub
        path.mkdir(parents=True, exist_ok=True)
        if fresh:
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        os.chown(path, entry.pw_uid, gid)
        path.chmod(mode)


def start_unit(hosts: Hosts, host: Host, unit: Unit, log_dir: Path,
               extra_env: dict[str, str] | None = None) -> Service:
    """Run the unit's ExecStartPre lines (each must succeed) and start its ExecStart."""
    prepare_directories(hosts, host, unit)
    prefix = hosts.enter(host) + as_user(unit.user, unit.group, unit.no_new_privileges)
    env = clean_env(unit.user, {**unit.environment, **(extra_env or {})})
    log = log_dir / f"{host.name}-{unit.name}.log"
    for pre in unit.exec_start_pre:
        done = run(prefix + list(pre), check=False, env=env, timeout=120)
        if done.returncode != 0:
            raise LabError(f"{host.name}: {unit.name}: ExecStartPre `{' '.join(pre)}` exited "
                           f"{done.returncode}: {(done.stderr or done.stdout).strip()[-800:]}")
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"--- start {time.strftime('%H:%M:%S')} as {unit.user}\n")
    proc = spawn(prefix + list(unit.exec_start), log, env=env)
    return Service(host, unit, proc, log, _ready_file(unit))


def wait_ready(hosts: Hosts, service: Service, timeout_s: float = 90) -> dict[str, Any]:
    """The service's ready line (from its ready file); LabError with the end of its log when
    it exits first or stays silent."""
    assert service.ready_file is not None
    path = hosts.root(service.host) / service.ready_file.lstrip("/")

    def ready() -> dict[str, Any] | None:
        if not service.alive():
            raise LabError(f"{service.host.name}: {service.unit.name} exited "
                           f"{service.proc.returncode}: {last_lines(service.log_text())}")
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except (FileNotFoundError, ValueError):
            return None

    return wait_until(f"{service.host.name}: {service.unit.name} ready", ready, timeout_s)


def last_lines(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("---")]
    return " | ".join(lines[-n:])


def stop(service: Service, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
    """Signal the service and wait for it (SIGKILL after `timeout_s`, as TimeoutStopSec)."""
    if service.alive():
        try:
            os.kill(service.pid, sig)
        except ProcessLookupError:
            pass
        try:
            service.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(service.pid, signal.SIGKILL)
            service.proc.wait(timeout=10)
    if pid_alive(service.pid):
        raise LabError(f"{service.host.name}: {service.unit.name} (pid {service.pid}) did not stop")
