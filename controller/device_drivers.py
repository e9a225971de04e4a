"""Opening the real driver of a device named in the testbed file (ITLA, WSS, power meter)."""

from __future__ import annotations

from typing import Any

from oddl.common.config import DeviceConfig, GridConfig, channel_map
from oddl.common.errors import SafetyLimitError

__all__ = ["open_driver"]


def open_driver(dev: DeviceConfig, grid: GridConfig | None = None) -> Any:
    """Open the real driver for a device of the testbed file on the testbed's `grid`."""
    grid = grid or GridConfig()
    from oddl.drivers.transport import SerialTransport

    if dev.kind == "itla":
        from oddl.drivers.itla import ItlaDriver
        from oddl.drivers.itla_timeouts import ItlaTimeouts

        timeouts = ItlaTimeouts(reply_s=dev.timeout_s, lock_s=dev.lock_timeout_s,
                                enable_s=dev.enable_timeout_s, startup_s=dev.startup_timeout_s)
        return ItlaDriver(SerialTransport(dev.resource, name=dev.id, baudrate=dev.baud or 9600,
                                          timeout=dev.timeout_s), name=dev.id,
                          timeouts=timeouts, poll_interval_s=0.001)
    if dev.kind == "wss":
        from oddl.drivers.wss import FlexgridWss
        from oddl.drivers.wss_codec import WssLimits

        limits = WssLimits(channels=grid.channels, ports=dev.ports,
                           max_attenuation_db=dev.attenuation_range_db[1])
        mapped = (None if dev.module_plan is None else
                  channel_map(grid.plan, dev.channels_allowed, dev.module_plan)[0])
        return FlexgridWss(SerialTransport(dev.resource, name=dev.id,
                                           baudrate=dev.baud or 115200, timeout=dev.timeout_s),
                           name=dev.id, timeout=dev.timeout_s, limits=limits, channel_map=mapped)
    if dev.kind == "powermeter":
        from oddl.drivers.powermeter import PowerMeter

        return PowerMeter(dev.resource, name=dev.id, channels=dev.channels,
                          timeout_s=max(dev.timeout_s, 1.0))
    if dev.kind == "ocs":
        from oddl.drivers.ocs import PolatisOcs

        return PolatisOcs.open(dev.resource, name=dev.id, size=dev.size, timeout=dev.timeout_s,
                               switch_s=dev.switch_ms / 1e3)
    raise SafetyLimitError(f"{dev.id}: unknown device kind {dev.kind!r}")
