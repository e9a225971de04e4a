"""The experiment runner's bookkeeping with a scripted bench (no processes): the run folder
and its manifest, the index rows, a failing point recorded while the others go on, a testbed
that does not start, stopping after k points and resuming without redoing them, the export
and the figures. The runner on a real emulated testbed: tests/e2e/test_experiment_e2e.py."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from oddl.cli.main import main
from oddl.common.config import load_testbed
from oddl.common.errors import ConfigError, LostData
from oddl.experiment import index
from oddl.experiment.points import Point
from oddl.experiment.provenance import MANIFEST, check_manifest
from oddl.experiment.runner import Outcome, RunOptions, run_experiment
from oddl.experiment.spec import Experiment

FILE = """[experiment]
name = "scripted"
testbed = "emulated-4node"
kind = "allreduce"
repeats = 2

[factors]
collective = ["ring", "halving-doubling"]
size_bytes = [4096, 65536]
laser_tune_ms = [0.5, 5.0]
"""


class ScriptedBench:
    """Answers every point with a time from its factors; fails the points `failing` names."""

    started: list[Path] = []
    measured: list[tuple[int, int]] = []
    failing: set[tuple[int, int]] = set()
    refuse_start: set[str] = set()
    interrupt_at: tuple[int, int] | None = None
    """The point at which the "operator" presses Ctrl-C."""

    def __init__(self, config: Path, workdir: Path, exp: Experiment, trace: Path | None):
        if config.stem in self.refuse_start:
            raise LostData("the emulators did not come up")
        self.cfg = load_testbed(config)
        ScriptedBench.started.append(config)

    def measure(self, point: Point) -> dict[str, Any]:
        if point.key == self.interrupt_at:
            raise KeyboardInterrupt
        ScriptedBench.measured.append(point.key)
        if point.key in self.failing:
            raise LostData(f"chunks of point {point.index} did not arrive")
        t = point.factors["size_bytes"] / 4096 * self.cfg.timing.laser_tune_ms + point.repeat
        return {"time_ms": t, "min_ms": t, "max_ms": t, "bound_ms": 0.01, "retunes": 0.0}

    def devices(self) -> dict[str, Any]:
        return {"devices": [{"id": "laser0", "channel": 1}]}

    def close(self) -> None:
        pass


@pytest.fixture
def scripted(tmp_path: Path) -> Path:
    ScriptedBench.started, ScriptedBench.measured = [], []
    ScriptedBench.failing, ScriptedBench.refuse_start = set(), set()
    ScriptedBench.interrupt_at = None
    path = tmp_path / "scripted.toml"
    path.write_text(FILE, encoding="utf-8")
    return path


def _run(path: Path, root: Path, **kw: Any) -> Outcome:
    lines: list[str] = []
    opts = RunOptions(root=root, command="oddl experiment run scripted.toml", say=lines.append,
                      **kw)
    out = run_experiment(path, opts, ScriptedBench)
    out.lines = lines  # type: ignore[attr-defined]
    return out


def test_a_run_leaves_a_checked_folder_and_index_rows(scripted: Path, tmp_path: Path) -> None:
    ScriptedBench.failing = {(1, 0)}
    out = _run(scripted, tmp_path / "runs")
    assert (out.status, out.ran, out.failed) == ("done", 16, 1)
    assert [c.name for c in ScriptedBench.started] == ["v0.toml", "v1.toml"]  # once a variant
    folder = out.folder.path
    for rel in ("experiment.toml", "run.json", "command.txt", "testbeds/base.toml",
                "testbeds/v0.toml", "testbeds/v1.toml", "devices/v0-before.json",
                "devices/v1-after.json", "results.json", "results.jsonl", MANIFEST):
        assert (folder / rel).is_file(), rel
    assert check_manifest(folder) == []
    listed = (folder / MANIFEST).read_text().splitlines()
    assert any(line.endswith("  testbeds/v1.toml") for line in listed)
    run = json.loads((folder / "run.json").read_text())
    session = run["sessions"][0]
    assert session["command"] == "oddl experiment run scripted.toml"
    assert session["versions"]["numpy"] and session["host"]["cpu_count"]
    assert "commit" in session["git"] and run["status"] == "done"

    conn = sqlite3.connect(tmp_path / "runs" / index.INDEX_NAME)
    conn.row_factory = sqlite3.Row
    (row,) = [dict(r) for r in conn.execute("SELECT * FROM runs")]
    points = [dict(r) for r in conn.execute("SELECT * FROM points ORDER BY point, repeat")]
    conn.close()
    assert (row["run_id"], row["points_total"], row["points_ok"], row["points_failed"]) == (
        out.folder.run_id, 16, 15, 1)
    assert len(points) == 16
    failed = next(p for p in points if p["status"] == "failed")
    assert (failed["point"], failed["repeat"]) == (1, 0)
    assert failed["error"] == "LostData: chunks of point 1 did not arrive"
    slow = next(p for p in points if p["point"] == 5 and p["repeat"] == 1)
    assert (slow["laser_tune_ms"], slow["size_bytes"], slow["time_ms"]) == (5.0, 65536, 81.0)
    assert slow["line_rate_gbps"] == 3.0  # the testbed's value, though not swept
    assert any("FAILED: LostData" in line for line in out.lines)  # type: ignore[attr-defined]
    assert any("left" in line for line in out.lines)  # type: ignore[attr-defined]


def test_a_stopped_run_resumes_where_it_stopped(scripted: Path, tmp_path: Path) -> None:
    first = _run(scripted, tmp_path / "runs", stop_after=5)
    assert (first.status, first.ran) == ("stopped", 5)
    assert check_manifest(first.folder.path) == []
    done = list(ScriptedBench.measured)
    ScriptedBench.measured = []
    second = _run(scripted, tmp_path / "runs", resume="latest")
    assert second.folder.path == first.folder.path
    assert (second.status, second.skipped, second.ran) == ("done", 5, 11)
    assert not set(done) & set(ScriptedBench.measured)  # no point ran twice
    assert sorted(done + ScriptedBench.measured) == sorted(second.records)
    run = json.loads((second.folder.path / "run.json").read_text())
    assert len(run["sessions"]) == 2 and (second.folder.path / "command-1.txt").is_file()
    results = json.loads((second.folder.path / "results.json").read_text())
    assert len(results["points"]) == 16 and results["status"] == "done"
    conn = index.connect(tmp_path / "runs" / index.INDEX_NAME)
    assert len(index.points(conn, [first.folder.run_id])) == 16
    assert index.runs(conn)[0]["status"] == "done"
    conn.close()


def test_an_interrupted_run_is_left_complete_and_resumes(scripted: Path,
                                                         tmp_path: Path) -> None:
    ScriptedBench.interrupt_at = (2, 1)  # Ctrl-C in the 7th point of the first variant
    with pytest.raises(KeyboardInterrupt):
        _run(scripted, tmp_path / "runs")
    (folder,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert check_manifest(folder) == []
    assert json.loads((folder / "run.json").read_text())["status"] == "stopped"
    assert (folder / "devices" / "v0-after.json").is_file()  # the testbed was stopped
    with (folder / "results.jsonl").open("a") as log:
        log.write('{"point": 3, "repe')  # and a line torn by the crash
    ScriptedBench.interrupt_at, first = None, list(ScriptedBench.measured)
    assert len(first) == 6
    ScriptedBench.measured = []
    out = _run(scripted, tmp_path / "runs", resume=folder.name)
    assert (out.status, out.skipped, out.ran) == ("done", 6, 10)
    assert (2, 1) in ScriptedBench.measured and not set(first) & set(ScriptedBench.measured)
    assert len(out.folder.results()) == 16  # the torn line cost no later record


def test_resume_skips_failed_points_unless_asked(scripted: Path, tmp_path: Path) -> None:
    ScriptedBench.failing = {(0, 1)}
    first = _run(scripted, tmp_path / "runs")
    ScriptedBench.failing, ScriptedBench.measured = set(), []
    again = _run(scripted, tmp_path / "runs", resume=first.folder.run_id)
    assert again.ran == 0 and ScriptedBench.measured == []
    retried = _run(scripted, tmp_path / "runs", resume=first.folder.run_id, retry_failed=True)
    assert ScriptedBench.measured == [(0, 1)] and retried.records[(0, 1)]["status"] == "ok"


def test_resume_refuses_another_file(scripted: Path, tmp_path: Path) -> None:
    first = _run(scripted, tmp_path / "runs", stop_after=1)
    scripted.write_text(FILE.replace("repeats = 2", "repeats = 3"), encoding="utf-8")
    with pytest.raises(ConfigError, match=f"--resume {first.folder.run_id}: .* is not the file "
                                          "that run started with"):
        _run(scripted, tmp_path / "runs", resume="latest")


def test_a_testbed_that_does_not_start_fails_its_points_only(scripted: Path,
                                                             tmp_path: Path) -> None:
    ScriptedBench.refuse_start = {"v0"}
    out = _run(scripted, tmp_path / "runs")
    failed = [r for r in out.records.values() if r["status"] == "failed"]
    assert len(failed) == 8 and {r["variant"] for r in failed} == {"v0"}
    assert failed[0]["error"].startswith("testbed v0 did not start: LostData")
    assert out.status == "done" and out.failed == 8


def test_export_csv_and_plot_name_their_runs(scripted: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(scripted, tmp_path / "runs")
    runs = str(tmp_path / "runs")
    csv_path = tmp_path / "points.csv"
    assert main(["experiment", "export", "--runs", runs, "--out", str(csv_path)]) == 0
    with csv_path.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16 and rows[0]["run_id"] == out.folder.run_id
    assert {"collective", "size_bytes", "laser_tune_ms", "time_ms"} <= set(rows[0])
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    assert main(["experiment", "export", "--runs", runs, "--folded", "--out",
                 str(tmp_path / "points.parquet")]) == 0
    folded = pd.read_parquet(tmp_path / "points.parquet")
    assert len(folded) == 8 and set(folded["n"]) == {2}
    assert list(folded["time_ms_max"] - folded["time_ms_min"]) == [1.0] * 8  # repeat 0 vs 1
    assert main(["experiment", "export", "--runs", runs, "--out",
                 str(tmp_path / "p.xlsx")]) == 2
    assert "name the file .csv or .parquet" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    figures = tmp_path / "figs"
    assert main(["experiment", "plot", "--runs", runs, "--out", str(figures)]) == 0
    pngs = sorted(p.name for p in figures.glob("*.png"))
    assert pngs == [f"{out.folder.run_id}-sizes.png",
                    f"{out.folder.run_id}-sweep-laser_tune_ms.png"]
    meta = json.loads((figures / pngs[0].replace(".png", ".json")).read_text())
    assert meta["runs"] == [out.folder.run_id] and out.folder.run_id in meta["caption"]
    from PIL import Image

    with Image.open(figures / pngs[0]) as png:
        assert out.folder.run_id in png.info["Description"]


def test_the_views_read_the_index(scripted: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(scripted, tmp_path / "runs")
    b = _run(scripted, tmp_path / "runs")
    runs = str(tmp_path / "runs")
    capsys.readouterr()
    assert main(["experiment", "list", "--runs", runs]) == 0
    listed = capsys.readouterr().out
    assert a.folder.run_id in listed and b.folder.run_id in listed and "16/16" in listed
    assert main(["experiment", "show", a.folder.run_id, "--runs", runs, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["points"]) == 8 and shown["points"][0]["n"] == 2
    assert main(["experiment", "compare", a.folder.run_id, b.folder.run_id, "--runs", runs,
                 "--json"]) == 0
    pairs = json.loads(capsys.readouterr().out)["points"]
    assert len(pairs) == 8 and all(p["b_over_a"] == 1.0 for p in pairs)
    assert main(["experiment", "show", "nope", "--runs", runs]) == 2
    assert main(["experiment", "list", "--runs", str(tmp_path / "empty")]) == 2
    assert "run an experiment first" in capsys.readouterr().err


def test_mlflow_mirrors_the_run_and_a_second_logging_replaces_it(
        scripted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # no database in a test
    uri = f"file://{tmp_path / 'mlruns'}"
    ScriptedBench.failing = {(2, 1)}
    out = _run(scripted, tmp_path / "runs", mlflow=uri)
    assert main(["experiment", "mlflow", out.folder.run_id, "--runs", str(tmp_path / "runs"),
                 "--tracking-uri", uri]) == 0
    assert out.folder.run_id in capsys.readouterr().out
    client = MlflowClient(tracking_uri=uri)
    eid = client.get_experiment_by_name("scripted").experiment_id
    logged = client.search_runs([eid])
    parents = [r for r in logged if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in logged if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 8  # logged twice, kept once
    (parent,) = parents
    assert parent.data.tags["oddl.run_id"] == out.folder.run_id
    assert parent.data.params["repeats"] == "2"
    assert json.loads(parent.data.params["factor.laser_tune_ms"]) == [0.5, 5.0]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"results.json", "manifest.sha256", "experiment.toml"} <= artifacts
    bad = next(c for c in children if c.data.tags["oddl.point"] == "2")
    assert bad.info.status == "FAILED" and "LostData" in bad.data.tags["oddl.error"]
    history = client.get_metric_history(bad.info.run_id, "time_ms")
    assert [m.step for m in history] == [0]  # repeat 1 failed: only repeat 0 has a value
    assert bad.data.params["size_bytes"] == "4096" and bad.data.params["laser_tune_ms"] == "0.5"


def test_reindex_rebuilds_the_index_from_the_folders(scripted: Path, tmp_path: Path) -> None:
    ScriptedBench.failing = {(3, 0)}
    out = _run(scripted, tmp_path / "runs", stop_after=9)
    runs = tmp_path / "runs"
    conn = index.connect(runs / index.INDEX_NAME)
    before = (index.runs(conn), index.points(conn, [out.folder.run_id]))
    conn.close()
    (runs / index.INDEX_NAME).unlink()
    assert main(["experiment", "reindex", "--runs", str(runs)]) == 0
    conn = index.connect(runs / index.INDEX_NAME)
    after = (index.runs(conn), index.points(conn, [out.folder.run_id]))
    conn.close()
    assert after[1] == before[1] and len(after[1]) == 9
    strip = [{k: v for k, v in r.items() if k != "finished"} for r in before[0]]
    assert [{k: v for k, v in r.items() if k != "finished"} for r in after[0]] == strip
    assert after[0][0]["status"] == "stopped" and after[0][0]["points_failed"] == 1
