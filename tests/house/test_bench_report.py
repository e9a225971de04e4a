"""benchmarks/report.py: the generated part of docs/results.md, from benchmarks/results/."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _load_script(name: str) -> ModuleType:
    """benchmarks/<name>.py as a script runs it: its folder first on the path (only while it
    loads, so that no other test imports from benchmarks/ by accident)."""
    folder = str(ROOT / "benchmarks")
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                      ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(folder)


report = _load_script("report")
run_all = _load_script("run_all")


def test_every_row_of_the_last_bench_names_its_command() -> None:
    data = json.loads((RESULTS / "latest.json").read_text(encoding="utf-8"))
    rows = report.rows(data["results"])
    assert len(rows) >= 20
    for what, result, _baseline, command in rows:
        assert what and result
        assert command.startswith("`") and command.endswith("`")


def test_each_run_carries_its_date_or_its_command() -> None:
    text = report.render()
    assert text.startswith(report.BEGIN) and text.endswith(report.END)
    assert "Run 2026-11-25T03:57:37+0000 on 2 CPUs" in text
    lab_run = json.loads((RESULTS / "lab.json").read_text(encoding="utf-8"))["time"]
    assert f"Run {lab_run}: `make lab`" in text
    assert "Command: `python benchmarks/soak.py --minutes 10" in text
    assert "| agent SIGKILL, restarted 1 s later (`agent-kill`) | 6 |" in text


def test_a_missing_result_file_leaves_its_section_out(tmp_path: Path) -> None:
    shutil.copy(RESULTS / "latest.json", tmp_path / "latest.json")
    text = report.render(tmp_path)
    assert "make bench" in text and "lab rehearsal" not in text and "Soak" not in text


def test_write_replaces_only_the_generated_block() -> None:
    document = f"# kept\n\nbefore\n{report.BEGIN}\nold\n{report.END}\nafter: by hand\n"
    new = report.replace_generated(document, f"{report.BEGIN}\nnew\n{report.END}")
    assert new == f"# kept\n\nbefore\n{report.BEGIN}\nnew\n{report.END}\nafter: by hand\n"


def test_a_document_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="BEGIN"):
        report.replace_generated("# no block\n", "x")


def test_docs_results_holds_what_the_json_says() -> None:
    """docs/results.md's generated part is what report.py makes of benchmarks/results/ now:
    a new result file without `python benchmarks/report.py --write` fails here."""
    document = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert report.replace_generated(document, report.render()) == document


def test_a_row_run_on_its_own_names_its_time_and_the_rest_keep_the_runs() -> None:
    results = {"small-calls": {"ok": True, "ran": "2026-11-29T12:23:28+0000", "result": {
        "nodes": 4, "calls": 300, "load_before": 4.5, "load": 2.1, "sizes": {"1": {
            "in_rank": {"wall_ms": 2.0, "cpu_ms": 1.0, "vcsw": 18.0},
            "gloo": {"wall_ms": 1.0, "cpu_ms": 1.0, "vcsw": 32.0}}}}}}
    (row,) = report.rows(results, "2026-11-25T03:57:37+0000")
    assert row[2].endswith("; run 2026-11-29T12:23:28+0000")
    (same,) = report.rows(results, "2026-11-29T12:23:28+0000")
    assert "run 2026" not in same[2]
    results["small-calls"].pop("ran")  # a result from before results carried their time
    (old,) = report.rows(results, "2026-11-25T03:57:37+0000")
    assert "run 2026" not in old[2]


def test_a_partial_run_keeps_the_full_runs_date_and_stamps_its_own_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = {"time": "2026-11-25T03:57:37+0000", "cpus": 2, "results": {
        "kept": {"ok": True, "seconds": 1.0, "command": "kept.py", "result": {}}}}
    (tmp_path / "latest.json").write_text(json.dumps(full), encoding="utf-8")
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    monkeypatch.setitem(run_all.BENCHMARKS, "echo",
                        (["-c", "print('{\"x\": 1}')"], [], []))
    assert run_all.main(["--only", "echo"]) == 0
    after = json.loads((tmp_path / "latest.json").read_text(encoding="utf-8"))
    assert after["time"] == full["time"]
    assert after["results"]["kept"] == full["results"]["kept"]
    echo = after["results"]["echo"]
    assert echo["result"] == {"x": 1} and echo["ran"] > full["time"]
