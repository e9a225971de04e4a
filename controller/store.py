"""The controller's durable state in SQLite: jobs, the last verified device configuration, and
the event log. Written as things change; read once at start-up to resume after a restart.

One file, WAL journal, one connection guarded by a lock (the controller's threads share it).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from oddl.common.errors import ConfigError
from oddl.drivers.interfaces import Route

logger = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS verified (device TEXT PRIMARY KEY, doc TEXT NOT NULL,
                                     verified_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, time_ns INTEGER,
                                   device TEXT, action TEXT, ok INTEGER, detail TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class Store:
    """Durable controller state; every method is safe to call from any thread."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise ConfigError(f"{self.path}: cannot open the controller state database ({exc}); "
                              "check the path and its permissions, or move the broken file "
                              "away to start afresh") from exc
        self._lock = threading.RLock()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """The writes inside as one transaction, one commit: a retune of N lasers writes N
        events and N channels, not 2N commits (decision record 0034)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    # ---- jobs -------------------------------------------------------------------------
    def save_job(self, doc: dict[str, Any]) -> None:
        """Insert or replace one job (a JSON-friendly dict with an 'id')."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO jobs (id, doc) VALUES (?, ?)",
                             (doc["id"], json.dumps(doc)))

    def jobs(self) -> list[dict[str, Any]]:
        """Every stored job, in id order of insertion."""
        with self._lock:
            rows = self._db.execute("SELECT doc FROM jobs ORDER BY rowid").fetchall()
        return [json.loads(r[0]) for r in rows]

    # ---- verified configuration ---------------------------------------------------------
    def save_settings(self, channels: Mapping[str, int], tables: Mapping[str, Mapping[int, Route]],
                      connections: Mapping[str, Mapping[int, int]], devices: Sequence[str],
                      verified_ns: int) -> None:
        """Record the verified setting of each of `devices` found in `channels`, `tables` or
        `connections` (a configuration's), in one transaction."""
        with self.batch():
            for dev in devices:
                if dev in channels:
                    self.save_channel(dev, channels[dev], verified_ns)
                elif dev in tables:
                    self.save_table(dev, dict(tables[dev]), verified_ns)
                elif dev in connections:
                    self.save_connections(dev, dict(connections[dev]), verified_ns)

    def save_channel(self, transmitter: str, channel: int, verified_ns: int) -> None:
        """Record a transmitter's verified channel."""
        self._save_verified(transmitter, {"channel": channel}, verified_ns)

    def save_table(self, wss: str, table: dict[int, Route], verified_ns: int) -> None:
        """Record a WSS's verified channel table."""
        doc = {"table": {str(ch): [r.port, r.attenuation_db] for ch, r in table.items()}}
        self._save_verified(wss, doc, verified_ns)

    def save_connections(self, switch: str, table: dict[int, int], verified_ns: int) -> None:
        """Record a circuit switch's verified connection table {ingress: egress}."""
        doc = {"connections": {str(i): e for i, e in sorted(table.items())}}
        self._save_verified(switch, doc, verified_ns)

    def _save_verified(self, device: str, doc: dict[str, Any], verified_ns: int) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO verified (device, doc, verified_ns) "
                             "VALUES (?, ?, ?)", (device, json.dumps(doc), verified_ns))

    def verified(self) -> tuple[dict[str, int], dict[str, dict[int, Route]], dict[str, int]]:
        """(transmitter channels, WSS tables, verified_ns per device) last stored."""
        with self._lock:
            rows = self._db.execute("SELECT device, doc, verified_ns FROM verified").fetchall()
        channels: dict[str, int] = {}
        tables: dict[str, dict[int, Route]] = {}
        stamps: dict[str, int] = {}
        for device, raw, ns in rows:
            doc = json.loads(raw)
            if "channel" in doc:
                channels[device] = int(doc["channel"])
            elif "connections" in doc:
                pass  # a circuit switch's: `connections()`
            else:
                tables[device] = {int(ch): Route(int(p), float(a))
                                  for ch, (p, a) in doc["table"].items()}
            stamps[device] = int(ns)
        return channels, tables, stamps

    def connections(self) -> dict[str, dict[int, int]]:
        """The circuit switches' verified connection tables last stored ({ingress: egress});
        their times are in `verified()`'s stamps."""
        with self._lock:
            rows = self._db.execute("SELECT device, doc FROM verified").fetchall()
        tables: dict[str, dict[int, int]] = {}
        for device, raw in rows:
            doc = json.loads(raw)
            if "connections" in doc:
                tables[device] = {int(i): int(e) for i, e in doc["connections"].items()}
        return tables

    # ---- events and counters ------------------------------------------------------------
    def add_event(self, time_ns: int, device: str, action: str, ok: bool, detail: str) -> None:
        """Append one device/controller event."""
        with self._lock:
            self._db.execute("INSERT INTO events (time_ns, device, action, ok, detail) "
                             "VALUES (?, ?, ?, ?, ?)", (time_ns, device, action, int(ok), detail))

    def events(self, limit: int = 2000) -> list[tuple[int, str, str, bool, str]]:
        """The newest `limit` events, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT time_ns, device, action, ok, detail FROM events "
                                    "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [(t, d, a, bool(ok), det) for t, d, a, ok, det in reversed(rows)]

    def get_meta(self, key: str, default: str = "") -> str:
        """A stored string value."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        """Store a string value."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                             (key, value))
