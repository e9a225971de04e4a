"""Prometheus metrics of the controller and the agents, each on its own registry and port.

Counters that the components already keep (retunes, transactions, collectives, bytes) are
read at scrape time by a collector, so the hot paths do not change; timings that need a
distribution (slot-gate error, device command round trips) are observed as they happen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from oddl.common.listen_errors import ListenOrigin, listen_error

logger = logging.getLogger(__name__)

GATE_BUCKETS = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2)
COMMAND_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0)
GUARD_BUCKETS = (1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3, 8e-3, 1e-2, 1.5e-2, 2e-2, 5e-2, 0.1,
                 1.0)


class _StateCollector(Collector):
    """Turns a snapshot function into metric families at scrape time."""

    def __init__(self, snapshot: Callable[[], Iterator[Any]]):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        """The metric families the snapshot yields now (the registry calls this on each scrape)."""
        yield from self._snapshot()


class Metrics:
    """A registry, the histograms observed live, and an HTTP endpoint once `serve`d."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.registry = CollectorRegistry()
        self.gate_error = Histogram(f"{prefix}_slot_gate_error_seconds",
                                    "Release time minus slot data start, on-time sends",
                                    buckets=GATE_BUCKETS, registry=self.registry)
        self.overrun = Histogram(f"{prefix}_slot_overrun_seconds",
                                 "How late a send was whose data was not ready at its slot",
                                 buckets=COMMAND_BUCKETS, registry=self.registry)
        self.command = Histogram(f"{prefix}_device_command_seconds",
                                 "Device operation round trip (tune to lock, read back, apply)",
                                 ["device", "op"], buckets=COMMAND_BUCKETS,
                                 registry=self.registry)
        self.guard_phase = Histogram(f"{prefix}_retune_slot_seconds",
                                     "From a retune slot's guard start until its hand-offs "
                                     "were confirmed (phase=confirmed) and its circuits "
                                     "granted (phase=granted); the guard should cover granted",
                                     ["phase"], buckets=GUARD_BUCKETS,
                                     registry=self.registry)
        for phase in ("confirmed", "granted"):
            self.guard_phase.labels(phase)  # exported from zero, before the first retune slot
        self.address = ""
        self._server: Any = None

    def add_state(self, snapshot: Callable[[], Iterator[Any]]) -> None:
        """Expose counters computed from component state at each scrape."""
        self.registry.register(_StateCollector(snapshot))

    def serve(self, listen: str, who: str = "metrics") -> str:
        """Start the /metrics endpoint on HOST:PORT (port 0 picks one); return its URL. An
        address `who` (the process) cannot listen on is a ConfigError naming ``--metrics``."""
        host, _, port = listen.rpartition(":")
        try:
            server, _thread = start_http_server(int(port), addr=host, registry=self.registry)
        except OSError as exc:
            raise listen_error(exc.errno, exc.strerror or str(exc), listen,
                               ListenOrigin.option(who, "--metrics")) from None
        self._server = server
        self.address = f"http://{host}:{server.server_port}/metrics"
        logger.info("metrics on %s", self.address)
        return self.address

    def close(self) -> None:
        """Stop the endpoint."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None,
            family: CounterMetricFamily | None = None) -> CounterMetricFamily:
    """One counter sample (optionally added to an existing labelled family)."""
    return _sample(CounterMetricFamily, name, doc, value, labels, family)


def gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None,
          family: GaugeMetricFamily | None = None) -> GaugeMetricFamily:
    """One gauge sample (optionally added to an existing labelled family)."""
    return _sample(GaugeMetricFamily, name, doc, value, labels, family)


_Family = TypeVar("_Family", CounterMetricFamily, GaugeMetricFamily)


def _sample(kind: type[_Family], name: str, doc: str, value: float,
            labels: dict[str, str] | None, family: _Family | None) -> _Family:
    if family is None:
        family = kind(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family
