"""The controller process: devices, the gRPC service with health and reflection, metrics.

`ControllerServer` owns the process's lifecycle: it refuses to serve plaintext beyond this
host unless told to, brings the devices to the stored (or default) configuration, serves the
`ControllerService`, watches the devices and agents, and exports the metrics.

gRPC runs on an asyncio event loop in a thread of its own (`grpc.aio`, ADR 0032): every
agent's schedule stream is a coroutine, not a thread, and the calls that take the core's lock
or touch devices run in a bounded pool (`max_workers` threads), so the 33rd agent, or the
1024th, registers like the first.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from oddl.common.config import TestbedConfig
from oddl.common.errors import ConfigError
from oddl.common.listen_errors import ListenOrigin, bind_errno, listen_error
from oddl.common.metrics import Metrics, counter, gauge
from oddl.controller.aio_service import AsyncControllerService, add_to_server
from oddl.controller.clock_service import ClockService
from oddl.controller.device_types import Configuration
from oddl.controller.devices import DeviceManager
from oddl.controller.scheduling.slot_grants import RETUNE_FAILED
from oddl.controller.servicer import SERVICE_NAME, ControllerService
from oddl.controller.store import Store
from oddl.drivers.interfaces import Route
from oddl.protos import oddl_pb2 as pb

logger = logging.getLogger(__name__)

T = TypeVar("T")

TICK_S = 0.1
"""How often the event loop notes the time (`loop_lag`)."""


class ControllerServer:
    """The controller process: devices, the gRPC service, health and reflection."""

    def __init__(self, cfg: TestbedConfig, listen: str | None = None,
                 devices: DeviceManager | None = None, max_workers: int = 32,
                 metrics_listen: str | None = "127.0.0.1:0", state: str | None = None,
                 insecure: bool = False):
        where = listen or cfg.controller.listen
        _check_plaintext(cfg, where, insecure)
        self.cfg = cfg
        self.metrics = Metrics("oddl")
        path = state if state is not None else cfg.controller.state
        self.store = Store(path) if path else None
        self.devices = devices or DeviceManager(
            cfg, on_command=lambda d, op, s: self.metrics.command.labels(d, op).observe(s),
            store=self.store)
        self.service = ControllerService(cfg, self.devices, self.metrics, self.store)
        self.metrics.add_state(self._metric_state)
        self.metrics_listen = metrics_listen
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if cfg.security.enabled:
            from oddl.common.security.authorization_aio import AioAuthorizationInterceptor
            from oddl.common.security.files import SecurityFiles
            from oddl.common.security.revoked import RevocationList
            from oddl.common.security.tls import server_credentials

            self.security = SecurityFiles.load(cfg.security.certs)
            # the rule table is checked against the service at start-up: an RPC without a
            # rule, or a rule naming a request field that does not exist, stops the server
            interceptors.append(AioAuthorizationInterceptor(
                service_descriptor=pb.DESCRIPTOR.services_by_name["Controller"],
                revocations=RevocationList(self.security.root)))
        self.pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc")
        """The threads for the calls that take the core's lock or touch devices."""
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="grpc-loop",
                                             daemon=True)
        self._loop_thread.start()
        self.server, self.health = self._on_loop(self._build(interceptors))
        try:
            if cfg.security.enabled:
                self.port = self.server.add_secure_port(where, server_credentials(self.security))
            else:
                self.port = self.server.add_insecure_port(where)
        except RuntimeError:  # gRPC says only "Failed to bind"; bind_errno finds out why
            self.port = 0
        if self.port == 0:
            self._close_loop(0)
            if self.store is not None:
                self.store.close()
            origin = (ListenOrigin.option("controller", "--listen") if listen else
                      ListenOrigin.option("controller", f"[controller] listen in {cfg.path}"))
            raise listen_error(*bind_errno(where), where, origin)
        self.address = f"{where.rsplit(':', 1)[0]}:{self.port}"
        self._last_tick = time.monotonic()
        self.clock_service: ClockService | None = None
        """The UDP clock service (agents/clock/sync.py), opened by `start`."""

    def start(self, initialise_devices: bool = True) -> None:
        """Connect the devices, bring them to the stored (or default) configuration, serve."""
        if self.metrics_listen:  # first: a bad address stops us before any device is touched
            self.metrics.serve(self.metrics_listen, who="controller")
        if initialise_devices:
            self._bring_up_devices()
        self.clock_service = ClockService(self.address.rsplit(":", 1)[0], self.port)
        self.service.clock_port = self.clock_service.port
        self._on_loop(self.server.start())
        self._ticks = asyncio.run_coroutine_threadsafe(self._tick(), self.loop)
        self.service.loop_lag = self.loop_lag
        self.clock_service.start()
        threading.Thread(target=self.service.monitor, name="heartbeat-monitor",
                         daemon=True).start()
        if self.cfg.controller.device_check_s > 0:
            threading.Thread(target=self._watch_devices, name="device-check",
                             daemon=True).start()
        self._on_loop(self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING))
        self._on_loop(self.health.set("", health_pb2.HealthCheckResponse.SERVING))
        logger.info("controller for %s serving on %s", self.cfg.name, self.address)

    async def _build(self, interceptors: list[grpc.aio.ServerInterceptor]
                     ) -> tuple[grpc.aio.Server, Any]:
        """The asyncio server with the service, health and reflection (on the loop)."""
        server = grpc.aio.server(interceptors=interceptors)
        add_to_server(AsyncControllerService(self.service, self.pool), server)
        checks = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(checks, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        return server, checks

    async def _tick(self) -> None:
        """Note the time every `TICK_S` on the loop: a late tick is a loop behind."""
        while True:
            self._last_tick = time.monotonic()
            await asyncio.sleep(TICK_S)

    def loop_lag(self) -> float:
        """How far behind the event loop is now, s (0 when its ticks come on time)."""
        return max(0.0, time.monotonic() - self._last_tick - TICK_S)

    def _on_loop(self, coro: Coroutine[Any, Any, T], timeout: float | None = 30) -> T:
        """Run `coro` on the server's event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _close_loop(self, grace: float) -> None:
        """Stop the gRPC server (within `grace`), the event loop and the pool."""
        if self.loop.is_closed():
            return
        ticks = getattr(self, "_ticks", None)
        if ticks is not None:
            ticks.cancel()
        try:
            self._on_loop(self.server.stop(grace), timeout=grace + 2)
        except (TimeoutError, futures.TimeoutError):
            logger.warning("the gRPC server did not stop within %.1f s", grace + 2)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=5)
        if not self._loop_thread.is_alive():
            self.loop.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _bring_up_devices(self) -> None:
        """Connect the devices; adopt or restore the stored configuration, else the default."""
        self.devices.connect()
        channels, tables, stamps = self.store.verified() if self.store else ({}, {}, {})
        switches = self.store.connections() if self.store else {}
        if self.store is not None and (channels or tables or switches):
            self.devices.load_events()
            result = self.devices.reconcile(Configuration(channels, tables, switches), stamps)
            logger.info("resumed from %s: adopted %s, restored %s", self.store.path,
                        result["adopted"], result["restored"])
        else:
            self.devices.initialise(default_configuration(self.cfg))

    def _watch_devices(self) -> None:
        """Read the devices back now and then; restore one that lost its configuration."""
        interval = self.cfg.controller.device_check_s
        while not self.service.stopped.wait(interval):
            if self.service.retuning():
                continue  # a slot executor owns the devices' timing now
            try:
                restored = self.devices.check()
            except Exception:  # the watch must outlive any one bad reading
                logger.exception("device check failed")
                continue
            if restored:
                logger.warning("restored %s: they no longer held the verified configuration",
                               ", ".join(restored))
                self.service.core.count_error("device restored")

    def _metric_state(self) -> Iterator[Any]:
        return _metric_state_of(self)

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving and release the devices (their optical state is left as it is)."""
        if not self.loop.is_closed():
            self._on_loop(self.health.enter_graceful_shutdown())
        self.metrics.close()
        self.service.close()
        self._close_loop(grace)
        if self.clock_service is not None:
            self.clock_service.close()
        self.devices.close()
        if self.store is not None:
            self.store.close()


ERROR_KINDS = ("agent lost", "collective failed", RETUNE_FAILED, "flow retune failed")
"""Error kinds the controller exports from zero (`oddl_errors_total`), so a rate or an
alert's increase() sees the first one."""


def _metric_state_of(server: ControllerServer) -> Iterator[Any]:
    core, dm = server.service.core, server.devices
    yield counter("oddl_reconfigurations_total", "Transmitter retunes applied", dm.reconfigurations)
    yield counter("oddl_transactions_failed_total", "Reconfiguration transactions rolled back",
                  dm.transactions_failed)
    jobs = list(core.jobs)
    yield counter("oddl_guard_time_seconds_total", "Guard time in executed schedules",
                  sum(j.guard_time_s for j in jobs))
    done = None
    for j in jobs:
        done = counter("oddl_collectives_total", "Collectives completed, by job",
                       j.collectives_done, {"job": j.id}, done)
    if done is not None:
        yield done
    yield counter("oddl_collectives_failed_total", "Collectives that failed at some node",
                  core.collectives_failed)
    kinds = None
    for kind, n in sorted({**dict.fromkeys(ERROR_KINDS, 0), **core.errors}.items()):
        kinds = counter("oddl_errors_total", "Errors by kind", n, {"kind": kind}, kinds)
    if kinds is not None:
        yield kinds
    yield counter("oddl_flows_total", "Point-to-point flows granted", core.flows.granted)
    yield counter("oddl_flow_retunes_total", "Transmitter retunes made for point-to-point flows",
                  core.flows.retunes)
    yield gauge("oddl_agents_alive", "Agents whose heartbeat is recent",
                core.registry.alive_count())
    reach = None
    unreachable = dict(dm.unreachable)
    for dev in dm.cfg.devices:
        reach = gauge("oddl_device_reachable", "1 while the device answers the controller's "
                      "watch, 0 once it did not", float(dev.id not in unreachable),
                      {"device": dev.id}, reach)
    if reach is not None:
        yield reach


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT listens on this host only (127.0.0.0/8, ::1, localhost)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or a wildcard: reachable from elsewhere


def default_configuration(cfg: TestbedConfig) -> Configuration:
    """TT-FR at rest: every receive channel routed to its node's port; lasers on their own channel."""
    tables: dict[str, dict[int, Route]] = {}
    on_wss = [n for n in cfg.nodes if n.on_wss]  # hosts on circuit switches only: no laser
    for n in on_wss:
        att = cfg.attachment(n.id)
        tables.setdefault(att.wss, {})[n.rx_channel] = Route(att.out_port, 0.0)
    return Configuration({n.transmitter: n.rx_channel for n in on_wss}, tables)


def _check_plaintext(cfg: TestbedConfig, where: str, insecure: bool) -> None:
    """Refuse plaintext beyond loopback unless asked for (`--insecure`), and say it loudly."""
    if cfg.security.enabled or is_loopback(where):
        return
    if not insecure:
        raise ConfigError(
            f"controller: refusing to serve without TLS on {where}: anyone who reaches it "
            "could retune lasers and rewrite WSS routes. Set [security] certs (make them "
            "with `oddl certs init`), listen on 127.0.0.1, or pass --insecure to serve "
            "plaintext on purpose")
    logger.warning("controller: serving WITHOUT TLS on %s (--insecure): anyone who "
                   "reaches this port can reconfigure the testbed", where)
