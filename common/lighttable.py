"""The light table: where each emulated transmitter's light goes, as a timeline, in shared memory.

The emulator host owns the emulated lasers, WSS and circuit switches. Whenever one of them
handles a command it recomputes, for every transmitter, the receiver its light reaches now and
at each future instant the devices already know of (a laser locks at the end of its tuning
time, a WSS settles after RSW, a circuit switch completes a connection after its switching
time), and writes that timeline here. The agents' emulated physical layer
(`oddl.agents.links.light_phy`) reads it: a sender sends a chunk where the light goes when the
chunk starts, and the receiver keeps it only if the path held until the chunk's last bit.
The bytes move between the agents at kernel speed; the decision of where they may go is the
emulated devices'.

The table has one row per transmitter (`rows_of`): a host's tunable transmitter on a WSS, or
each of its fixed ports on a circuit switch (``n0.p1`` .. ``n0.p4``). On a testbed of WSS hosts
row i is node i.

Layout (little-endian, one file in the shared-memory folder, fixed size):
- header: magic b"ODDLLT02", u32 rows, u32 history, u32 writer pid, u32 padding, f64 the
  writer's heartbeat (time.monotonic, renewed every `HEARTBEAT_S`);
- per row: u64 version (a seqlock: odd while being written), u64 count (entries ever
  written), then `history` entries of (i64 epoch, i64 dst, f64 since);
- per row: counters the receivers write (delivered chunks and bytes, lost chunks and bytes,
  late chunks, worst lateness in s) for the fabric's statistics.

An entry says: from `since` (time.monotonic, shared by the processes of one machine) the
light goes to the receiver of row `dst` (the same node and port), or nowhere (dst < 0, with
the reason in `REASONS`). Entries only change the answer: consecutive entries never name the
same dst. A write may withdraw entries still in the future (a new command changed the plan)
but never one in the past.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from oddl.common.tracing import TRACE

if TYPE_CHECKING:
    from oddl.common.config import TestbedConfig

logger = logging.getLogger(__name__)

MAGIC = b"ODDLLT02"
HISTORY = 64
DARK, BLOCKED, NO_RECEIVER, FILTERED, UNKNOWN, GONE = -1, -2, -3, -4, -5, -6
NOT_CONNECTED, SWITCHING, PORT_DOWN = -7, -8, -9
REASONS = {DARK: "the transmitter is dark (off, tuning or reset)",
           BLOCKED: "the WSS blocks the channel (or is settling)",
           NO_RECEIVER: "the WSS port has no receiver",
           FILTERED: "the receiver's channel filter rejects the light",
           UNKNOWN: "unknown transmitter",
           GONE: "the emulated devices are gone (the emulator host is not running)",
           NOT_CONNECTED: "the circuit switch has no connection for the port",
           SWITCHING: "the circuit switch is making the port's connection",
           PORT_DOWN: "the circuit switch's port is disabled or failed"}
COUNTERS = ("delivered", "delivered_bytes", "lost", "lost_bytes", "late", "worst_late_s")
_HEAD = 32
HEARTBEAT_S = 0.2
STALE_S = 2.0
"""A table whose writer has not renewed its heartbeat for this long is dead (no light)."""
_ENTRY = np.dtype([("epoch", "<i8"), ("dst", "<i8"), ("since", "<f8")])


def _node_bytes(history: int) -> int:
    return 16 + history * _ENTRY.itemsize


def table_size(nodes: int, history: int = HISTORY) -> int:
    """Bytes of a table for `nodes` nodes."""
    return _HEAD + nodes * (_node_bytes(history) + 8 * len(COUNTERS))


@dataclass(frozen=True)
class Row:
    """One transmitter of the table: a node's tunable transmitter on a WSS (`port` 0) or its
    fixed port p`port` on a circuit switch, whose tx fibre enters `switch` at `ingress`."""

    node: str
    port: int = 0
    switch: str = ""
    ingress: int = 0

    @property
    def label(self) -> str:
        """``n0`` for a WSS transmitter, ``n0.p1`` for a port."""
        return self.node if self.port == 0 else f"{self.node}.p{self.port}"

    def why(self, code: int) -> str:
        """Why this transmitter's light reaches no receiver, naming the switch port."""
        if self.port and not self.switch:
            return f"{self.label}.tx has no fibre to a circuit switch"
        if self.switch and code == NOT_CONNECTED:
            return f"{self.switch} ingress {self.ingress} is not connected"
        if self.switch and code == SWITCHING:
            return f"{self.switch} is switching ingress {self.ingress}"
        if self.switch and code == NO_RECEIVER:
            return (f"the {self.switch} egress that ingress {self.ingress} is connected to has "
                    "no host port's rx")
        if self.switch and code == PORT_DOWN:
            return f"{self.switch}: a port of ingress {self.ingress}'s connection is down"
        return REASONS.get(code, f"no light path (code {code})")


