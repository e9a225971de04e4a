"""The emulated physical layer of one node: a transmitter paced at the line rate and a receiver
that keeps a chunk only if the light carried it.

It reads the emulator host's light table (`oddl.common.lighttable`). Sending: the
transmitter is busy for 8 · (header + payload) / rate per chunk, so a chunk starts when the
previous one has left; the chunk goes to the node the light reaches at its start, or is lost
when the light reaches none. Receiving: the chunk is held until its serialisation end (or,
when chunks from several senders share this receiver on the ideal network, until the
receiver's port is free), then kept only if the light path it was sent on held until its last
bit and no other transmitter's chunk overlapped it here (a collision: the later-checked chunk
is lost). On the ideal network the chunk goes to the named node at the same line rate — for a
host with several ports, at that many times the line rate: an electrical port with the
bandwidth of all its optical ones.

A host with several ports on a circuit switch has a transmitter per port (a light table row
each, `oddl.common.lighttable.rows_of`), each paced on its own, so its ports carry chunks at
once: a chunk for a node goes on the port whose light reaches that node, and is lost, naming
what each port reaches, when none does. The chunk's header carries the transmitter row it
left on and the receiver row its light reached; the receiver paces each of its ports on its
own and checks the light held on the sender's row.

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

from oddl.agents.links.stream_wire import HEAD_BYTES, NO_ROW, ChunkHead, Sent
from oddl.agents.slot_gate import Cancel
from oddl.common.lighttable import COUNTERS, LightTable, Row

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
                 clock: Callable[[], float] = time.monotonic, rows: Sequence[Row] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        """`rows`: the light table's transmitters (`oddl.common.lighttable.rows_of` of the
        testbed file); default one per node, a WSS testbed's. `clock` and `sleep`: the
        time the wire is paced on (tests give a hand clock and a sleep that advances it)."""
        self.table = table
        self.nodes = list(nodes)
        self._index = {n: i for i, n in enumerate(self.nodes)}
        self.me = self._index[node]
        self.rows = tuple(rows) if rows is not None else tuple(Row(n) for n in self.nodes)
        if table.nodes != len(self.rows) or len(self.rows) >= NO_ROW:
            raise ValueError(f"{node}: the light table {table.path} has {table.nodes} "
                             f"transmitter rows, the testbed file {len(self.rows)}; start the "
                             "agent with the resolved file of the emulator host that wrote it")
        self._rows_of: dict[str, list[int]] = {}
        for i, row in enumerate(self.rows):
            self._rows_of.setdefault(row.node, []).append(i)
        self.mine = tuple(self._rows_of.get(node, ()))
        """This node's transmitter rows: its laser on a WSS, or each of its ports."""
        if not self.mine:
            raise ValueError(f"{node} has neither a transmitter nor ports in the testbed file; "
                             "the emulated light cannot carry its chunks")
        self.rate = line_rate_bps
        self.clock = clock
        self._sleep = sleep
        self._tx_free = dict.fromkeys(self.mine, 0.0)
        self._rx_free = dict.fromkeys(self.mine, 0.0)
        self._recent: dict[int, dict[int, deque[tuple[float, float]]]] = {}
        self._lock = threading.Lock()
        self._row = table.counters[self.mine[0]]
        self._reopened_at = 0.0
        self._warned = 0.0
        self._warned_misdirected = -60.0
        self.misdirected_chunks = 0
        self.lost_by_reason: dict[str, int] = {}

    # ---- transmitter ------------------------------------------------------------------
    def transmit(self, src: str, dst: str, nbytes: int, cancel: Cancel | None,
                 on_light: bool = True) -> Sent:
        """Send a chunk of `nbytes` for `dst` once its transmitter is free (see `Phy`): on
        the light of this node's one transmitter wherever it goes, or, for a node with ports,
        on the port whose light reaches `dst` now (the one free soonest, the first on a tie);
        lost when none does. Off the light: the ideal network, to `dst`."""
        if not on_light:  # an electrical port as fast as all this node's optical ones
            t0, t1 = self._pace(self.mine[0], nbytes, cancel, ports=len(self.mine))
            rx = self._rows_of.get(dst, [NO_ROW])[0]
            return Sent(dst, "", IDEAL_EPOCH, t0, t1, self.mine[0], rx)
        if len(self.mine) == 1 and self.rows[self.mine[0]].port == 0:
            row = self.mine[0]  # one tunable transmitter: where its light goes
        else:
            picked, reason = self._port_to(dst)
            if picked is None:
                now = self.clock()
                return Sent(None, reason, 0, now, now)
            row = picked
        t0, t1 = self._pace(row, nbytes, cancel)
        epoch, to = self._current().at(row, t0)
        if to < 0 or to >= len(self.rows):
            return Sent(None, self.rows[row].why(to), epoch, t0, t1, row)
        return Sent(self.rows[to].node, "", epoch, t0, t1, row, to)

    def _pace(self, row: int, nbytes: int, cancel: Cancel | None,
              ports: int = 1) -> tuple[float, float]:
        """Book transmitter `row` for a chunk at `ports` times the line rate; wait until it
        starts: (start, end)."""
        ser = 8.0 * (nbytes + HEAD_BYTES) / (self.rate * ports)
        with self._lock:
            t0 = max(self.clock(), self._tx_free[row])
            t1 = self._tx_free[row] = t0 + ser
        # the chunk leaves when the previous one has; a late wake-up here shows up at the
        # receiver as a late chunk, not as a slower wire
        _sleep_until(self.clock, t0, cancel, self._sleep)
        return t0, t1

    def _port_to(self, dst: str) -> tuple[int | None, str]:
        """This node's row whose light reaches `dst` now, or None and what each reaches."""
        table = self._current()
        now = self.clock()
        best: int | None = None
        seen = []
        for row in self.mine:
            _, to = table.at(row, now)
            name = f"p{self.rows[row].port}" if self.rows[row].port else "tx"
            if 0 <= to < len(self.rows):
                seen.append(f"{name}→{self.rows[to].node}")
                if self.rows[to].node == dst and (
                        best is None or self._tx_free[row] < self._tx_free[best]):
                    best = row
            else:
                seen.append(f"{name} dark: {self.rows[row].why(to)}")
        return best, f"no port's light reaches {dst} ({', '.join(seen)})"

    def lost(self, src: str, reason: str, nbytes: int) -> None:
        self._count_loss(f"{src}: {reason}", nbytes)

    def misdirected(self, dst: str, reached: str, nbytes: int) -> None:
        """A chunk meant for `dst` left on light that reaches `reached`, which drops it as
        misrouted (and counts it): warned about here, once a minute, since `dst` sees nothing."""
        self.misdirected_chunks += 1
        now = self.clock()
        if now - self._warned_misdirected > 60.0:
            self._warned_misdirected = now
            check = ("this node's transmitter channel and the WSS route"
                     if self.rows[self.mine[0]].port == 0 else "the circuit switch's connections")
            logger.warning("%s: a chunk of %d B for %s left on light that reaches %s (%d so "
                           "far): check %s (`oddl status`)", self.nodes[self.me], nbytes, dst,
                           reached, self.misdirected_chunks, check)

    # ---- receiver ---------------------------------------------------------------------
    def receive(self, src: str, head: ChunkHead, arrived: float,
                cancel: Cancel | None) -> str:
        """Hold the chunk until its delivery time at the port it arrived on (`head.rx`), then
        "" when the light carried it, else why it is lost."""
        now = self.clock()
        ser = head.t_end - head.t_start
        rx = head.rx if head.rx in self._rx_free else self.mine[0]
        with self._lock:
            deliver = max(head.t_end, self._rx_free[rx] + ser)
            self._rx_free[rx] = deliver
        late = arrived - deliver  # the wire (sender, network, reader) fell behind, not us
        if late > LATE_S:
            self._note_late(src, late, now)
        else:
            _sleep_until(self.clock, deliver, cancel, self._sleep)
        reason = self._check(src, head, rx)
        if reason:
            self._count_loss(reason, head.nbytes)
            return reason
        self._row[_C["delivered"]] += 1
        self._row[_C["delivered_bytes"]] += head.nbytes
        return ""

    def _check(self, src: str, head: ChunkHead, rx: int) -> str:
        """Why a chunk from `src` that arrived on row `rx` is lost ("" when it is not)."""
        theirs = self._rows_of.get(src)
        if theirs is None:
            return f"unknown transmitter {src}"
        if head.epoch == IDEAL_EPOCH:
            return ""
        if head.tx not in theirs:
            return (f"a chunk from {src} names transmitter row {head.tx}, not one of "
                    f"{src}'s ({', '.join(self.rows[r].label for r in theirs)})")
        if not self._current().held(head.tx, head.epoch, head.t_end):
            return f"the light path from {self.rows[head.tx].label} changed during the chunk"
        return self._collision(rx, head.tx, head)

    def _note_late(self, src: str, late: float, now: float) -> None:
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
        if not fresh.alive() or fresh.writer == table.writer or fresh.nodes != table.nodes:
            fresh.close()
            return table
        with self._lock:
            self.table, self._row = fresh, fresh.counters[self.mine[0]]
        logger.warning("%s: the emulator host restarted; reading its new light table %s",
                       self.nodes[self.me], fresh.path)
        return fresh

    def _collision(self, rx: int, tx: int, head: ChunkHead) -> str:
        """Another transmitter's chunk overlapped this one at receiver `rx` (on a WSS; a
        circuit switch connects one ingress to an egress, so its receivers never see one)."""
        recent = self._recent.setdefault(rx, {})
        for other, spans in recent.items():
            if other != tx and any(a < head.t_end and head.t_start < b for a, b in spans):
                return (f"collision at {self.rows[rx].label} ({self.rows[other].label} and "
                        f"{self.rows[tx].label})")
        recent.setdefault(tx, deque(maxlen=8)).append((head.t_start, head.t_end))
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


def _sleep_until(clock: Callable[[], float], t: float, cancel: Cancel | None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    while True:
        remaining = t - clock()
        if remaining <= 0 or (cancel is not None and cancel.is_set()):
            return
        sleep(min(remaining, 0.05))
