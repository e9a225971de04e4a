"""`oddl experiment run` on the emulated four-node testbed (one start for the module): a tiny
experiment (two points, one repeat, 4 KiB) with --trace leaves a run folder whose manifest
checks, the devices read back before and after, the merged timeline, and index rows that
pandas reads."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from oddl.cli.main import main
from oddl.experiment.index import INDEX_NAME
from oddl.experiment.provenance import check_manifest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TINY = """[experiment]
name = "tiny"
testbed = "emulated-4node"
kind = "allreduce"
calls = 2

[factors]
collective = "ring"
network = ["optical", "ideal"]
size_bytes = 4096
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the runs folder, the run folder) of one traced run of TINY."""
    tmp = tmp_path_factory.mktemp("exp")
    path = tmp / "tiny.toml"
    path.write_text(TINY, encoding="utf-8")
    runs = tmp / "runs"
    assert main(["experiment", "run", str(path), "--runs", str(runs), "--trace"]) == 0
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    return runs, folder


def test_the_run_folder_holds_what_ran_and_checks(run: tuple[Path, Path]) -> None:
    _runs, folder = run
    assert check_manifest(folder) == []
    results = json.loads((folder / "results.json").read_text())
    assert results["status"] == "done"
    assert [(p["factors"]["network"], p["status"]) for p in results["points"]] == [
        ("optical", "ok"), ("ideal", "ok")]
    for p in results["points"]:
        m = p["metrics"]
        assert len(m["calls_ms"]) == 2 and m["min_ms"] <= m["time_ms"] <= m["max_ms"]
        assert m["bound_ms"] == pytest.approx(2 * 3 / 4 * 4096 * 8 / 3e9 * 1e3)
    for when in ("before", "after"):
        devices = json.loads((folder / "devices" / f"v0-{when}.json").read_text())["devices"]
        assert {d["id"] for d in devices} >= {"laser0", "laser3", "wss0", "pm0"}
        assert all(d["reachable"] for d in devices)
    assert (folder / "trace" / "v0" / "timeline.json").is_file()
    assert list((folder / "trace" / "v0").glob("agent-*.trace.json"))


def test_the_index_rows_read_with_pandas(run: tuple[Path, Path]) -> None:
    pd = pytest.importorskip("pandas")
    runs, folder = run
    with sqlite3.connect(runs / INDEX_NAME) as conn:
        points = pd.read_sql("SELECT * FROM points", conn)
        run_rows = pd.read_sql("SELECT * FROM runs", conn)
    conn.close()
    assert list(run_rows["run_id"]) == [folder.name]
    assert list(run_rows["points_ok"]) == [2]
    assert sorted(points["network"]) == ["ideal", "optical"]
    assert (points["time_ms"] > 0).all() and (points["hosts"] == 4).all()
    assert (points["laser_tune_ms"] == 2.0).all()  # the testbed file's value, read back
