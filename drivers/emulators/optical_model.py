"""Where the emulated light goes: from the emulated devices' states to a receiver, or nowhere.

A host's tunable transmitter (an ITLA) feeds a WSS: the light goes where the WSS routes its
frequency, to the receiver whose channel filter passes it. A host's fixed port (``n0.p1``) on
a circuit switch: its tx fibre enters the switch at an ingress port; the switch's connection
from that ingress (once made: a connection takes the switch's switching time) leads to an
egress port whose fibre reaches a host port's rx. No I/O here: the fabric
(`oddl.drivers.emulators.fabric`) and the emulator host's light table
(`oddl.common.lighttable`) read it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from oddl.common import lighttable
from oddl.common.config import TestbedConfig
from oddl.common.lighttable import Row, rows_of
from oddl.drivers.interfaces import Route

INSERTION_LOSS_DB = 6.0
"""Loss from a transmitter through the combiner and WSS to a receiver (excluding attenuation)."""
PORT_LAUNCH_DBM = 0.0
"""What a host's fixed port launches into its fibre (a grey transceiver: our choice)."""


class LightSource(Protocol):
    """What the fabric reads from an emulated transmitter."""

    def optical_output(self, now: float | None = None) -> Any:
        """(frequency_thz, power_dbm) of the light now, or None when dark."""


class LightRouter(Protocol):
    """What the fabric reads from an emulated WSS."""

    def route(self, frequency_thz: float, now: float | None = None) -> Route | None:
        """Out-port and attenuation for light at this frequency, or None (blocked/settling)."""


class CircuitRouter(Protocol):
    """What the model reads from an emulated circuit switch (`OcsEmulator`)."""

    @property
    def loss_db(self) -> float:
        """Insertion loss of one connection."""

    def light_route(self, ingress: int, t: float) -> tuple[int | None, int, str]:
        """(egress, 0, "") or (None, light table code, why) for light entering `ingress`."""

    def transitions(self, now: float) -> list[float]:
        """Future instants at which a connection being made completes."""


@dataclass(frozen=True)
class LightPath:
    """Where a transmitter's light ends up right now."""

    dst: str | None
    reason: str
    frequency_thz: float = 0.0
    power_dbm: float = -math.inf
    code: int = 0
    """Why there is no path, as a `oddl.common.lighttable` code (0 when there is one)."""
    port: int = 0
    """The receiving port of `dst` (0: its receiver on a WSS)."""


