"""The rig's measurements (`lab.measure`, `python benchmarks/bench_lab.py`): the pure parts
everywhere, and the gloo baseline's worker under torchrun on loopback (the rig itself needs
root and runs in `test_lab_rehearsal`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab import jobs, measure

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from report_reliability import row_label  # noqa: E402


def _call(rank: int, step: int, start: float, end: float, **more: object) -> dict[str, object]:
    return {"rank": rank, "step": step, "start": start, "end": end, "ok": True, **more}


def test_a_collective_lasts_from_the_last_call_to_the_last_result() -> None:
    calls = jobs.Calls([_call(0, 0, 1.0, 2.0), _call(1, 0, 1.5, 2.5),
                        _call(0, 1, 3.0, 3.2), _call(1, 1, 3.1, 3.4),
                        {"rank": 1, "step": 1, "start": 9.0, "error": "x", "end": 9.5}])
    assert measure.collective_times(calls) == pytest.approx([1.0, 0.3])


def test_each_row_is_set_beside_gloos_of_its_size() -> None:
    rows = [{"collective": "gloo", "size_mb": 16, "rest_s": 0.2, "first_over_rest_s": 0.01},
            {"collective": "ring", "size_mb": 16, "rest_s": 0.25, "first_over_rest_s": 0.3},
            {"collective": "ring", "size_mb": 64, "rest_s": 0.9, "first_over_rest_s": 0.1}]
    measure.against_gloo(rows)
    assert rows[1]["ratio_gloo"] == pytest.approx(1.25)
    assert rows[1]["gloo_first_over_rest_s"] == 0.01
    assert "ratio_gloo" not in rows[0] and "ratio_gloo" not in rows[2]


def test_a_row_says_the_rank_path_only_when_every_call_ran_on_it() -> None:
    both = jobs.Calls([_call(0, 0, 0, 1, rank_path=True), _call(1, 0, 0, 1, rank_path=True)])
    one = jobs.Calls([_call(0, 0, 0, 1, rank_path=True), _call(1, 0, 0, 1, rank_path=False)])
    assert measure._rank_path(both) == {"rank_path": True}
    assert measure._rank_path(one) == {"rank_path": False}
    assert measure._rank_path(jobs.Calls([_call(0, 0, 0, 1)])) == {}
    assert row_label({"collective": "ring", "rank_path": True}) == "ring (rank path)"
    assert row_label({"collective": "ring", "rank_path": False}) == "ring (agent path)"
    assert row_label({"collective": "gloo"}) == "gloo"


def test_the_gloo_baseline_worker_sums_exactly_under_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this python")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path),
         "--redirects", "1", str(ROOT / "lab" / "workers" / "torch_allreduce.py"),
         "--backend", "gloo", "--count", "3", "--elements", "1001"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for out in tmp_path.rglob("stdout.log")  # each rank's, apart
             for line in out.read_text(encoding="utf-8").splitlines()]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert sorted((r["rank"], r["step"]) for r in records) == [(r, s) for r in (0, 1)
                                                               for s in range(3)]
    assert all(r["ok"] and r["end"] >= r["start"] for r in records)
