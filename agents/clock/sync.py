"""The agent's side of clock synchronisation: probes, the filter, and the budget check.

Every heartbeat the agent takes a burst of samples — over UDP from the controller's clock
service (`oddl.common.clock_wire`), or through the `SyncClock` RPC where UDP gets no answer — into
its `ClockFilter` (`oddl.agents.clock.offset_filter`), whose best sample gives the offset and its error bound.
After each burst the bound is checked against `[timing] clock_skew_us`, the clock error every
guard budgets for: above it, the agent warns once per excursion (`oddl.agents.clock.excursion`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable

from oddl.agents.clock import wall as wallclock
from oddl.agents.clock.excursion import Excursion
from oddl.agents.clock.offset_filter import ClockEstimate, ClockFilter, ClockSample
from oddl.common.clock_wire import REQUEST, enable_kernel_stamps, parse_reply, recv_stamped

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 0.05
"""How long one UDP probe waits for its reply."""

CONFIRM_SAMPLES = 16
"""Samples taken again before a bound over budget is warned about: the first burst after an
agent starts, or one taken while the host is busy, rides slow round trips that the next
burst does not."""


def budget_warning(node: str, est: ClockEstimate, skew_us: float, testbed: str) -> str | None:
    """The warning when the estimate's error bound exceeds the budget, else None (pure)."""
    if est.known and est.error_bound_s * 1e6 <= skew_us:
        return None
    if not est.known:
        return (f"{node}: no clock sample from the controller: the slot edges of this node "
                f"rest on an unknown offset, against [timing] clock_skew_us = {skew_us:g} µs "
                f"in {testbed}; check that the controller is reachable (UDP and gRPC)")
    need = math.ceil(est.error_bound_s * 1e6)
    drift_us = est.error_bound_s * 1e6 - est.rtt_s * 1e6 / 2
    return (f"{node}: the clock offset to the controller is known only to ±{need} µs (half "
            f"the best round trip, {est.rtt_s * 1e6:.0f} µs, plus {drift_us:.0f} µs the "
            f"clocks may have drifted apart in the {est.age_s:.1f} s since that sample), more than "
            f"[timing] clock_skew_us = {skew_us:g} µs that every guard allows for in "
            f"{testbed}: slots may overlap. Run chrony or PTP on every host and keep the "
            "control network between this host and the controller quiet (docs/explanation/clocks.md), "
            f"or raise [timing] clock_skew_us to at least {need} in {testbed} (it widens "
            "every guard)")


class UdpProbe:
    """Clock probes to the controller's UDP clock service."""

    def __init__(self, host: str, port: int):
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.connect((host, port))
        self.sock.settimeout(PROBE_TIMEOUT_S)
        enable_kernel_stamps(self.sock)

    def sample(self) -> ClockSample | None:
        """One exchange, or None when no reply came in time."""
        nonce = os.urandom(8)
        t1 = wallclock.now_ns()
        try:
            self.sock.send(REQUEST.pack(b"ODCK", nonce))
            deadline = time.monotonic() + PROBE_TIMEOUT_S
            while time.monotonic() < deadline:
                data, _sender, received = recv_stamped(self.sock)
                got = parse_reply(data, nonce)
                if got is not None:  # else a late reply to an earlier probe: read on
                    return ClockSample(t1, got[0], got[1], wallclock.from_system_ns(received))
        except OSError:  # a timeout, or ICMP "port unreachable"
            return None
        return None

    def close(self) -> None:
        """Release the socket."""
        self.sock.close()


def _take(sample: Callable[[], ClockSample | None], n: int) -> list[ClockSample]:
    """Up to `n` samples, stopping at the first that fails."""
    out = []
    for _ in range(n):
        s = sample()
        if s is None:
            break
        out.append(s)
    return out


class ClockSync:
    """One agent's clock estimate (`estimate()`), fed by `burst()`."""

    def __init__(self, node_id: str, controller: str, skew_us: float, testbed: str,
                 rpc_sample: Callable[[], ClockSample | None]):
        self.node_id = node_id
        self.host = controller.rsplit(":", 1)[0]
        self.skew_us = skew_us
        self.testbed = testbed
        self.filter = ClockFilter()
        self.excursion = Excursion()
        self.via = "none"
        """Where the last samples came from: "udp", "grpc" or "none"."""
        self.offset_ns = 0
        """The offset of the last burst's estimate, ns: read without the lock (the trace
        reads it on the data path, where waiting for a burst would cost a send)."""
        self._rpc_sample = rpc_sample
        self._udp: UdpProbe | None = None
        self._closed = False
        self._lock = threading.Lock()

    def use_port(self, port: int) -> None:
        """The controller's clock service port from its registration reply (0: none)."""
        with self._lock:
            if self._udp is not None:
                self._udp.close()
                self._udp = None
            if port and not self._closed:  # a re-registration racing close() opens nothing
                try:
                    self._udp = UdpProbe(self.host, port)
                except OSError as exc:
                    logger.warning("%s: cannot reach the controller's clock service at %s "
                                   "UDP %d (%s); measuring the clock over gRPC", self.node_id,
                                   self.host, port, exc)

    def burst(self, samples: int) -> ClockEstimate:
        """Take up to `samples` samples (UDP, else gRPC; a source that fails once is left for
        this burst, so an outage costs one timeout) and return the estimate."""
        with self._lock:
            got = _take(self._udp.sample, samples) if self._udp is not None else []
            via = "udp"
            if not got:
                got, via = _take(self._rpc_sample, samples), "grpc"
                if got and self._udp is not None and self.via != "grpc":
                    logger.warning("%s: the controller's clock service (UDP port %d) does "
                                   "not answer; measuring the clock over gRPC, which bounds "
                                   "the offset less tightly (let UDP through to that port)",
                                   self.node_id, self._udp.sock.getpeername()[1])
            for s in got:
                self.filter.add(s)
            if got:
                self.via = via
        est = self.estimate()
        self.offset_ns = round(est.offset_s * 1e9)
        return est

    def estimate(self) -> ClockEstimate:
        """The best estimate now."""
        with self._lock:
            return self.filter.estimate(wallclock.now_ns())

    def check_budget(self) -> None:
        """Warn (once per excursion) when the error bound exceeds `clock_skew_us` after a
        second, longer burst measured it again."""
        message = budget_warning(self.node_id, self.estimate(), self.skew_us, self.testbed)
        if message is not None and self.estimate().known and not self.excursion.active:
            self.burst(CONFIRM_SAMPLES)
            message = budget_warning(self.node_id, self.estimate(), self.skew_us, self.testbed)
        if self.excursion.check(message is not None, time.monotonic()):
            logger.warning("%s", message)

    def close(self) -> None:
        """Release the probe's socket for good."""
        with self._lock:
            self._closed = True
        self.use_port(0)
