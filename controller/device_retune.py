"""The fast path of the device manager: a slot edge's retune of many transmitters at once.

Lasers the controller drives itself are tuned each on a pool thread (the ITLA driver's serial
round trips); lasers on a device host (decision record 0036) go as one request per host, the
host tuning its own lasers in parallel on its own machine. Every laser ends with its
time-to-lock or its error; the events of one retune are stored as one commit, after the edge.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from oddl.common.config import TestbedConfig
from oddl.common.errors import OddlError
from oddl.controller.device_types import Configuration
from oddl.controller.store import Store
from oddl.drivers.device_host_link import DeviceHostLink

T = TypeVar("T")


class DeviceManager(Protocol):
    """What a retune uses of `oddl.controller.devices.DeviceManager`."""

    cfg: TestbedConfig
    store: Store | None
    lock: threading.RLock
    verified: Configuration
    verified_ns: dict[str, int]
    host_links: dict[str, DeviceHostLink]
    on_command: Callable[[str, str, float], None] | None
    tune_times: deque[float]
    reconfigurations: int

    def check_limits(self, target: Configuration, change: Configuration | None = None
                     ) -> None: ...

    def tune(self, tx: str, channel: int, timeout: float, log: bool = True) -> float: ...

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]: ...

    def log_event(self, device: str, action: str, ok: bool, detail: str = "") -> None: ...

    def persist(self, config: Configuration, devices: list[str], now: int) -> None: ...


def retune(dm: DeviceManager, channels: Mapping[str, int], timeout: float) -> list[str]:
    """Tune `channels` at once (call under `dm.lock`); the errors, empty when all locked.
    SafetyLimitError before anything is sent when a channel is out of the limits."""
    dm.check_limits(Configuration(channels))
    outcomes = _tune_all(dm, channels, timeout)
    with dm.store.batch() if dm.store is not None else contextlib.nullcontext():
        for tx, o in outcomes.items():  # the events as one commit, after the edge
            bad = isinstance(o, OddlError)
            dm.log_event(tx, "tune" if bad else f"tune ch {channels[tx]}", not bad,
                         str(o) if isinstance(o, OddlError) else f"locked in {o * 1e3:.2f} ms")
    errors = [f"{tx}: {o}" for tx, o in outcomes.items() if isinstance(o, OddlError)]
    if errors:
        errors += _send_back(dm, channels, outcomes, timeout)
    with dm.lock:
        if not errors:
            dm.verified = Configuration(channels).merged_over(dm.verified)
            now = time.time_ns()
            dm.verified_ns.update(dict.fromkeys(channels, now))
            dm.persist(dm.verified, list(channels), now)
    return errors


def _send_back(dm: DeviceManager, channels: Mapping[str, int],
               outcomes: Mapping[str, float | OddlError], timeout: float) -> list[str]:
    """After a retune that failed somewhere, tune the lasers that did move back to their
    verified channels (the slot's collective fails; the next one starts from the verified
    configuration); the errors of those that could not be sent back."""
    back = {tx: dm.verified.channels[tx] for tx, o in outcomes.items()
            if not isinstance(o, OddlError) and tx in dm.verified.channels
            and dm.verified.channels[tx] != channels[tx]}
    out = []
    for tx, o in _tune_all(dm, back, timeout).items():
        ok = not isinstance(o, OddlError)
        dm.log_event(tx, f"tune back ch {back[tx]}", ok, "after a failed retune" if ok else str(o))
        if not ok:
            out.append(f"{tx}: could not be tuned back to channel {back[tx]} ({o})")
    return out


def _tune_all(dm: DeviceManager, channels: Mapping[str, int], timeout: float
              ) -> dict[str, float | OddlError]:
    """Each laser's time-to-lock or error: one request per device host, a pool thread per
    laser the controller drives itself."""
    by_host: dict[str, dict[str, int]] = {}
    local: dict[str, int] = {}
    for tx, ch in channels.items():
        host = dm.cfg.device_host(tx)
        (by_host.setdefault(host.id, {}) if host is not None else local)[tx] = ch
    hosts: dict[str, Future[dict[str, float | OddlError]]] = {
        h: dm.submit(_retune_host, dm, dm.host_links[h], group, timeout)
        for h, group in by_host.items()}
    lasers = {tx: dm.submit(dm.tune, tx, ch, timeout, False) for tx, ch in local.items()}
    outcomes: dict[str, float | OddlError] = {}
    for f in hosts.values():
        outcomes.update(f.result())
    for tx, lf in lasers.items():
        try:
            outcomes[tx] = lf.result()
        except OddlError as exc:
            outcomes[tx] = exc
    return {tx: outcomes[tx] for tx in channels}


def _retune_host(dm: DeviceManager, link: DeviceHostLink, channels: dict[str, int],
                 timeout: float) -> dict[str, float | OddlError]:
    """One host's lasers in one request, timed as one command of the host."""
    started = time.perf_counter()
    out = link.retune(channels, timeout)
    if dm.on_command is not None:
        dm.on_command(link.host_id, "retune", time.perf_counter() - started)
    for o in out.values():
        if not isinstance(o, OddlError):
            dm.tune_times.append(o)
            dm.reconfigurations += 1
    return out
