"""The thin shell under the rig: running `ip`, `tc`, `nsenter`, `setpriv` and waiting."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

TOOLS = ("ip", "unshare", "nsenter", "setpriv", "tc", "useradd", "userdel", "groupdel")


class LabError(RuntimeError):
    """A step of the rig could not be carried out; the message says which and why."""


def missing_prerequisite() -> str | None:
    """Why this machine cannot run the rig, or None when it can."""
    if os.geteuid() != 0:
        return "needs root for network namespaces (run as root, as CI does)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} (util-linux, iproute2, passwd)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    # root in a container may still lack the capabilities: try what the rig does, in a
    # throw-away namespace that goes with the process
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c",
         "ip link add oddlp0 type veth peer name oddlp1 && "
         "tc qdisc add dev oddlp0 root tbf rate 1gbit burst 256kb latency 20ms"],
        capture_output=True, text=True)
    if probe.returncode != 0:
        return ("cannot make network namespaces with shaped veth links here (needs "
                f"CAP_SYS_ADMIN and CAP_NET_ADMIN, and the tbf qdisc): {probe.stderr.strip()}")
    return None


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 600.0,
        env: Mapping[str, str] | None = None, input_text: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run a command to its end; a failure (with `check`) is a LabError with its output."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None, input=input_text)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from exc
    if check and done.returncode != 0:
        out = (done.stderr.strip() or done.stdout.strip())[-2000:]
        raise LabError(f"`{' '.join(argv)}` exited {done.returncode}: {out}")
    return done


def spawn(argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None
          ) -> subprocess.Popen[bytes]:
    """Start a process in its own session with stdout and stderr appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    out: IO[bytes] = open(log, "ab")  # noqa: SIM115 - the child keeps it
    try:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(env) if env is not None else None)
    finally:
        out.close()


def wait_until(what: str, probe: Callable[[], T | None], timeout_s: float,
               interval_s: float = 0.05) -> T:
    """Poll `probe` until it returns something other than None; LabError naming `what`
    when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise LabError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(interval_s)


def pid_alive(pid: int) -> bool:
    """True while the process runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")
