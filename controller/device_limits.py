"""The safety limits of the testbed file, checked before anything is sent to a device."""

from __future__ import annotations

from oddl.common.config import DeviceConfig, TestbedConfig
from oddl.common.errors import SafetyLimitError
from oddl.controller.device_switches import check_connections
from oddl.controller.device_types import Configuration
from oddl.drivers.interfaces import BLOCKED_DB, BLOCKED_PORT

__all__ = ["check_limits"]


def check_limits(cfg: TestbedConfig, target: Configuration,
                 change: Configuration | None = None) -> None:
    """Raise SafetyLimitError naming the setting and the limit; nothing is sent. The switch
    ports of `change` (what `target` was merged from) are checked as well as `target`'s."""
    if change is not None:
        check_connections(cfg, change.connections)
    check_connections(cfg, target.connections)
    grid = cfg.grid
    for tx, ch in target.channels.items():
        dev = _device(cfg, tx, "itla")
        wss = cfg.device(cfg.attachment(_node_of(cfg, tx)).wss)
        lo, hi = wss.channels_allowed
        if not (1 <= ch <= grid.channels and lo <= ch <= hi):
            raise SafetyLimitError(f"{dev.id}: channel {ch} is not allowed (grid "
                                   f"1..{grid.channels}, {wss.id}.channels_allowed [{lo}, {hi}]); "
                                   "pick an allowed channel")
    for wss_id, table in target.wss_tables.items():
        dev = _device(cfg, wss_id, "wss")
        lo, hi = dev.channels_allowed
        alo, ahi = dev.attenuation_range_db
        for ch, route in table.items():
            if not lo <= ch <= hi:
                raise SafetyLimitError(f"{wss_id}: channel {ch} is outside channels_allowed "
                                       f"[{lo}, {hi}]; change the route or the testbed file")
            if not (1 <= route.port <= dev.ports or route.port == BLOCKED_PORT):
                raise SafetyLimitError(f"{wss_id}: port {route.port} does not exist "
                                       f"(1..{dev.ports}, or {BLOCKED_PORT} to block)")
            if route.attenuation_db != BLOCKED_DB and not alo <= route.attenuation_db <= ahi:
                raise SafetyLimitError(f"{wss_id}: attenuation {route.attenuation_db} dB on "
                                       f"channel {ch} is outside [{alo}, {ahi}] dB "
                                       f"(or {BLOCKED_DB} to block)")


def _device(cfg: TestbedConfig, device_id: str, kind: str) -> DeviceConfig:
    dev = cfg.device(device_id)
    if dev.kind != kind:
        raise SafetyLimitError(f"{device_id} is a {dev.kind}, not a {kind}")
    return dev


def _node_of(cfg: TestbedConfig, transmitter: str) -> str:
    node = cfg.node_of(transmitter)
    if node is not None:
        return node
    raise SafetyLimitError(f"{transmitter} is not the transmitter of any node")
