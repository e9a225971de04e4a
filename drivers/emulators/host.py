"""The emulated testbed: every `resource = "emulated"` device, the optical fabric, one process.

`oddl emulate testbed --config FILE` starts an emulator for each emulated device of the
testbed file (each on its own TCP port, speaking the device's real wire protocol), the optical
fabric that reads those emulators' states to decide where light goes, and power meters that
read the light the emulated lasers and WSS deliver to their taps. It writes a resolved copy of
the testbed file (emulated resources replaced by their `socket://` / `TCPIP…SOCKET` addresses
and the fabric address filled in) that the controller and agents are started with.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from oddl.common.config import (
    DeviceConfig,
    TestbedConfig,
    dump_testbed,
    load_testbed,
)
from oddl.common.errors import ConfigError
from oddl.common.lighttable import HEARTBEAT_S, LightPublisher, LightTable
from oddl.common.signals import StopSignals
from oddl.common.tracing import TRACE
from oddl.common.tracing import session as tracing
from oddl.drivers.emulators.fabric import Fabric, OpticalModel
from oddl.drivers.emulators.light_trace import LightTrace
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer

logger = logging.getLogger(__name__)


@dataclass
class EmulatedTestbed:
    """Running emulators, servers and fabric of one testbed; `close()` stops them all."""

    cfg: TestbedConfig
    lasers: dict[str, Any] = field(default_factory=dict)
    switches: dict[str, Any] = field(default_factory=dict)
    """The WSS emulators."""
    circuit_switches: dict[str, Any] = field(default_factory=dict)
    """The optical circuit switch emulators."""
    meters: dict[str, Any] = field(default_factory=dict)
    servers: dict[str, TcpEmulatorServer] = field(default_factory=dict)
    resources: dict[str, str] = field(default_factory=dict)
    fabric: Fabric | None = None
    model: OpticalModel | None = None
    optinc: dict[str, Any] = field(default_factory=dict)
    light: LightTable | None = None
    closing: threading.Event = field(default_factory=threading.Event)

    @property
    def resolved(self) -> TestbedConfig:
        """The testbed file with the emulators' addresses (and OptINC phase files) filled in."""
        cfg = self.cfg.with_resources(self.resources, self.fabric.address if self.fabric else "",
                                      str(self.light.path) if self.light else "")
        if self.optinc:
            cfg = replace(cfg, optinc=tuple(
                replace(d, phases=self.optinc[d.id].phases_path or d.phases)
                if d.id in self.optinc else d for d in cfg.optinc))
        return cfg

    def close(self) -> None:
        """Stop the fabric and every emulator server."""
        self.closing.set()
        if self.fabric is not None:
            self.fabric.close()
        for server in self.servers.values():
            server.close()
        if self.light is not None:
            for device in (*self.lasers.values(), *self.switches.values(),
                           *self.circuit_switches.values()):
                device.on_change = None
            self.light.close()


def start_emulated_testbed(cfg: TestbedConfig, host: str = "127.0.0.1",
                           fabric_listen: str | None = None,
                           phases_dir: str | Path | None = None,
                           reuse: TestbedConfig | None = None) -> EmulatedTestbed:
    """Start emulators for every emulated device of `cfg`, and the fabric.

    OptINC devices without a phase file get phases trained at start-up, saved in `phases_dir`
    when given (else kept in memory only). `reuse`: the resolved file of an earlier run whose
    addresses (device ports, fabric, light table) this one takes over, so that a restarted
    emulator host is found where the controller and the agents look."""
    ports = _ports_of(reuse) if reuse is not None else {}
    if reuse is not None and fabric_listen is None and reuse.fabric.address:
        fabric_listen = reuse.fabric.address.removeprefix("tcp://")
    tb = EmulatedTestbed(cfg)
    try:
        for i, dev in enumerate(cfg.devices):
            if dev.emulated:
                start_device(tb, dev, cfg.seed * 1000 + i, host, ports.get(dev.id, 0))
        if not any(n.on_wss or n.ports for n in cfg.nodes):
            return tb  # no host transmits on the optical core: the devices only
        missing = [n.transmitter for n in cfg.nodes
                   if n.on_wss and n.transmitter not in tb.lasers]
        missing += [d.id for d in cfg.devices_of("wss") if d.id not in tb.switches]
        missing += sorted({pl.switch for pl in cfg.port_links()
                           if pl.switch not in tb.circuit_switches})
        if missing:
            raise ConfigError(f"{cfg.path}: the emulated fabric needs every transmitter, WSS "
                              f"and circuit switch the hosts use emulated, but "
                              f"{', '.join(missing)} are not; set resource = \"emulated\" for "
                              "them (or run a lab testbed without the emulator host)")
        tb.model = OpticalModel(cfg, tb.lasers, tb.switches, tb.circuit_switches)
        if cfg.fabric.link == "fabric":
            _start_fabric(tb, phases_dir, fabric_listen, reuse)
    except BaseException:
        tb.close()
        raise
    return tb