def rows_of(cfg: TestbedConfig) -> tuple[Row, ...]:
    """The table's rows for a testbed, in node order: a node's WSS transmitter (if it has
    one), then each of its ports p1..pN. On a testbed of WSS hosts row i is node i."""
    wired = {(pl.node, pl.port): pl for pl in cfg.port_links()}
    rows: list[Row] = []
    for node in cfg.nodes:
        if node.on_wss:
            rows.append(Row(node.id))
        for port in range(1, node.ports + 1):
            pl = wired.get((node.id, port))
            rows.append(Row(node.id, port, pl.switch if pl else "", pl.ingress if pl else 0))
    return tuple(rows)


class LightTable:
    """A mapped light table (the writer creates it, readers open it by path)."""

    def __init__(self, path: str | os.PathLike[str], nodes: int, history: int, mm: mmap.mmap,
                 owner: bool):
        self.path = Path(path)
        self.nodes = nodes
        self.history = history
        self._mm = mm
        self._owner = owner
        node_bytes = _node_bytes(history)
        self._meta = [np.frombuffer(mm, dtype="<u8", count=2, offset=_HEAD + i * node_bytes)
                      for i in range(nodes)]
        self._entries = [np.frombuffer(mm, dtype=_ENTRY, count=history,
                                       offset=_HEAD + i * node_bytes + 16)
                         for i in range(nodes)]
        self.counters = np.frombuffer(mm, dtype="<f8", count=nodes * len(COUNTERS),
                                      offset=_HEAD + nodes * node_bytes
                                      ).reshape(nodes, len(COUNTERS))
        self._writer = np.frombuffer(mm, dtype="<u4", count=1, offset=16)
        self._beat = np.frombuffer(mm, dtype="<f8", count=1, offset=24)
        self._alive_checked = (0.0, True)

    @classmethod
    def create(cls, nodes: int, directory: str | os.PathLike[str] | None = None,
               history: int = HISTORY, path: str | os.PathLike[str] | None = None
               ) -> LightTable:
        """A new table in the shared-memory folder, every transmitter dark; at `path` when
        given (an emulator host restarting where the agents look): a table there whose writer
        has died is replaced, a live one is refused."""
        from oddl.common.shm import shm_dir

        if path is None:
            folder = Path(directory or shm_dir())
            sweep_dead_tables(folder)
            path = folder / f"oddl-light-{uuid.uuid4().hex}"
        else:
            path = Path(path)
            _remove_dead_table(path)
        size = table_size(nodes, history)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        mm[:24] = MAGIC + np.array([nodes, history, os.getpid(), 0], dtype="<u4").tobytes()
        table = cls(path, nodes, history, mm, owner=True)
        table.beat()
        for i in range(nodes):
            table._entries[i][0] = (0, DARK, -np.inf)
            table._meta[i][1] = 1
        return table

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> LightTable:
        """Map an existing table; ValueError when the file is not one."""
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < _HEAD:
                raise ValueError(f"{path} is not a light table (too short)")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic = mm[:8]
        if magic != MAGIC:
            mm.close()
            raise ValueError(f"{path} is not a light table (magic {magic!r})")
        nodes, history = (int(x) for x in np.frombuffer(mm, dtype="<u4", count=2, offset=8))
        if size != table_size(nodes, history):
            mm.close()
            raise ValueError(f"{path} has {size} B, a table of {nodes} nodes needs "
                             f"{table_size(nodes, history)} B")
        return cls(path, nodes, history, mm, owner=False)

    # ---- writer -----------------------------------------------------------------------
    def beat(self) -> None:
        """Renew the writer's heartbeat (the emulator host does, every HEARTBEAT_S)."""
        self._beat[0] = time.monotonic()

    def write(self, node: int, timeline: Sequence[tuple[float, int]], now: float) -> None:
        """Replace what lies after `now` in `node`'s timeline with `timeline` ((since, dst)
        pairs, the first one for `now`); entries that repeat the answer are left out."""
        meta, entries = self._meta[node], self._entries[node]
        count = int(meta[1])
        # withdraw planned entries that have not begun
        while count > 1 and entries[(count - 1) % self.history]["since"] > now:
            count -= 1
        last = int(entries[(count - 1) % self.history]["dst"])
        new = []
        for since, dst in timeline:
            if dst != last:
                new.append((since, dst))
                last = dst
        if count == int(meta[1]) and not new:
            return
        meta[0] += 1  # odd: being written
        for since, dst in new:
            entries[count % self.history] = (count, dst, since)
            count += 1
        meta[1] = count
        meta[0] += 1

    # ---- reader -----------------------------------------------------------------------
    @property
    def writer(self) -> int:
        """The pid of the process that writes this table (the emulator host)."""
        return int(self._writer[0])

    def alive(self) -> bool:
        """True while the writer runs: its process exists and its heartbeat is fresh
        (checked at most every 50 ms)."""
        now = time.monotonic()
        checked, ok = self._alive_checked
        if now - checked < 0.05:
            return ok
        ok = now - float(self._beat[0]) < STALE_S and _running(int(self._writer[0]))
        self._alive_checked = (now, ok)
        return ok

    def timeline(self, node: int) -> list[tuple[int, int, float]]:
        """A consistent copy of `node`'s entries, oldest first: (epoch, dst, since)."""
        meta, entries = self._meta[node], self._entries[node]
        while True:
            v1 = int(meta[0])
            if v1 % 2:
                continue
            count = int(meta[1])
            snap = entries.copy()
            if int(meta[0]) == v1:
                break
        first = max(0, count - self.history)
        return [tuple(snap[i % self.history].tolist()) for i in range(first, count)]

    def at(self, node: int, t: float) -> tuple[int, int]:
        """(epoch, dst) of the entry in force at time `t` (GONE when the writer is not
        running)."""
        if not self.alive():
            return (0, GONE)
        best = (0, UNKNOWN)
        for epoch, dst, since in self.timeline(node):
            if since <= t:
                best = (epoch, dst)
        return best

    def held(self, node: int, epoch: int, until: float) -> bool:
        """True when entry `epoch` of `node` is still known and no later entry began by
        `until` (the path did not change under a chunk that ended then)."""
        if not self.alive():
            return False
        line = self.timeline(node)
        known = [e for e, _, _ in line]
        if epoch not in known:
            return False
        return all(since > until for e, _, since in line if e > epoch)

    def close(self) -> None:
        """Unmap (and remove the file when this process created it)."""
        del self._meta, self._entries, self.counters, self._writer, self._beat
        try:
            self._mm.close()
        except BufferError:
            logger.debug("light table still referenced; unmapped at exit")
        if self._owner:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def _remove_dead_table(path: Path) -> None:
    try:
        old = LightTable.open(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} exists and is not a light table ({exc}); remove it") from exc
    try:
        if old.alive():
            raise ValueError(f"the light table {path} belongs to a running emulator host "
                             f"(pid {old.writer}); stop it first")
    finally:
        old.close()
    path.unlink(missing_ok=True)


