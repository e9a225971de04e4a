"""Watching the devices: restore one that no longer holds the verified configuration.

``DeviceWatch.check()`` (mixed into ``DeviceManager``) reads every transmitter and switch back,
reopens a driver whose link broke, and re-applies the verified configuration to a device that
lost it (power cycle, reset); power meters hold no configuration of ours, so only their link
is checked.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from common.config import TestbedConfig
from common.errors import DeviceError, OddlError
from controller.device_drivers import open_driver
from controller.device_types import Configuration
from drivers.interfaces import TransceiverState

logger = logging.getLogger(__name__)

__all__ = ["DeviceWatch"]


class DeviceWatch:
    """The watching half of ``DeviceManager``, which provides the state declared here."""

    cfg: TestbedConfig
    drivers: dict[str, Any]
    verified: Configuration
    verified_ns: dict[str, int]
    unreachable: dict[str, str]
    _lock: threading.RLock

    def _bring_up(self, tx: str, channel: int) -> None:
        raise NotImplementedError

    def log_event(self, device: str, action: str, ok: bool, detail: str = "") -> None:
        raise NotImplementedError

    def check(self) -> list[str]:
        """Read the transmitters and switches back; restore one that no longer holds the
        verified configuration (power-cycled, reset, or its link dropped and came back),
        reopening its driver if the link broke. Skipped while a transaction or a retune holds
        the devices. Returns the ids restored."""
        if not self._lock.acquire(blocking=False):
            return []
        try:
            restored = []
            for dev_id in [*self.verified.channels, *self.verified.wss_tables]:
                if self._restore_if_lost(dev_id):
                    restored.append(dev_id)
            for dev in self.cfg.devices_of("powermeter"):
                self._reconnect_meter(dev)
            return restored
        finally:
            self._lock.release()

    def _restore_if_lost(self, dev_id: str) -> bool:
        dev = self.cfg.device(dev_id)
        try:
            if self._holds(dev_id):
                self.unreachable.pop(dev_id, None)
                return False
        except OddlError as exc:
            try:  # the link broke: a new connection, as at start-up
                fresh = open_driver(dev, self.cfg.grid)
            except OddlError as again:
                if dev_id not in self.unreachable:
                    self.log_event(dev_id, "check", False, f"unreachable: {again} (was: {exc})")
                self.unreachable[dev_id] = str(again)
                return False
            old, self.drivers[dev_id] = self.drivers.get(dev_id), fresh
            if old is not None:
                try:
                    old.close()
                except Exception:  # the old link is gone anyway
                    logger.debug("closing the old driver of %s failed", dev_id, exc_info=True)
        try:
            if self._holds(dev_id):  # reconnected, the device kept its state
                self.log_event(dev_id, "check", True, "link restored; the device kept its state")
                self.unreachable.pop(dev_id, None)
                return False
            if dev_id in self.verified.channels:
                self._bring_up(dev_id, self.verified.channels[dev_id])
            else:
                drv = self.drivers[dev_id]
                drv.stage(dict(self.verified.wss_tables[dev_id]))
                drv.apply()
            if not self._holds(dev_id):
                raise DeviceError("still differs from the verified configuration after "
                                  "restoring it", device=dev_id)
        except OddlError as exc:
            self.unreachable[dev_id] = str(exc)
            self.log_event(dev_id, "restore", False, str(exc))
            return False
        self.unreachable.pop(dev_id, None)
        self.verified_ns[dev_id] = time.time_ns()
        self.log_event(dev_id, "restore", True, "it no longer held the verified configuration "
                  "(power cycle or reset?); re-applied it")
        return True

    def _reconnect_meter(self, dev: Any) -> None:
        """A meter holds no configuration of ours: only its link is checked and reopened."""
        drv = self.drivers.get(dev.id)
        try:
            if drv is not None:
                drv.identify()
                self.unreachable.pop(dev.id, None)
                return
        except OddlError:
            pass
        try:
            fresh = open_driver(dev, self.cfg.grid)
            fresh.identify()
        except OddlError as exc:
            self.unreachable[dev.id] = str(exc)
            return
        self.drivers[dev.id] = fresh
        if drv is not None:
            try:
                drv.close()
            except Exception:  # the old link is gone anyway
                logger.debug("closing the old driver of %s failed", dev.id, exc_info=True)
        self.unreachable.pop(dev.id, None)
        self.log_event(dev.id, "check", True, "link restored")

    def _holds(self, dev_id: str) -> bool:
        """Whether the device reads back as the verified configuration says."""
        if dev_id in self.verified.channels:
            st: TransceiverState = self.drivers[dev_id].state()
            return (st.channel == self.verified.channels[dev_id] and st.locked
                    and st.output_enabled)
        active = self.drivers[dev_id].read_active()
        return all(active.get(ch) == route
                   for ch, route in self.verified.wss_tables[dev_id].items())
