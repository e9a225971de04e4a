"""The index of every run: one SQLite file (stdlib sqlite3), one table of runs and one of
points with a column per factor and per metric, so ``pandas.read_sql("SELECT * FROM points",
sqlite3.connect(path))`` reads it. The SQL and the row shapes are here; the callers open the
file (`connect`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from oddl.common.errors import ConfigError
from oddl.experiment.spec import FACTOR_NAMES, TESTBED_KNOBS

INDEX_NAME = "index.sqlite"
"""The index's file, beside the run folders (runs/experiments/index.sqlite)."""

RUN_COLUMNS: dict[str, str] = {
    "run_id": "TEXT PRIMARY KEY", "name": "TEXT", "kind": "TEXT", "description": "TEXT",
    "status": "TEXT", "started": "TEXT", "finished": "TEXT", "folder": "TEXT",
    "testbed": "TEXT", "experiment_sha256": "TEXT", "command": "TEXT",
    "oddl_version": "TEXT", "git_commit": "TEXT", "git_dirty": "INTEGER",
    "hostname": "TEXT", "cpu_count": "INTEGER", "points_total": "INTEGER",
    "points_ok": "INTEGER", "points_failed": "INTEGER"}
"""The runs table. status: running, stopped (by --stop-after or a crash), done."""

METRICS = ("time_ms", "min_ms", "max_ms", "bound_ms", "retunes", "iteration_ms",
           "allreduce_ms", "final_loss", "final_accuracy")
"""The metric columns: allreduce's median, fastest and slowest call of a repeat, the
line-rate bound and the retunes per call; train's median iteration and all-reduce time, the
final loss and accuracy."""

FACTOR_TYPES = {"collective": "TEXT", "network": "TEXT", "hosts": "INTEGER",
                "size_bytes": "INTEGER", "params": "INTEGER", "iterations": "INTEGER",
                **{k: "REAL" for k in TESTBED_KNOBS}}

POINT_COLUMNS: dict[str, str] = {
    "run_id": "TEXT NOT NULL", "point": "INTEGER NOT NULL", "repeat": "INTEGER NOT NULL",
    "variant": "TEXT", "status": "TEXT", "error": "TEXT",
    **{k: FACTOR_TYPES[k] for k in FACTOR_NAMES}, **{m: "REAL" for m in METRICS},
    "started": "TEXT", "elapsed_s": "REAL", "metrics_json": "TEXT"}
"""The points table: one row per point and repeat. The testbed knobs hold the value the
point's testbed file had, swept or not."""


def connect(path: Path) -> sqlite3.Connection:
    """Open (and create) the index at `path`; rows come back as sqlite3.Row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    runs = ", ".join(f"{k} {t}" for k, t in RUN_COLUMNS.items())
    points = ", ".join(f'"{k}" {t}' for k, t in POINT_COLUMNS.items())
    conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({runs})")
    conn.execute(f"CREATE TABLE IF NOT EXISTS points ({points}, "
                 "PRIMARY KEY (run_id, point, repeat))")
    conn.commit()
    return conn


def _upsert(conn: sqlite3.Connection, table: str, columns: Iterable[str],
            row: Mapping[str, Any]) -> None:
    names = [c for c in columns if c in row]
    quoted = ", ".join(f'"{c}"' for c in names)
    marks = ", ".join("?" for _ in names)
    conn.execute(f"INSERT OR REPLACE INTO {table} ({quoted}) VALUES ({marks})",
                 [row[c] for c in names])
    conn.commit()


def put_run(conn: sqlite3.Connection, row: Mapping[str, Any]) -> None:
    """Insert or replace one run's row (the keys of RUN_COLUMNS it has)."""
    unknown = set(row) - set(RUN_COLUMNS)
    assert not unknown, unknown
    _upsert(conn, "runs", RUN_COLUMNS, row)


def put_point(conn: sqlite3.Connection, row: Mapping[str, Any]) -> None:
    """Insert or replace one point's row (the keys of POINT_COLUMNS it has)."""
    unknown = set(row) - set(POINT_COLUMNS)
    assert not unknown, unknown
    _upsert(conn, "points", POINT_COLUMNS, row)


def runs(conn: sqlite3.Connection, name: str | None = None) -> list[dict[str, Any]]:
    """Every run (of `name`), oldest first."""
    sql, args = "SELECT * FROM runs", ()  # type: tuple[str, tuple[str, ...]]
    if name:
        sql, args = sql + " WHERE name = ?", (name,)
    return [dict(r) for r in conn.execute(sql + " ORDER BY started, run_id", args)]


def points(conn: sqlite3.Connection, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The points of these runs, in run, point and repeat order."""
    marks = ", ".join("?" for _ in run_ids)
    rows = conn.execute(f'SELECT * FROM points WHERE run_id IN ({marks}) '
                        f'ORDER BY run_id, point, "repeat"', list(run_ids))
    return [dict(r) for r in rows]


def resolve_run(all_runs: Sequence[Mapping[str, Any]], ref: str) -> str:
    """The run id `ref` names (pure over the runs' rows): an id, a unique prefix of one,
    ``latest``, or an experiment's name (its latest run). ConfigError naming the fix."""
    if not all_runs:
        raise ConfigError("the index holds no runs yet; run one with `oddl experiment run "
                          "FILE` (or pass --index of another index)")
    ids = [str(r["run_id"]) for r in all_runs]
    if ref == "latest":
        return ids[-1]
    if ref in ids:
        return ref
    named = [str(r["run_id"]) for r in all_runs if r["name"] == ref]
    if named:
        return named[-1]
    prefixed = [i for i in ids if i.startswith(ref)]
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:
        raise ConfigError(f"run {ref!r} is ambiguous ({', '.join(prefixed[:5])}); give more "
                          "of the id")
    raise ConfigError(f"no run {ref!r} in the index; `oddl experiment list` shows the runs "
                      "(an id, a unique prefix, an experiment's name, or latest)")
