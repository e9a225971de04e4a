"""The emulated light on the trace (docs/reference/trace-format.md, categories ``light`` and ``power``).

The emulator host's `LightPublisher` hands every transmitter's new light timeline here while
the process records (a host's ports on circuit switches are transmitters of their own,
``n0.p1``, and their events carry no channel). Per transmitter, each stretch of time its
light reaches a receiver becomes an async event ``n0 -> n1 (ch 12)``; a dark or blocked stretch before it (a laser tuning, a WSS
settling) becomes a ``settle`` complete event on the same track, and its length the light
event's ``settle_us``. The received power is a counter per receiver, sampled at each change
(`DARK_DBM` while no light arrives). Entries still in the future may be withdrawn by the next
update (a new command), so they are kept pending until their time has passed; `flush` closes
everything when recording stops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oddl.common import lighttable
from oddl.common.config import TestbedConfig
from oddl.common.tracing import TRACE, Track

DARK_DBM = -99.0
"""The power counter's value while no light reaches a receiver (JSON has no -inf)."""
POWER = Track("emulators", "power")


@dataclass
class _Light:
    dst: int = lighttable.UNKNOWN
    since_ns: int = 0
    ident: str = ""
    name: str = ""


class LightTrace:
    """Turns light timelines into trace events (see the module docstring)."""

    def __init__(self, cfg: TestbedConfig, power_of: Callable[[str, float], float],
                 rows: Sequence[str] | None = None):
        """`rows`: the light table's transmitters by label (`oddl.common.lighttable.Row`;
        default: one per node), `power_of(row, t)` the power its light arrives with."""
        self.cfg = cfg
        self.nodes = list(rows) if rows is not None else [n.id for n in cfg.nodes]
        self._channels = {n.id: n.rx_channel for n in cfg.nodes if n.on_wss}
        self._power_of = power_of
        self._now: dict[str, _Light] = {n: _Light() for n in self.nodes}
        self._pending: dict[str, list[tuple[float, int]]] = {n: [] for n in self.nodes}
        self._count = 0
        self._lock = threading.Lock()
        self._mono_to_epoch_ns = time.time_ns() - time.monotonic_ns()

    def update(self, node: str, timeline: list[tuple[float, int]], now: float) -> None:
        """`node`'s light from `now` on (time.monotonic, as the light table's)."""
        with self._lock:
            self._settle_pending(node, now)
            for t, dst in timeline:
                if t <= now:
                    self._change(node, t, dst)
            self._pending[node] = [(t, d) for t, d in timeline if t > now]

    def flush(self) -> None:
        """Close every light event at the end of recording (pending entries that passed)."""
        with self._lock:
            now = time.monotonic()
            for node in self.nodes:
                self._settle_pending(node, now)
                light = self._now[node]
                if light.dst >= 0:
                    self._end(node, light, self._epoch(now))

    def _settle_pending(self, node: str, now: float) -> None:
        for t, dst in self._pending[node]:
            if t <= now:
                self._change(node, t, dst)
        self._pending[node] = []

    def _epoch(self, t_mono: float) -> int:
        return round(t_mono * 1e9) + self._mono_to_epoch_ns

    def _change(self, node: str, t: float, dst: int) -> None:
        light = self._now[node]
        if dst == light.dst:
            return
        at = self._epoch(t)
        track = Track("emulators", f"light {node}")
        settle_ns = 0
        if light.dst >= 0:
            self._end(node, light, at)
        elif light.since_ns:
            settle_ns = at - light.since_ns
        if dst < 0:
            self._now[node] = _Light(dst, at if light.dst >= 0 else light.since_ns or at)
            return
        receiver = self.nodes[dst]
        channel = self._channels.get(receiver, 0)  # 0: a port on a circuit switch
        if settle_ns:
            TRACE.complete(track, "settle", "light", light.since_ns, at, {
                "src": node, "receiver": receiver, "channel": channel,
                "settle_us": settle_ns / 1e3, "why": lighttable.REASONS.get(light.dst, "")})
        self._count += 1
        name = f"{node} -> {receiver} (ch {channel})" if channel else f"{node} -> {receiver}"
        ident = f"light/{node}/{self._count}"
        power = self._power_of(node, t)
        TRACE.begin(track, name, "light", ident, at, {
            "src": node, "receiver": receiver, "channel": channel,
            "settle_us": settle_ns / 1e3, "power_dbm": power})
        TRACE.counter(POWER, "power dBm", at, {receiver: power})
        self._now[node] = _Light(dst, at, ident, name)

    def _end(self, node: str, light: _Light, at: int) -> None:
        TRACE.end(Track("emulators", f"light {node}"), light.name, "light", light.ident, at)
        TRACE.counter(POWER, "power dBm", at, {self.nodes[light.dst]: DARK_DBM})
        self._now[node] = _Light(lighttable.DARK, at)
