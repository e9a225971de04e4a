"""Resuming after a controller restart: adopt what the devices still hold, restore the rest.

Lasers keep their channel, a WSS its table and a circuit switch its connections while the
controller is down. `reconcile` reads each device back and compares it with the stored
verified configuration: a device that matches is adopted without a command; one that does not
is brought back to it. A circuit switch's stored table is all the controller had made on it,
so a switch that differs is set to it whole; a switch the store does not know (a new one, an
old store) is adopted as it reads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from oddl.common.config import TestbedConfig
from oddl.controller.device_switches import set_ports
from oddl.controller.device_types import Configuration
from oddl.drivers.interfaces import TransceiverState

__all__ = ["ReconciledDevices", "adopt_switches", "reconcile"]


class ReconciledDevices(Protocol):
    """What `reconcile` reads and sets: the device manager (``oddl.controller.devices``)."""

    cfg: TestbedConfig
    drivers: dict[str, Any]
    verified: Configuration
    verified_ns: dict[str, int]

    def check_limits(self, target: Configuration, change: Configuration | None = None
                     ) -> None: ...

    def read_all(self, target: Configuration) -> dict[str, Any]: ...

    def verify(self, target: Configuration, readings: dict[str, Any] | None = None
               ) -> None: ...

    def persist(self, config: Configuration, devices: list[str], now: int) -> None: ...

    def timed(self, device: str, op: str, fn: Any) -> Any: ...

    def bring_up(self, tx: str, channel: int) -> None: ...

    def log_event(self, device: str, action: str, ok: bool, detail: str = "") -> None: ...


def reconcile(dm: ReconciledDevices, stored: Configuration, stamps: Mapping[str, int]
              ) -> dict[str, list[str]]:
    """Adopt or restore every device of `stored` (and the switches it does not name); the
    caller holds `dm.lock`. Returns {"adopted": [...], "restored": [...]} device ids."""
    stored = Configuration(stored.channels, stored.wss_tables,
                           {**adopt_switches(dm, stored), **stored.connections})
    dm.check_limits(stored)
    readings = dm.read_all(stored)
    adopted, restored = [], []
    for tx, ch in stored.channels.items():
        st: TransceiverState = readings[tx]
        if st.channel == ch and st.locked and st.output_enabled:
            adopted.append(tx)
        else:
            dm.bring_up(tx, ch)
            restored.append(tx)
    for wss_id, table in stored.wss_tables.items():
        active = readings[wss_id]
        if all(active.get(ch) == route for ch, route in table.items()):
            adopted.append(wss_id)
        else:
            dm.drivers[wss_id].stage(dict(table))
            dm.drivers[wss_id].apply()
            restored.append(wss_id)
    for switch, conns in stored.connections.items():
        if readings[switch] == dict(conns):
            adopted.append(switch)
        else:  # the whole table: the stored one is all the controller had made
            steps, _ = set_ports(switch, dm.drivers[switch], conns,
                                 set(conns) | set(readings[switch]), dm.timed)
            dm.log_event(switch, "restore", True, steps.describe())
            restored.append(switch)
    dm.verify(stored)
    dm.verified = stored
    now = time.time_ns()
    for dev in adopted:
        dm.verified_ns[dev] = stamps.get(dev, now)
    for dev in restored:
        dm.verified_ns[dev] = now
    dm.persist(stored, restored, now)
    dm.log_event("*", "reconcile after restart", True,
                 f"adopted {', '.join(adopted) or 'nothing'}; "
                 f"restored {', '.join(restored) or 'nothing'}")
    return {"adopted": adopted, "restored": restored}


def adopt_switches(dm: ReconciledDevices, known: Configuration) -> dict[str, dict[int, int]]:
    """The tables of the circuit switches `known` does not name, as they read: a switch
    keeps its connections without the controller, so they are adopted, never cleared."""
    tables = {}
    for dev in dm.cfg.devices_of("ocs"):
        if dev.id not in known.connections:
            dm.log_event(dev.id, "identify", True, str(dm.drivers[dev.id].identify()))
            tables[dev.id] = dm.drivers[dev.id].connections()
            dm.log_event(dev.id, "adopt", True,
                         f"{len(tables[dev.id])} connection(s) found on the switch")
    return tables
