"""The controller host's devices: the ITLA and WSS emulators on pseudo-terminals linked at
the `/dev/serial/by-id/...` names of the lab file (group dialout, as udev makes USB-serial
adapters), and the power meter emulator as a VISA resource on the controller's address."""

from __future__ import annotations

import grp
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lab.hosts import Hosts
from lab.rig_plan import Host
from lab.shell import LabError, spawn, wait_until

SERIAL_DEVICES = {  # device id -> the emulator command and the by-id name in lab-4node.toml
    "laser0": (["itla", "--pty", "--serial", "EMU-ITLA-0"], "usb-FTDI_ITLA_0-if00-port0"),
    "laser1": (["itla", "--pty", "--serial", "EMU-ITLA-1"], "usb-FTDI_ITLA_1-if00-port0"),
    "laser2": (["itla", "--pty", "--serial", "EMU-ITLA-2"], "usb-FTDI_ITLA_2-if00-port0"),
    "laser3": (["itla", "--pty", "--serial", "EMU-ITLA-3"], "usb-FTDI_ITLA_3-if00-port0"),
    "wss0": (["wss", "--pty", "--ports", "4"], "usb-Finisar_WSS-if00-port0"),
}
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


def start_emulators(hosts: Hosts, ctl: Host, log_dir: Path) -> Emulators:
    """Every emulator of the lab file on the controller host, as root (they are the hardware)."""
    dialout = grp.getgrnam("dialout").gr_gid
    procs, resources = [], {}
    by_id = hosts.root(ctl) / "dev/serial/by-id"
    for device, (args, name) in SERIAL_DEVICES.items():
        log = log_dir / f"ctl-emulate-{device}.log"
        proc = spawn(hosts.enter(ctl) + [ODDL, "emulate", *args], log)
        procs.append(proc)
        pty = _first_line(log, proc, f"emulator of {device}")
        node = hosts.root(ctl) / pty.lstrip("/")
        os.chown(node, 0, dialout)
        node.chmod(0o660)
        link = by_id / name
        link.unlink(missing_ok=True)
        link.symlink_to(pty)
        resources[device] = f"/dev/serial/by-id/{name}"
    log = log_dir / "ctl-emulate-pm0.log"
    proc = spawn(hosts.enter(ctl) + [ODDL, "emulate", "powermeter", "--listen",
                                     f"{ctl.address}:0", "--channels", "4"], log)
    procs.append(proc)
    resources["pm0"] = _first_line(log, proc, "power meter emulator")
    return Emulators(procs, resources)
