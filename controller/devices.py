"""The device manager: applies configurations to the real drivers as verified transactions.

A configuration is the channel of every transmitter, the channel table of every WSS and the
connection table of every optical circuit switch. A transaction checks it against the safety
limits of the testbed file before anything is sent, stages every WSS table, applies the WSS
tables, sets the switch ports the change names and tunes the transmitters, reads every device
back and compares. On any failure or timeout it restores the last verified configuration,
reads back again and raises `TransactionError` saying exactly what happened; nothing is left
half-applied without the operator being told.

Per-slot retunes during a collective take the fast path (`retune`): the transmitters named
in a slot are tuned in parallel, each within its guard time, and the lock is checked.

Its values (``Configuration``, ``TransactionError``, ``DeviceEvent``) are
``oddl.controller.device_types``, the safety limits ``oddl.controller.device_limits``, opening drivers from the testbed file
``oddl.controller.device_drivers``, and watching the devices (restoring one that lost the verified
configuration) ``oddl.controller.device_watch``, the circuit switches' steps
``oddl.controller.device_switches``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from oddl.common.config import TestbedConfig
from oddl.common.errors import DeviceError, OddlError
from oddl.controller import device_retune
from oddl.controller.device_drivers import open_driver
from oddl.controller.device_limits import check_limits
from oddl.controller.device_reconcile import adopt_switches, reconcile
from oddl.controller.device_switches import named_ports, set_ports, switch_power, table_problems
from oddl.controller.device_types import (
    Configuration,
    DeviceEvent,
    TransactionError,
    describe_change,
)
from oddl.controller.device_watch import DeviceWatch
from oddl.controller.store import Store
from oddl.drivers.command_trace import traced
from oddl.drivers.device_host_link import DeviceHostLink, RemoteTransceiver
from oddl.drivers.interfaces import (
    Route,
    TransceiverState,
    TunableTransceiver,
    WavelengthSelectiveSwitch,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = ["DeviceManager"]



class DeviceManager:
    """Owns the drivers of a testbed and the last verified configuration; its `watch`
    restores a device that lost it."""

    def __init__(self, cfg: TestbedConfig, drivers: Mapping[str, Any] | None = None,
                 on_command: Callable[[str, str, float], None] | None = None,
                 store: Store | None = None):
        self.cfg = cfg
        self.on_command = on_command
        self.store = store
        self.drivers: dict[str, Any] = dict(drivers) if drivers is not None else {}
        self.verified = Configuration()
        self.verified_ns: dict[str, int] = {}
        self.transceiver_states: dict[str, TransceiverState] = {}
        self.unreachable: dict[str, str] = {}
        self.events: deque[DeviceEvent] = deque(maxlen=2000)
        self.reconfigurations = 0
        self.transactions_failed = 0
        self.tune_times: deque[float] = deque(maxlen=2000)
        self.lock = threading.RLock()
        """Held by a transaction or a retune (the watch skips a round while it is)."""
        self._pool = ThreadPoolExecutor(max_workers=max(4, len(cfg.devices)),
                                        thread_name_prefix="devices")
        self.host_links = {h.id: DeviceHostLink(h.id, h.address) for h in cfg.device_hosts}
        """The device hosts' links (decision record 0036): their lasers' drivers are proxies."""
        self.watch = DeviceWatch(self)

    def check(self) -> list[str]:
        """Restore every device that no longer holds the verified configuration
        (`DeviceWatch.check`); the ids restored."""
        return self.watch.check()

    # ---- start-up ---------------------------------------------------------------------
    def connect(self) -> None:
        """Open every driver; collect all failures into one error naming each device."""
        failures = []
        for dev in self.cfg.devices:
            if dev.id in self.drivers:
                continue
            host = self.cfg.device_host(dev.id)
            if host is not None:
                self.drivers[dev.id] = RemoteTransceiver(self.host_links[host.id], dev.id)
                continue
            try:
                self.drivers[dev.id] = open_driver(dev, self.cfg.grid)
            except OddlError as exc:
                failures.append(f"{dev.id} ({dev.resource}): {exc}")
        if failures:
            self.close()
            raise DeviceError("could not open devices:\n  " + "\n  ".join(failures))

    def initialise(self, target: Configuration) -> None:
        """Bring every transmitter up (grid, power, channel, output on) and apply `target`."""
        for dev in self.cfg.devices_of("itla"):
            self.log_event(dev.id, "identify", True, str(self.drivers[dev.id].identify()))
            self.bring_up(dev.id, target.channels.get(dev.id, 1))
        for dev in self.cfg.devices_of("wss"):
            self.log_event(dev.id, "identify", True, str(self.drivers[dev.id].identify()))
        v = self.verified  # switches neither known nor asked for keep what they hold
        self.verified = Configuration(v.channels, v.wss_tables, {
            **adopt_switches(self, target.merged_over(v)), **v.connections})
        self.transact(target, reason="initialise")

    def bring_up(self, tx: str, channel: int) -> None:
        """Output off, grid, power set-point, channel, output on (the ITLA start-up order)."""
        dev = self.cfg.device(tx)
        drv: TunableTransceiver = self.drivers[tx]
        drv.disable_output()
        drv.configure_grid(self.cfg.grid.first_thz, self.cfg.grid.spacing_ghz)
        drv.set_power_dbm(dev.power_dbm)
        drv.set_channel(channel)
        drv.enable_output()

    def reconcile(self, stored: Configuration, stamps: Mapping[str, int]) -> dict[str, list[str]]:
        """After a controller restart: read every device back and adopt what still matches the
        stored verified configuration without sending anything; bring back only the rest
        (`oddl.controller.device_reconcile`). Returns {"adopted": [...], "restored": [...]}."""
        with self.lock:
            return reconcile(self, stored, stamps)

    def persist(self, config: Configuration, devices: list[str], now: int) -> None:
        """Store the verified setting of each of `devices`, one commit (no store: nothing)."""
        if self.store is not None:
            self.store.save_settings(config.channels, config.wss_tables, config.connections,
                                     devices, now)

    def close(self) -> None:
        """Release every driver (optical state is left as it is) and the worker pool; the
        drivers at once (pyserial's ``socket://`` close waits 0.3 s for the device's side)."""
        if self.drivers:
            with ThreadPoolExecutor(min(32, len(self.drivers))) as pool:
                list(pool.map(_close_quietly, self.drivers.values()))
        for link in self.host_links.values():
            link.close()
        self._pool.shutdown(wait=False)
    # ---- validation -------------------------------------------------------------------
    def check_limits(self, target: Configuration, change: Configuration | None = None) -> None:
        """Raise SafetyLimitError naming the setting and the limit; nothing is sent. `change`
        (what `target` was merged from) has its switch ports checked too: a disconnect of a
        port that does not exist leaves no trace in `target`."""
        check_limits(self.cfg, target, change)

    # ---- transactions -----------------------------------------------------------------
    def transact(self, change: Configuration, *, reason: str = "", timeout: float = 10.0
                 ) -> Configuration:
        """Apply `change` over the verified configuration as one transaction; return the result."""
        with self.lock:
            target = change.merged_over(self.verified)
            self.check_limits(target, change)
            return self.timed("*", "transaction", lambda: traced(  # the trace's device rows
                "transaction", f"transaction {reason or 'reconfigure'}",
                lambda: self._transact(change, target, reason, timeout), lambda _: "verified"))

    def _transact(self, change: Configuration, target: Configuration, reason: str,
                  timeout: float) -> Configuration:
        before, ports = self.verified, named_ports(change.connections)
        try:
            readings = self._apply(target, before, timeout, ports)
            self.verify(target, readings)
        except OddlError as exc:
            self.transactions_failed += 1
            report = [f"failed while applying ({reason or 'reconfigure'}): {exc}"]
            report += self._roll_back(before, timeout, ports)
            self.log_event("*", f"transaction {reason}", False, "; ".join(report))
            raise TransactionError("reconfiguration failed and was rolled back", report) from exc
        self.verified = target
        now = time.time_ns()
        devices = [*target.channels, *target.wss_tables, *target.connections]
        for dev in devices:
            self.verified_ns[dev] = now
        self.persist(target, devices, now)
        self.log_event("*", f"transaction {reason}", True, describe_change(before, target))
        return target

    def _apply(self, target: Configuration, before: Configuration, timeout: float,
               ports: Mapping[str, list[int]]) -> dict[str, Any]:
        """Stage every changed WSS, then apply, switch and tune everything in parallel; each
        task reads its device back as soon as it is done (lasers lock while the WSS settles).
        A switch is sent commands for the ingress `ports` the change names only."""
        tables = {w: t for w, t in target.wss_tables.items()
                  if dict(t) != dict(before.wss_tables.get(w, {}))}
        for wss_id, table in tables.items():
            self.drivers[wss_id].stage(dict(table))
            self.log_event(wss_id, "stage", True, f"{len(table)} channels")
        futures: dict[str, Future[Any]] = {
            w: self._pool.submit(self._apply_wss, w, w in tables, timeout)
            for w in target.wss_tables}
        futures.update({tx: self._pool.submit(self._tune_and_read, tx, ch,
                                              before.channels.get(tx) != ch, timeout)
                        for tx, ch in target.channels.items()})
        futures.update({s: self._pool.submit(self._switch, s, table, ports.get(s, []))
                        for s, table in target.connections.items()})
        readings: dict[str, Any] = {}
        errors = []
        for dev, f in futures.items():
            try:
                readings[dev] = f.result()
            except OddlError as exc:
                errors.append(str(exc))
        if errors:
            raise DeviceError("; ".join(errors))
        return readings

    def timed(self, device: str, op: str, fn: Callable[[], Any]) -> Any:
        """`fn()`, its time reported to `on_command` (the metrics) as `device`'s `op`."""
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            if self.on_command is not None:
                self.on_command(device, op, time.perf_counter() - t0)

    def _apply_wss(self, wss_id: str, changed: bool, timeout: float) -> dict[int, Route]:
        drv: WavelengthSelectiveSwitch = self.drivers[wss_id]
        if changed:
            self.timed(wss_id, "apply", lambda: drv.apply(timeout=timeout))
            self.log_event(wss_id, "apply", True)
        return self.timed(wss_id, "read", drv.read_active)

    def _switch(self, switch: str, table: Mapping[int, int], ports: list[int]
                ) -> dict[int, int]:
        steps, after = set_ports(switch, self.drivers[switch], table, ports, self.timed)
        if steps:
            self.log_event(switch, "switch", True, steps.describe())
        return after

    def _tune_and_read(self, tx: str, channel: int, changed: bool, timeout: float
                       ) -> TransceiverState:
        if changed:
            self.tune(tx, channel, timeout)
        return self.timed(tx, "read", self.drivers[tx].state)

    def tune(self, tx: str, channel: int, timeout: float, log: bool = True) -> float:
        """Tune one transmitter, wait for its lock; the time-to-lock (s)."""
        drv: TunableTransceiver = self.drivers[tx]
        t_lock = self.timed(tx, "tune", lambda: drv.set_channel(channel, timeout=timeout))
        self.tune_times.append(t_lock)
        self.reconfigurations += 1
        if log:
            self.log_event(tx, f"tune ch {channel}", True, f"locked in {t_lock * 1000:.2f} ms")
        return t_lock

    def read_all(self, target: Configuration) -> dict[str, Any]:
        """Read every device of `target` back, in parallel."""
        reads = {dev: self._pool.submit(self.drivers[dev].read_active)
                 for dev in target.wss_tables}
        reads.update({tx: self._pool.submit(self.drivers[tx].state) for tx in target.channels})
        reads.update({s: self._pool.submit(self.drivers[s].connections)
                      for s in target.connections})
        return {dev: f.result() for dev, f in reads.items()}

    def verify(self, target: Configuration, readings: dict[str, Any] | None = None) -> None:
        """Compare read-backs with the target; raise DeviceError listing every mismatch."""
        readings = readings if readings is not None else self.read_all(target)
        problems = []
        for wss_id, table in target.wss_tables.items():
            active = readings[wss_id]
            for ch, route in table.items():
                got = active.get(ch)
                if got is None or got.port != route.port or abs(got.attenuation_db - route.attenuation_db) > 0.05:
                    problems.append(f"{wss_id} channel {ch}: wanted {route}, reads {got}")
        for tx, ch in target.channels.items():
            st: TransceiverState = readings[tx]
            self.transceiver_states[tx] = st
            if st.channel != ch or not st.locked or not st.output_enabled:
                problems.append(f"{tx}: wanted channel {ch} locked and on, reads channel "
                                f"{st.channel} locked={st.locked} on={st.output_enabled}")
        for switch, conns in target.connections.items():
            problems += table_problems(switch, conns, readings[switch])
        if problems:
            raise DeviceError("read-back does not match: " + "; ".join(problems))

    def _roll_back(self, before: Configuration, timeout: float,
                   ports: Mapping[str, list[int]]) -> list[str]:
        report = []
        for switch, named in ports.items():
            try:  # only the ports the change named: the others were never sent a command
                steps, _ = set_ports(switch, self.drivers[switch],
                                     before.connections.get(switch, {}), named, self.timed)
                report.append(f"{switch}: set ingress {', '.join(map(str, named))} back to the "
                              f"last verified connections ({steps.describe()})")
            except OddlError as exc:
                report.append(f"{switch}: COULD NOT RESTORE ingress "
                              f"{', '.join(map(str, named))} ({exc}); read its table "
                              "(oddl devices) and repair it by hand")
        for wss_id, table in before.wss_tables.items():
            try:
                self.drivers[wss_id].stage(dict(table))
                self.drivers[wss_id].apply(timeout=timeout)
                report.append(f"{wss_id}: restored the last verified table")
            except OddlError as exc:
                report.append(f"{wss_id}: COULD NOT RESTORE ({exc}); check the device")
        for tx, ch in before.channels.items():
            try:
                self.drivers[tx].set_channel(ch, timeout=timeout)
                st = self.drivers[tx].state()
                if not (st.channel == ch and st.locked and st.output_enabled):
                    raise DeviceError(f"reads channel {st.channel} locked={st.locked} "
                                      f"on={st.output_enabled}", device=tx)
                report.append(f"{tx}: restored channel {ch}")
            except OddlError as exc:
                try:
                    # the module may have lost its set-up (reset, grid changed): redo it all
                    self.bring_up(tx, ch)
                    report.append(f"{tx}: re-initialised (output off, grid, power, channel "
                                  f"{ch}, output on) after: {exc}")
                except OddlError as exc2:
                    report.append(f"{tx}: COULD NOT RESTORE channel {ch} ({exc2}); check the "
                                  "device")
        try:
            self.verify(before)
            report.append("read-back after roll-back matches the last verified configuration")
        except OddlError as exc:
            report.append(f"read-back after roll-back: {exc}")
        return report

    # ---- the fast path ----------------------------------------------------------------
    def retune(self, channels: Mapping[str, int], timeout: float = 1.0) -> list[str]:
        """Tune transmitters in parallel (slot guard); return errors, empty when all locked.

        The safety limits are checked first: SafetyLimitError, and nothing is sent.
        """
        with self.lock:  # never interleaved with a transaction or a device check
            return self._retune(channels, timeout)

    def _retune(self, channels: Mapping[str, int], timeout: float) -> list[str]:
        return device_retune.retune(self, channels, timeout)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run `fn(*args)` on the device pool."""
        return self._pool.submit(fn, *args)

    # ---- reading ----------------------------------------------------------------------
    def read_states(self) -> dict[str, dict[str, Any]]:
        """Read every transmitter and WSS back; unreachable devices carry their error."""
        out: dict[str, dict[str, Any]] = {}
        for dev in self.cfg.devices:
            drv = self.drivers.get(dev.id)
            entry: dict[str, Any] = {"kind": dev.kind, "reachable": drv is not None}
            try:
                if dev.kind == "itla" and drv is not None:
                    entry["state"] = drv.state()
                elif dev.kind == "wss" and drv is not None:
                    entry["routes"] = drv.read_active()
                elif dev.kind == "ocs" and drv is not None:
                    entry["connections"] = table = drv.connections()
                    entry["power"] = switch_power(drv, table)
                elif dev.kind == "powermeter" and drv is not None:
                    entry["meter"] = {ch: drv.read_power_dbm(ch)
                                      for ch in range(1, dev.channels + 1)}
            except OddlError as exc:
                entry["reachable"] = False
                entry["error"] = str(exc)
            entry["verified_ns"] = self.verified_ns.get(dev.id, 0)
            out[dev.id] = entry
        return out

    def load_events(self) -> None:
        """Put the stored event log back into memory (after a restart)."""
        if self.store is not None:
            for t, d, a, ok, det in self.store.events(self.events.maxlen or 2000):
                self.events.append(DeviceEvent(t, d, a, ok, det))

    def log_event(self, device: str, action: str, ok: bool, detail: str = "") -> None:
        """Record an event in the device log (kept in memory and in the store)."""
        event = DeviceEvent(time.time_ns(), device, action, ok, detail)
        self.events.append(event)
        if self.store is not None:
            self.store.add_event(event.time_ns, device, action, ok, detail)
        (logger.info if ok else logger.warning)("device %s: %s %s %s", device, action,
                                                "ok" if ok else "FAILED", detail)


def _close_quietly(driver: Any) -> None:
    """Close `driver`, logging what fails: closing must never raise during shutdown."""
    try:
        driver.close()
    except Exception:
        logger.exception("closing a driver failed")
