"""Bringing the rig's hosts up and down: network namespaces, veths, tbf, mount namespaces.

Each host is a network namespace with a keeper process in a private mount namespace of its
own; commands enter both with `nsenter`. Inside a host, `/run`, `/tmp` and `/dev/shm` are fresh
tmpfs (lost on a reboot), `/etc/oddl` and `/var/lib/oddl` are the host's disk (kept across a
reboot), and `/opt/oddl` is the installed venv. `/etc`, `/var/lib` and `/opt` (and `/dev` on
the controller host, for `/dev/serial/by-id`) get an overlay so the mount points exist without
writing anything into the machine's own tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
from functools import partial
from pathlib import Path

from lab.rig_plan import SHAPE, Host, LabPlan
from lab.shell import LabError, pid_alive, run, spawn, wait_until

HOST_IF = "eth0"
BRIDGE = "br0"


def keeper_script(host: Host, disk: Path, venv_root: Path, ready: Path) -> str:
    """The shell lines the keeper runs in its new mount namespace before it sleeps."""
    lines = ["set -e", "mount -t tmpfs -o mode=0755 tmpfs /run",
             "mkdir -p /run/oddl && mount -t tmpfs -o mode=0755 tmpfs /run/oddl"]
    for top, sub, source in (("/etc", "oddl", disk / "etc-oddl"),
                             ("/var/lib", "oddl", disk / "var-lib-oddl"),
                             ("/opt", "oddl", venv_root)):
        name = top.strip("/").replace("/", "-")
        upper, work = disk / "overlay" / f"{name}-upper", disk / "overlay" / f"{name}-work"
        lines += [f"mkdir -p {upper} {work} {source}",
                  f"mount -t overlay overlay -o lowerdir={top},upperdir={upper},workdir={work} "
                  f"{top}",
                  f"mkdir -p {top}/{sub}", f"mount --bind {source} {top}/{sub}"]
    lines += ["mount -o remount,bind,ro /opt/oddl",
              "mount -t tmpfs -o mode=1777 tmpfs /tmp",
              "mount -t tmpfs -o mode=1777 tmpfs /dev/shm"]
    if host.is_controller:
        keep = disk / "devpts"
        upper, work = disk / "overlay" / "dev-upper", disk / "overlay" / "dev-work"
        lines += [f"mkdir -p {keep} {upper} {work}", f"mount --bind /dev/pts {keep}",
                  f"mount -t overlay overlay -o lowerdir=/dev,upperdir={upper},workdir={work} /dev",
                  f"mount --move {keep} /dev/pts",
                  "mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
                  # the machine's own serial ports are not this host's: a probe that scans
                  # must not write to them
                  "rm -f /dev/ttyS* /dev/ttyUSB* /dev/ttyACM* /dev/ttyAMA*",
                  "mkdir -p /dev/serial/by-id"]
    lines += [f"touch {ready}", "exec sleep infinity"]
    return "\n".join(lines)


class Hosts:
    """The running rig: the bridge namespace, each host's namespace and its keeper."""

    def __init__(self, plan: LabPlan, venv_root: Path) -> None:
        self.plan = plan
        self.venv_root = venv_root
        self.keepers: dict[str, int] = {}

    def up(self) -> None:
        """The bridge, then every host."""
        br = self.plan.bridge_netns
        run(["ip", "netns", "add", br])
        run(["ip", "-n", br, "link", "set", "lo", "up"])
        run(["ip", "-n", br, "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "-n", br, "link", "set", BRIDGE, "up"])
        for host in self.plan.hosts:
            self.host_up(host)

    def host_up(self, host: Host) -> None:
        """One host: namespace, veth to the bridge, address, tbf on both ends, keeper."""
        br = self.plan.bridge_netns
        run(["ip", "netns", "add", host.netns])
        run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        run(["ip", "-n", br, "link", "add", host.bridge_port, "mtu", str(self.plan.mtu), "type",
             "veth", "peer", "name", HOST_IF, "mtu", str(self.plan.mtu), "netns", host.netns])
        run(["ip", "-n", br, "link", "set", host.bridge_port, "master", BRIDGE, "up"])
        run(["ip", "-n", host.netns, "addr", "add", host.cidr, "dev", HOST_IF])
        run(["ip", "-n", host.netns, "link", "set", HOST_IF, "up"])
        for netns, dev in ((br, host.bridge_port), (host.netns, HOST_IF)):
            run(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "tbf", *SHAPE])
        self.start_keeper(host)

    def start_keeper(self, host: Host) -> None:
        disk = self.plan.host_dir(host)
        disk.mkdir(parents=True, exist_ok=True)
        ready = disk / "keeper.ready"
        ready.unlink(missing_ok=True)
        script = keeper_script(host, disk, self.venv_root, ready)
        proc = spawn(["ip", "netns", "exec", host.netns, "unshare", "--mount",
                      "--propagation", "private", "--", "/bin/sh", "-c", script],
                     self.plan.run_dir / "logs" / f"{host.name}-keeper.log")
        self.keepers[host.name] = proc.pid

        def mounted() -> bool | None:
            if proc.poll() is not None:
                raise LabError(f"host {host.name}: its mount namespace could not be set up "
                               f"(see {self.plan.run_dir}/logs/{host.name}-keeper.log)")
            return True if ready.exists() else None

        wait_until(f"host {host.name}: mounts", mounted, 30)

    def root(self, host: Host) -> Path:
        """The host's file system as its processes see it (through its keeper)."""
        return Path(f"/proc/{self.keepers[host.name]}/root")

    def enter(self, host: Host) -> list[str]:
        """The argv prefix that runs a command inside the host."""
        return ["nsenter", "-t", str(self.keepers[host.name]), "-m", "-n", "--wd=/"]

    def link(self, host: Host, up: bool) -> None:
        """Take the host's link down or up (its end, as a pulled cable would)."""
        run(["ip", "-n", host.netns, "link", "set", HOST_IF, "up" if up else "down"])

    def host_down(self, host: Host) -> None:
        """Power the host off: every process in it killed, its namespaces gone."""
        kill_netns_processes(host.netns)
        self.keepers.pop(host.name, None)
        run(["ip", "-n", self.plan.bridge_netns, "link", "del", host.bridge_port], check=False)
        delete_netns(host.netns)

    def down(self) -> None:
        for host in self.plan.hosts:
            self.host_down(host)
        delete_netns(self.plan.bridge_netns)


def netns_pids(netns: str) -> list[int]:
    done = run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def kill_netns_processes(netns: str) -> None:
    """SIGKILL every process in a network namespace and wait until they are gone."""
    for _ in range(50):
        pids = [p for p in netns_pids(netns) if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            wait_until(f"processes of {netns} to exit", partial(_all_gone, pids), 10)
        except LabError:
            continue
    raise LabError(f"{netns}: processes keep running after SIGKILL: {netns_pids(netns)}")


def _all_gone(pids: list[int]) -> bool | None:
    return True if not any(pid_alive(p) for p in pids) else None


def delete_netns(netns: str) -> None:
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if any(line.split()[0] == netns for line in existing.splitlines() if line.strip()):
        run(["ip", "netns", "del", netns])