def start_device(tb: EmulatedTestbed, dev: DeviceConfig, seed: int, host: str,
                  port: int) -> None:
    """Start the emulator of one emulated device and its TCP server (`port` 0: any)."""
    from oddl.drivers.emulators.itla import ItlaEmulator
    from oddl.drivers.emulators.itla_serve import itla_connection_handler
    from oddl.drivers.emulators.ocs import OcsEmulator
    from oddl.drivers.emulators.ocs_serve import ocs_connection_handler
    from oddl.drivers.emulators.powermeter import PowerMeterEmulator
    from oddl.drivers.emulators.powermeter_serve import powermeter_connection_handler
    from oddl.drivers.emulators.wss import WssEmulator
    from oddl.drivers.emulators.wss_serve import wss_connection_handler

    grid, timing = tb.cfg.grid, tb.cfg.timing
    serial = dev.serial or f"EMU-{dev.id}"
    emu: Any
    if dev.kind == "itla":
        emu = tb.lasers[dev.id] = ItlaEmulator(
            serial_number=serial, first_thz=grid.first_thz, spacing_ghz=grid.spacing_ghz,
            channels=grid.channels, time_to_lock_s=timing.laser_tune_ms / 1e3,
            power_dbm=dev.power_dbm, seed=seed)
        handler = itla_connection_handler(emu)
    elif dev.kind == "wss":
        # the module's own plan when the file states one, else the testbed's grid numbering
        plan = dev.module_plan or grid.plan
        emu = tb.switches[dev.id] = WssEmulator(
            ports=dev.ports, first_thz=plan.first_thz, spacing_ghz=plan.spacing_ghz,
            channels=plan.channels, first_channel=plan.first_channel,
            settle_s=timing.wss_settle_ms / 1e3, serial_number=serial, seed=seed)
        handler = wss_connection_handler(emu)
    elif dev.kind == "ocs":
        emu = tb.circuit_switches[dev.id] = OcsEmulator(
            dev.size, switch_s=dev.switch_ms / 1e3, serial_number=serial, seed=seed)
        handler = ocs_connection_handler(emu)
    else:
        emu = tb.meters[dev.id] = PowerMeterEmulator(
            channels=dev.channels, serial_number=serial,
            power_source=_meter_source(tb, dev.id), seed=seed)
        handler = powermeter_connection_handler(emu)
    _inject(emu, dev.faults, dev.id)
    server = tb.servers[dev.id] = TcpEmulatorServer(handler, host, port, name=dev.id)
    tb.resources[dev.id] = (server.url if dev.kind not in ("powermeter", "ocs") else
                            f"TCPIP0::{server.address[0]}::{server.address[1]}::SOCKET")


def _start_fabric(tb: EmulatedTestbed, phases_dir: str | Path | None,
                  fabric_listen: str | None, reuse: TestbedConfig | None) -> None:
    """OptINC devices, the light table (streams without CURVE) and the fabric server."""
    cfg = tb.cfg
    assert tb.model is not None
    _start_optinc(tb, phases_dir)
    curve = None
    if cfg.security.enabled:
        from oddl.common.security.curve import CurveServer
        from oddl.common.security.files import SecurityFiles

        files = SecurityFiles.load(cfg.security.certs)
        curve = CurveServer(files.curve_keys("fabric"), files.curve_clients(), name="fabric")
    if cfg.fabric.transport == "streams" and not cfg.security.enabled:
        _start_light_table(tb, reuse.fabric.light_table if reuse else None)
    tb.fabric = Fabric(tb.model, cfg.fabric.line_rate_gbps * 1e9,
                       fabric_listen or cfg.fabric.listen, curve=curve, devices=tb.optinc,
                       light=tb.light)


def _start_light_table(tb: EmulatedTestbed, path: str | None = None) -> None:
    """Publish where the light goes for the agents' streams; kept current by the emulators."""
    model = tb.model
    assert model is not None
    rows = [r.label for r in model.rows]
    tb.light = LightTable.create(len(rows), path=path or None)
    publisher = LightPublisher(tb.light, rows, model.path_code, model.transitions)
    light_trace = LightTrace(tb.cfg, lambda row, t: model.row_path(row, t).power_dbm, rows)
    publisher.on_update = light_trace.update
    TRACE.flushers.append(light_trace.flush)
    for device in (*tb.lasers.values(), *tb.switches.values(), *tb.circuit_switches.values()):
        device.on_change = publisher.update
    publisher.update()
    table = tb.light

    def heartbeat() -> None:
        while tb.light is table and not tb.closing.wait(HEARTBEAT_S):
            table.beat()

    threading.Thread(target=heartbeat, name="light-heartbeat", daemon=True).start()
    logger.info("light table %s for %d transmitters of %d nodes", tb.light.path, len(rows),
                len(tb.cfg.nodes))


