"""The controller host's devices, as docs/how-to/bench-before-devices.md brings them up: `oddl
emulate bench` on the lab file serves the ITLA and WSS emulators on pseudo-terminals linked at
its `/dev/serial/by-id/...` names (group dialout, as udev makes USB-serial adapters) and the
power meter on its `TCPIP0::<controller>::5025::SOCKET` resource."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from lab.hosts import Hosts
from lab.rig_plan import Host
from lab.shell import LabError, spawn, wait_until

ODDL = "/opt/oddl/.venv/bin/oddl"


@dataclass
class Emulators:
    procs: list[subprocess.Popen[bytes]]
    resources: dict[str, str]   # device id -> resource string for the testbed file


def _first_line(log: Path, proc: subprocess.Popen[bytes], what: str) -> str:
    def line() -> str | None:
        if proc.poll() is not None:
            raise LabError(f"{what} exited {proc.returncode}: "
                           f"{log.read_text(errors='replace')[-600:]}")
        text = log.read_text(errors="replace") if log.exists() else ""
        first = text.split("\n", 1)
        return first[0].strip() if len(first) == 2 and first[0].strip() else None

    return wait_until(f"{what}: its first line", line, 60)


METER_PORT = 5025  # the N7744A's SCPI socket, as the template names it


def bench_resources(ctl: Host) -> dict[str, str]:
    """The resources the lab file keeps or gets: the template's serial paths, the meter on
    the controller host's address."""
    return {"pm0": f"TCPIP0::{ctl.address}::{METER_PORT}::SOCKET"}


def start_bench(hosts: Hosts, ctl: Host, log_dir: Path, testbed: str) -> Emulators:
    """`oddl emulate bench --config TESTBED` on the controller host, as root (it is the
    hardware); ready when it says so."""
    log = log_dir / "ctl-emulate-bench.log"
    proc = spawn(hosts.enter(ctl) + [ODDL, "emulate", "bench", "--config", testbed], log)

    def ready() -> str | None:
        if proc.poll() is not None:
            raise LabError(f"oddl emulate bench exited {proc.returncode}: "
                           f"{log.read_text(errors='replace')[-600:]}")
        text = log.read_text(errors="replace") if log.exists() else ""
        return next((line for line in text.splitlines() if line.startswith("ready:")), None)

    wait_until("oddl emulate bench: ready", ready, 60)
    served = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("ready:"):
            break
        device, _, where = line.partition(" ")
        if where.strip():  # "laser0     /dev/serial/by-id/... -> /dev/pts/3", "pm0  host:5025"
            served[device] = where.strip()
    return Emulators([proc], served)
