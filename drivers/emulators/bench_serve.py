"""`oddl emulate bench --config FILE`: a lab's bench before its devices arrive.

Serves every device of a lab testbed file *at the resource the file names*, so that `oddl
devices probe`, the controller and the whole bring-up procedure run unchanged on the lab's own
hosts with no hardware:

- a serial device (ITLA, WSS) named by a path such as ``/dev/serial/by-id/usb-…`` gets a
  pseudo-terminal that speaks its protocol, and the path becomes a symbolic link to it; the
  terminal is given to group `--group` (default ``dialout``, the group serial ports have),
  mode 0660, so a service user in that group opens it as it would the USB adapter;
- a socket instrument (power meter, circuit switch) named ``TCPIP0::HOST::PORT::SOCKET`` is
  served on HOST:PORT (HOST must be an address of this host).

The emulated devices are the emulator host's (`oddl.drivers.emulators.host`): the lasers'
light reaches the meter through the emulated WSS as in `oddl emulate testbed`. A VXI-11
resource (``…::inst0::INSTR``) is refused with the SOCKET form to use; a path that exists and
is not a link this command made is left alone and refused. The links are removed on exit.
Making links under /dev needs root.
"""

from __future__ import annotations

import argparse
import dataclasses
import grp
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from oddl.common.config import EMULATED, DeviceConfig, TestbedConfig, load_testbed
from oddl.common.errors import ConfigError
from oddl.common.signals import StopSignals
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer

logger = logging.getLogger(__name__)

SOCKET = re.compile(r"^TCPIP0?::([^:]+)::(\d+)::SOCKET$", re.IGNORECASE)
VXI11 = re.compile(r"^TCPIP0?::([^:]+)::inst\d+::INSTR$", re.IGNORECASE)


@dataclass
class Bench:
    """The emulated devices and where each is served; `close` stops them and removes links."""

    testbed: EmulatedTestbed
    served: dict[str, str] = field(default_factory=dict)
    """Device id → what it is served as (a link → pty, or host:port)."""
    _links: list[Path] = field(default_factory=list)
    _stops: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Stop serving; remove the links this bench made."""
        for stop in reversed(self._stops):
            stop()
        for link in self._links:
            try:
                if link.is_symlink():
                    link.unlink()
            except OSError as exc:
                logger.warning("cannot remove %s (%s)", link, exc)
        self.testbed.close()


def _emulated_twin(cfg: TestbedConfig) -> TestbedConfig:
    """`cfg` with every device emulated (the emulator host then builds them all)."""
    return dataclasses.replace(cfg, devices=tuple(dataclasses.replace(d, resource=EMULATED)
                                                  for d in cfg.devices))


def check_resources(cfg: TestbedConfig) -> None:
    """Refuse, before anything starts, a resource the bench cannot serve where it says."""
    for dev in cfg.devices:
        if dev.kind in ("itla", "wss"):
            if not dev.resource.startswith("/"):
                raise ConfigError(f"{dev.id}: resource {dev.resource!r} is not a serial port "
                                  "path; the bench serves serial devices at a path such as "
                                  "/dev/serial/by-id/usb-…, as the lab template names them")
        elif dev.kind in ("powermeter", "ocs"):
            if VXI11.match(dev.resource):
                host = VXI11.match(dev.resource).group(1)  # type: ignore[union-attr]
                port = 5025
                raise ConfigError(
                    f"{dev.id}: resource {dev.resource!r} is VXI-11; the emulator speaks SCPI "
                    f"on a raw socket, as the instrument also does: set resource = "
                    f"\"TCPIP0::{host}::{port}::SOCKET\" (port 5025, the SCPI socket)")
            if not SOCKET.match(dev.resource):
                raise ConfigError(f"{dev.id}: resource {dev.resource!r} is not "
                                  "TCPIP0::HOST::PORT::SOCKET; the bench serves socket "
                                  "instruments at that HOST:PORT")


def start_bench(cfg: TestbedConfig, group: str = "dialout") -> Bench:
    """Serve every device of `cfg` at its resource (see the module docstring)."""
    from oddl.drivers.emulators import itla_serve, ocs_serve, powermeter_serve, wss_serve

    check_resources(cfg)
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"--group {group}: no such group on this host; name the group "
                          "serial ports have here (ls -l /dev/ttyS0), e.g. dialout") from None
    bench = Bench(start_emulated_testbed(_emulated_twin(cfg)))
    try:
        tb = bench.testbed
        for dev in cfg.devices:
            if dev.kind == "itla":
                path, stop = itla_serve.serve_pty(tb.lasers[dev.id])
            elif dev.kind == "wss":
                path, stop = wss_serve.serve_pty(tb.switches[dev.id])
            else:
                handler = (powermeter_serve.powermeter_connection_handler(tb.meters[dev.id])
                           if dev.kind == "powermeter" else
                           ocs_serve.ocs_connection_handler(tb.circuit_switches[dev.id]))
                bench.served[dev.id] = _serve_socket(bench, dev, handler)
                continue
            bench._stops.append(stop)
            os.chown(path, -1, gid)
            os.chmod(path, 0o660)
            bench.served[dev.id] = _link(bench, dev, path)
    except BaseException:
        bench.close()
        raise
    return bench


def _link(bench: Bench, dev: DeviceConfig, pty: str) -> str:
    link = Path(dev.resource)
    if link.exists() or link.is_symlink():
        if not link.is_symlink() or not os.readlink(link).startswith("/dev/pts/"):
            raise ConfigError(f"{dev.id}: {link} exists and is not a link to an emulator's "
                              "terminal: a real device is there, so the bench leaves it "
                              "alone; remove the device or point the resource elsewhere")
        link.unlink()  # a link a crashed bench left
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(pty)
    except PermissionError:
        raise ConfigError(f"{dev.id}: cannot make {link} (permission denied); run "
                          "`sudo oddl emulate bench`, which makes links under /dev") from None
    bench._links.append(link)
    return f"{link} -> {pty}"


def _serve_socket(bench: Bench, dev: DeviceConfig, handler: object) -> str:
    match = SOCKET.match(dev.resource)
    assert match is not None  # check_resources
    host, port = match.group(1), int(match.group(2))
    try:
        server = TcpEmulatorServer(handler, host, port, name=dev.id)  # type: ignore[arg-type]
    except OSError as exc:
        raise ConfigError(f"{dev.id}: cannot serve {dev.resource} ({exc}); run the bench on "
                          f"the host whose address is {host}, with port {port} free") from exc
    bench._stops.append(server.close)
    return f"{host}:{server.address[1]}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `oddl emulate bench`."""
    parser.add_argument("--config", required=True, help="the lab's testbed file (TOML)")
    parser.add_argument("--group", default="dialout",
                        help="group of the emulated serial ports, mode 0660 (default dialout)")


def run(args: argparse.Namespace) -> int:
    """Serve the bench until SIGINT/SIGTERM; print what is served where, then 'ready'."""
    cfg = load_testbed(args.config)
    with StopSignals() as stop:
        bench = start_bench(cfg, args.group)
        try:
            for dev_id, where in bench.served.items():
                print(f"{dev_id:<10} {where}", flush=True)
            print("ready: the bench serves every device of "
                  f"{cfg.path} at its resource (Ctrl-C stops it)", flush=True)
            stop.wait()
        finally:
            bench.close()
    return 0