class OpticalModel:
    """Computes light paths and received powers from the emulated device states (no I/O)."""

    def __init__(self, cfg: TestbedConfig, lasers: Mapping[str, LightSource],
                 switches: Mapping[str, LightRouter],
                 circuit_switches: Mapping[str, CircuitRouter] | None = None):
        self.cfg = cfg
        self.lasers = lasers
        self.switches = switches
        self.circuit_switches = dict(circuit_switches or {})
        self._rx_by_port = {(cfg.attachment(n.id).wss, cfg.attachment(n.id).out_port): n
                            for n in cfg.nodes if n.on_wss}
        self._node_by_id = {n.id: n for n in cfg.nodes}
        self.rows = rows_of(cfg)
        self._row_index = {(r.node, r.port): i for i, r in enumerate(self.rows)}
        self._row_by_label = {r.label: r for r in self.rows}
        self._rx_by_egress = {(pl.switch, pl.egress): (pl.node, pl.port)
                              for pl in cfg.port_links()}

    def path(self, src: str, now: float | None = None) -> LightPath:
        """The receiver node (if any) that `src`'s tunable transmitter reaches now."""
        node = self._node_by_id.get(src)
        if node is None:
            return LightPath(None, f"unknown node {src}", code=lighttable.UNKNOWN)
        if not node.on_wss:
            return LightPath(None, f"{src} has no tunable transmitter (its ports on circuit "
                             "switches have a light path each: port_path)",
                             code=lighttable.UNKNOWN)
        out = self.lasers[node.transmitter].optical_output(now)
        if out is None:
            return LightPath(None, f"{node.transmitter} dark (off, tuning or reset)",
                             code=lighttable.DARK)
        wss_id = self.cfg.attachment(src).wss
        route = self.switches[wss_id].route(out.frequency_thz, now)
        if route is None or route.blocked:
            return LightPath(None, f"{wss_id} blocks {out.frequency_thz:.4f} THz (or is settling)",
                             out.frequency_thz, code=lighttable.BLOCKED)
        rx = self._rx_by_port.get((wss_id, route.port))
        if rx is None:
            return LightPath(None, f"{wss_id} port {route.port} has no receiver",
                             out.frequency_thz, code=lighttable.NO_RECEIVER)
        rx_f = self.cfg.grid.frequency_thz(rx.rx_channel)
        if abs(rx_f - out.frequency_thz) * 1000.0 > self.cfg.grid.spacing_ghz / 2:
            return LightPath(None, f"{rx.id} receiver filter ({rx_f:.4f} THz) rejects "
                             f"{out.frequency_thz:.4f} THz", out.frequency_thz,
                             code=lighttable.FILTERED)
        power = out.power_dbm - INSERTION_LOSS_DB - route.attenuation_db
        return LightPath(rx.id, "ok", out.frequency_thz, power)

    def port_path(self, node: str, port: int, now: float | None = None) -> LightPath:
        """The host port (dst node and `port`) that `node`'s port p`port` reaches now through
        its circuit switch, or why none."""
        row = self._row_by_label.get(Row(node, port).label)
        if row is None:
            return LightPath(None, f"{node} has no port p{port}", code=lighttable.UNKNOWN)
        if not row.switch:
            return LightPath(None, f"{row.label}.tx has no fibre to a circuit switch",
                             code=lighttable.NO_RECEIVER)
        switch = self.circuit_switches.get(row.switch)
        if switch is None:
            return LightPath(None, f"{row.switch} is not emulated", code=lighttable.UNKNOWN)
        t = time.monotonic() if now is None else now
        egress, code, why = switch.light_route(row.ingress, t)
        if egress is None:
            return LightPath(None, f"{row.switch} {why}", code=code)
        rx = self._rx_by_egress.get((row.switch, egress))
        if rx is None:
            return LightPath(None, f"{row.switch} egress {egress} has no host port's rx on "
                             "its fibre", code=lighttable.NO_RECEIVER)
        return LightPath(rx[0], "ok", power_dbm=PORT_LAUNCH_DBM - switch.loss_db, port=rx[1])

    def row_path(self, label: str, now: float | None = None) -> LightPath:
        """The path of a light table row by its label: ``n0`` (a WSS transmitter) or
        ``n0.p1`` (a port on a circuit switch)."""
        row = self._row_by_label.get(label)
        if row is None:
            return LightPath(None, f"unknown transmitter {label}", code=lighttable.UNKNOWN)
        if row.port == 0:
            return self.path(row.node, now)
        return self.port_path(row.node, row.port, now)

    def path_code(self, label: str, now: float) -> int:
        """The light table's answer for row `label` (a node id for its WSS transmitter) at
        `now`: the receiving row's index, or the negative code of why the light reaches none."""
        path = self.row_path(label, now)
        if path.dst is None:
            return path.code
        return self._row_index[(path.dst, path.port)]

    def transitions(self, now: float) -> list[float]:
        """Future instants at which some device's light changes by itself."""
        times: list[float] = []
        for device in (*self.lasers.values(), *self.switches.values(),
                       *self.circuit_switches.values()):
            times += getattr(device, "transitions", lambda _t: [])(now)
        return times

    def power_at_port(self, wss_id: str, port: int, now: float | None = None) -> float | None:
        """Total optical power (dBm) leaving a WSS out-port now, or None when dark."""
        total_mw = 0.0
        for node in self.cfg.nodes:
            if not node.on_wss or self.cfg.attachment(node.id).wss != wss_id:
                continue
            out = self.lasers[node.transmitter].optical_output(now)
            if out is None:
                continue
            route = self.switches[wss_id].route(out.frequency_thz, now)
            if route is None or route.blocked or route.port != port:
                continue
            total_mw += 10 ** ((out.power_dbm - INSERTION_LOSS_DB - route.attenuation_db) / 10)
        return 10 * math.log10(total_mw) if total_mw > 0 else None