def sweep_dead_tables(folder: Path) -> list[Path]:
    """Remove the tables in `folder` whose writer has died (an emulator host that was killed
    leaves its table behind); return the paths removed. Tables of running hosts, files that
    are not tables and files this user may not remove are left alone."""
    removed = []
    for path in folder.glob("oddl-light-*"):
        try:
            table = LightTable.open(path)
        except (OSError, ValueError):
            continue
        try:
            # both: a writer in another pid namespace (sharing this folder) still beats
            stale = time.monotonic() - float(table._beat[0]) >= STALE_S
            dead = stale and not _running(table.writer)
        finally:
            table.close()
        if dead:
            try:
                path.unlink()
            except OSError:
                continue
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    """True when process `pid` exists and is not a zombie (a killed, unreaped writer)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


class LightPublisher:
    """Keeps a light table current from the emulated devices (runs in the emulator host).

    `update()` is called by the emulators after every command they handle; it evaluates the
    light path of every node now and at each future instant the devices know of.
    """

    def __init__(self, table: LightTable, nodes: Sequence[str],
                 path_of: Callable[[str, float], int],
                 transitions: Callable[[float], list[float]],
                 clock: Callable[[], float] = time.monotonic):
        self.table = table
        self.nodes = list(nodes)
        self._path_of = path_of
        self._transitions = transitions
        self._clock = clock
        self._lock = threading.Lock()
        self.on_update: Callable[[str, list[tuple[float, int]], float], None] | None = None
        """Called with each node's new timeline while the trace records
        (`oddl.drivers.emulators.light_trace`)."""

    def update(self) -> None:
        """Recompute every node's timeline from the devices' state now."""
        with self._lock:
            now = self._clock()
            times = [now] + sorted(t for t in self._transitions(now) if t > now)
            for i, node in enumerate(self.nodes):
                timeline = [(t, self._path_of(node, t)) for t in times]
                self.table.write(i, timeline, now)
                if self.on_update is not None and TRACE.on:
                    self.on_update(node, timeline, now)