def _start_optinc(tb: EmulatedTestbed, phases_dir: str | Path | None) -> None:
    """Load (or train) the phases of every OptINC device; refusals name the testbed key."""
    from oddl.drivers.emulators.optinc import OptincDevice
    from oddl.offline.optinc.model import OptincError

    for i, dev in enumerate(tb.cfg.optinc):
        try:
            tb.optinc[dev.id] = OptincDevice.from_config(
                dev, seed=tb.cfg.seed * 1000 + 500 + i, phases_dir=phases_dir)
        except OptincError as exc:
            raise ConfigError(f"{tb.cfg.path}: devices ({dev.id}).phases: {exc}") from exc
        logger.info("OptINC device %s: N=%d, %d-bit, phases %s", dev.id, dev.inputs, dev.bits,
                    tb.optinc[dev.id].phases_path or "trained at start-up (not saved)")


def _ports_of(resolved: TestbedConfig) -> dict[str, int]:
    """Device id -> TCP port in a resolved file (socket://HOST:PORT, TCPIP0::HOST::PORT::SOCKET)."""
    ports = {}
    for dev in resolved.devices:
        r = dev.resource
        if r.startswith("socket://"):
            ports[dev.id] = int(r.rsplit(":", 1)[1])
        elif r.startswith("TCPIP") and r.endswith("::SOCKET"):
            ports[dev.id] = int(r.split("::")[2])
    return ports


def _inject(emulator: Any, faults: Mapping[str, Any], device: str) -> None:
    """Apply the `faults` table of a device of the testbed file to its emulator."""
    if not faults:
        return
    try:
        emulator.inject(**faults)
    except (TypeError, ValueError, ConfigError) as exc:
        raise ConfigError(f"devices ({device}).faults: {exc}") from exc


def _meter_source(tb: EmulatedTestbed, meter_id: str) -> Callable[[int], float | None]:
    """power_source(channel) for a meter: the light at the WSS port its tap watches."""
    taps = tb.cfg.meter_taps()

    def source(channel: int) -> float | None:
        where = taps.get((meter_id, channel))
        if where is None or tb.model is None:
            return None
        return tb.model.power_at_port(where[0], where[1], time.monotonic())

    return source


# ---- `oddl emulate testbed` ---------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `oddl emulate testbed`."""
    parser.add_argument("--config", required=True, help="testbed file (TOML), or a shipped "
                        "testbed's name (emulated-4node, topoopt-12node)")
    parser.add_argument("--resolved", help="write the resolved testbed file here "
                        "(default: print it only)")
    parser.add_argument("--host", default="127.0.0.1", help="address the emulators bind")
    tracing.add_arguments(parser)
    parser.add_argument("--reuse", metavar="RESOLVED",
                        help="take over the addresses of an earlier run's resolved file (a "
                        "restart after a crash: the controller and agents find it again)")


def run(args: argparse.Namespace) -> int:
    """Serve the emulated testbed until SIGINT/SIGTERM; print one JSON line when ready."""
    cfg = load_testbed(args.config)
    phases_dir = Path(args.resolved).resolve().parent if args.resolved else None
    reuse = load_testbed(args.reuse) if args.reuse else None
    if args.trace:  # the same digest as the controller's and agents': of the resolved file
        tracing.start(args.trace, "emulators", testbed=cfg.name, capacity=args.trace_buffer)
    tb = start_emulated_testbed(cfg, args.host, phases_dir=phases_dir, reuse=reuse)
    try:
        with StopSignals() as stop:
            text = dump_testbed(tb.resolved)
            if args.trace:
                TRACE.meta["testbed_sha256"] = tracing.testbed_digest(text)
            if args.resolved:
                Path(args.resolved).write_text(text, encoding="utf-8")
            print(json.dumps({"ready": True, "resolved": args.resolved or "",
                              "fabric": tb.fabric.address if tb.fabric else "",
                              "devices": tb.resources,
                              "optinc": {k: d.phases_path for k, d in tb.optinc.items()}}),
                  flush=True)
            stop.wait()
    finally:
        tb.close()
        tracing.stop()
        sys.stdout.flush()
    return 0


__all__ = ["EmulatedTestbed", "add_arguments", "run", "start_device", "start_emulated_testbed"]
