"""The emulated physical layer of one node: a transmitter paced at the line rate and a receiver
that keeps a chunk only if the light carried it.

It reads the emulator host's light table (`oddl.common.lighttable`). Sending: the
transmitter is busy for 8 · (header + payload) / rate per chunk, so a chunk starts when the
previous one has left; the chunk goes to the node the light reaches at its start, or is lost
when the light reaches none. Receiving: the chunk is held until its serialisation end (or,
when chunks from several senders share this receiver on the ideal network, until the
receiver's port is free), then kept only if the light path it was sent on held until its last
bit and no other transmitter's chunk overlapped it here (a collision: the later-checked chunk
is lost). On the ideal network the chunk goes to the named node at the same line rate.

A chunk that arrives after its delivery time means this machine cannot carry the emulated
line rate: it is counted as late, with the worst lateness, and warned about once a minute;
lower `[fabric] line_rate_gbps` until none are.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from oddl.agents.links.stream_wire import HEAD_BYTES, ChunkHead
from oddl.agents.slot_gate import Cancel
from oddl.common.lighttable import COUNTERS, REASONS, LightTable

logger = logging.getLogger(__name__)

IDEAL_EPOCH = 0xFFFFFFFF
"""The epoch a chunk on the ideal electrical network carries (no light path involved)."""

LATE_S = 1e-3
"""A chunk read more than this after its delivery time counts as late."""

_C = {name: i for i, name in enumerate(COUNTERS)}


REOPEN_S = 0.5
"""How often a node looks for a restarted emulator host's light table."""


