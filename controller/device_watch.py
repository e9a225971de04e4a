"""Watching the devices: restore one that no longer holds the verified configuration.

``DeviceWatch(devices).check()`` reads every transmitter, WSS and circuit switch back, reopens a driver
whose link broke, and re-applies the verified configuration to a device that lost it (power
cycle, reset); power meters hold no configuration of ours, so only their link is checked.
``oddl.controller.devices.DeviceManager`` owns one watch and is the ``WatchedDevices`` it watches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from oddl.common.config import TestbedConfig
from oddl.common.errors import DeviceError, OddlError
from oddl.controller.device_drivers import open_driver
from oddl.controller.device_switches import set_ports
from oddl.controller.device_types import Configuration
from oddl.drivers.interfaces import TransceiverState

logger = logging.getLogger(__name__)

__all__ = ["DeviceWatch", "WatchedDevices"]


class WatchedDevices(Protocol):
    """What the watch reads and restores: the testbed's drivers and their verified state."""

    cfg: TestbedConfig
    drivers: dict[str, Any]
    verified: Configuration
    verified_ns: dict[str, int]
    unreachable: dict[str, str]
    lock: threading.RLock
    """Held by a transaction or a retune; the watch skips a round while it is."""

    def bring_up(self, tx: str, channel: int) -> None:
        """Bring transmitter `tx` up on `channel` (the ITLA start-up order)."""

    def log_event(self, device: str, action: str, ok: bool, detail: str = "") -> None:
        """Record what happened to `device`."""


class DeviceWatch:
    """Restores the devices of `devices` that no longer hold their verified configuration."""

    def __init__(self, devices: WatchedDevices):
        self.devices = devices

    def check(self) -> list[str]:
        """Read the transmitters and switches back; restore one that no longer holds the
        verified configuration (power-cycled, reset, or its link dropped and came back),
        reopening its driver if the link broke. Skipped while a transaction or a retune holds
        the devices. Returns the ids restored."""
        devices = self.devices
        if not devices.lock.acquire(blocking=False):
            return []
        try:
            restored = []
            verified = devices.verified
            for dev_id in [*verified.channels, *verified.wss_tables, *verified.connections]:
                if self._restore_if_lost(dev_id):
                    restored.append(dev_id)
            for dev in devices.cfg.devices_of("powermeter"):
                self._reconnect_meter(dev)
            return restored
        finally:
            devices.lock.release()

    def _restore_if_lost(self, dev_id: str) -> bool:
        devices = self.devices
        dev = devices.cfg.device(dev_id)
        try:
            if self._holds(dev_id):
                devices.unreachable.pop(dev_id, None)
                return False
        except OddlError as exc:
            try:  # the link broke: a new connection, as at start-up
                fresh = open_driver(dev, devices.cfg.grid)
            except OddlError as again:
                if dev_id not in devices.unreachable:
                    devices.log_event(dev_id, "check", False, f"unreachable: {again} (was: {exc})")
                devices.unreachable[dev_id] = str(again)
                return False
            old, devices.drivers[dev_id] = devices.drivers.get(dev_id), fresh
            if old is not None:
                try:
                    old.close()
                except Exception:  # the old link is gone anyway
                    logger.debug("closing the old driver of %s failed", dev_id, exc_info=True)
        try:
            if self._holds(dev_id):  # reconnected, the device kept its state
                devices.log_event(dev_id, "check", True, "link restored; the device kept its state")
                devices.unreachable.pop(dev_id, None)
                return False
            if dev_id in devices.verified.channels:
                devices.bring_up(dev_id, devices.verified.channels[dev_id])
            elif dev_id in devices.verified.connections:  # the whole verified table
                table = devices.verified.connections[dev_id]
                drv = devices.drivers[dev_id]
                set_ports(dev_id, drv, table, {*table, *drv.connections()}, _untimed)
            else:
                drv = devices.drivers[dev_id]
                drv.stage(dict(devices.verified.wss_tables[dev_id]))
                drv.apply()
            if not self._holds(dev_id):
                raise DeviceError("still differs from the verified configuration after "
                                  "restoring it", device=dev_id)
        except OddlError as exc:
            devices.unreachable[dev_id] = str(exc)
            devices.log_event(dev_id, "restore", False, str(exc))
            return False
        devices.unreachable.pop(dev_id, None)
        devices.verified_ns[dev_id] = time.time_ns()
        devices.log_event(dev_id, "restore", True, "it no longer held the verified configuration "
                  "(power cycle or reset?); re-applied it")
        return True

    def _reconnect_meter(self, dev: Any) -> None:
        """A meter holds no configuration of ours: only its link is checked and reopened."""
        devices = self.devices
        drv = devices.drivers.get(dev.id)
        try:
            if drv is not None:
                drv.identify()
                devices.unreachable.pop(dev.id, None)
                return
        except OddlError:
            pass
        try:
            fresh = open_driver(dev, devices.cfg.grid)
            fresh.identify()
        except OddlError as exc:
            devices.unreachable[dev.id] = str(exc)
            return
        devices.drivers[dev.id] = fresh
        if drv is not None:
            try:
                drv.close()
            except Exception:  # the old link is gone anyway
                logger.debug("closing the old driver of %s failed", dev.id, exc_info=True)
        devices.unreachable.pop(dev.id, None)
        devices.log_event(dev.id, "check", True, "link restored")

    def _holds(self, dev_id: str) -> bool:
        """Whether the device reads back as the verified configuration says."""
        devices = self.devices
        if dev_id in devices.verified.channels:
            st: TransceiverState = devices.drivers[dev_id].state()
            return (st.channel == devices.verified.channels[dev_id] and st.locked
                    and st.output_enabled)
        if dev_id in devices.verified.connections:
            return bool(devices.drivers[dev_id].connections()
                        == dict(devices.verified.connections[dev_id]))
        active = devices.drivers[dev_id].read_active()
        return all(active.get(ch) == route
                   for ch, route in devices.verified.wss_tables[dev_id].items())


def _untimed(device: str, op: str, call: Callable[[], Any]) -> Any:
    """A restore's commands are not the transactions' round trips: no metric."""
    del device, op
    return call()