class LightPhy:
    """The physical layer of node `node` on the emulated fabric (see the module docstring)."""

    def __init__(self, table: LightTable, nodes: Sequence[str], node: str, line_rate_bps: float,
                 clock: Callable[[], float] = time.monotonic):
        self.table = table
        self.nodes = list(nodes)
        self._index = {n: i for i, n in enumerate(self.nodes)}
        self.me = self._index[node]
        self.rate = line_rate_bps
        self.clock = clock
        self._tx_free = 0.0
        self._rx_free = 0.0
        self._recent: dict[int, deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()
        self._row = table.counters[self.me]
        self._reopened_at = 0.0
        self._warned = 0.0
        self._warned_misdirected = -60.0
        self.misdirected_chunks = 0
        self.lost_by_reason: dict[str, int] = {}

    # ---- transmitter ------------------------------------------------------------------
    def transmit(self, src: str, dst: str | None, nbytes: int,
                 cancel: Cancel | None) -> tuple[str | None, str, int, float, float]:
        ser = 8.0 * (nbytes + HEAD_BYTES) / self.rate
        with self._lock:
            t0 = max(self.clock(), self._tx_free)
            t1 = self._tx_free = t0 + ser
        # the chunk leaves when the previous one has; a late wake-up here shows up at the
        # receiver as a late chunk, not as a slower wire
        _sleep_until(self.clock, t0, cancel)
        if dst is not None:
            return dst, "", IDEAL_EPOCH, t0, t1
        epoch, to = self._current().at(self.me, t0)
        if to < 0:
            return None, REASONS.get(to, f"no light path (code {to})"), epoch, t0, t1
        return self.nodes[to], "", epoch, t0, t1

    def lost(self, src: str, reason: str, nbytes: int) -> None:
        self._count_loss(f"{src}: {reason}", nbytes)

    def misdirected(self, dst: str, reached: str, nbytes: int) -> None:
        """A chunk meant for `dst` left on light that reaches `reached`, which drops it as
        misrouted (and counts it): warned about here, once a minute, since `dst` sees nothing."""
        self.misdirected_chunks += 1
        now = self.clock()
        if now - self._warned_misdirected > 60.0:
            self._warned_misdirected = now
            logger.warning("%s: a chunk of %d B for %s left on light that reaches %s (%d so "
                           "far): check this node's transmitter channel and the WSS route "
                           "(`oddl status`)", self.nodes[self.me], nbytes, dst, reached,
                           self.misdirected_chunks)

    # ---- receiver ---------------------------------------------------------------------
    def receive(self, src: str, head: ChunkHead, arrived: float,
                cancel: Cancel | None) -> str:
        now = self.clock()
        ser = head.t_end - head.t_start
        with self._lock:
            deliver = max(head.t_end, self._rx_free + ser)
            self._rx_free = deliver
        late = arrived - deliver  # the wire (sender, network, reader) fell behind, not us
        if late > LATE_S:
            self._row[_C["late"]] += 1
            self._row[_C["worst_late_s"]] = max(self._row[_C["worst_late_s"]], late)
            if now - self._warned > 60.0:
                self._warned = now
                logger.warning(
                    "%s: the emulated fabric falls behind its line rate: a chunk from %s "
                    "arrived %.1f ms after its serialisation end (%d late so far); lower "
                    "[fabric] line_rate_gbps (now %.2f Gbit/s) until none are late",
                    self.nodes[self.me], src, late * 1e3, int(self._row[_C["late"]]),
                    self.rate / 1e9)
        else:
            _sleep_until(self.clock, deliver, cancel)
        reason = ""
        s = self._index.get(src)
        if s is None:
            reason = f"unknown transmitter {src}"
        elif head.epoch != IDEAL_EPOCH:
            if not self._current().held(s, head.epoch, head.t_end):
                reason = f"the light path from {src} changed during the chunk"
            else:
                reason = self._collision(s, head)
        if reason:
            self._count_loss(reason, head.nbytes)
            return reason
        self._row[_C["delivered"]] += 1
        self._row[_C["delivered_bytes"]] += head.nbytes
        return ""

    def _current(self) -> LightTable:
        """The light table; when its writer (the emulator host) has died, the table a
        restarted host made at the same path, once it is there."""
        table = self.table
        now = self.clock()
        if table.alive() or now - self._reopened_at < REOPEN_S:
            return table
        self._reopened_at = now
        try:
            fresh = LightTable.open(table.path)
        except (OSError, ValueError):
            return table
        if not fresh.alive() or fresh.writer == table.writer:
            fresh.close()
            return table
        with self._lock:
            self.table, self._row = fresh, fresh.counters[self.me]
        logger.warning("%s: the emulator host restarted; reading its new light table %s",
                       self.nodes[self.me], fresh.path)
        return fresh

    def _collision(self, s: int, head: ChunkHead) -> str:
        """Another transmitter's chunk overlapped this one at this receiver."""
        for other, spans in self._recent.items():
            if other != s and any(a < head.t_end and head.t_start < b for a, b in spans):
                return f"collision at {self.nodes[self.me]} ({self.nodes[other]} and " \
                       f"{self.nodes[s]})"
        self._recent.setdefault(s, deque(maxlen=8)).append((head.t_start, head.t_end))
        return ""

    def _count_loss(self, reason: str, nbytes: int) -> None:
        with self._lock:
            self._row[_C["lost"]] += 1
            self._row[_C["lost_bytes"]] += nbytes
            self.lost_by_reason[reason] = self.lost_by_reason.get(reason, 0) + 1
        logger.warning("%s: the emulated fabric lost %d B: %s", self.nodes[self.me], nbytes,
                       reason)

    @property
    def late(self) -> int:
        """Chunks read after their delivery time (the machine fell behind the wire)."""
        return int(self._row[_C["late"]])

    @property
    def worst_late_s(self) -> float:
        return float(self._row[_C["worst_late_s"]])


def _sleep_until(clock: Callable[[], float], t: float, cancel: Cancel | None) -> None:
    while True:
        remaining = t - clock()
        if remaining <= 0 or (cancel is not None and cancel.is_set()):
            return
        time.sleep(min(remaining, 0.05))
