"""torchrun as labs run it (issue 33): `--max-restarts 1` with a rank that crashes mid-run.
The elastic agent stops the survivors and starts every rank again; the new process group
pairs with the same agents, and every all-reduce of the new attempt is exact — no call of the
restarted ranks pairs with a step of the dead attempt. The survivor's agent voids the call its
stopped training process left waiting for the crashed rank, and the new group numbers its calls
after every step the agents saw (decision record 0033)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EMULATED, ROOT

pytest.importorskip("torch")

WORKER = ROOT / "tests" / "workers" / "torch_elastic_worker.py"
RANKS = 2


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_rank_that_crashes_is_restarted_and_the_new_group_pairs_cleanly(
        tmp_path: Path) -> None:
    from oddl.launch.testbed import RunningTestbed

    (tmp_path / "testbed").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    with RunningTestbed(tmp_path / "testbed", EMULATED) as tb:
        job = tb.operator.submit("elastic", tb.launched.node_ids[:RANKS], "ring", "optical")
        env = {**os.environ, "ODDL_LOCAL_API": ",".join(tb.launched.apis[:RANKS]),
               "ODDL_JOB": job["id"], "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={RANKS}", "--max-restarts=1", str(WORKER), str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        tb.operator.cancel(job["id"])
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    _check_attempts(out)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_two_launchers_on_c10d_rendezvous_restart_the_crashed_rank_together(
        tmp_path: Path) -> None:
    """The lab's form: one torchrun launcher a host (`--nnodes 2 --nproc-per-node 1`), meeting
    on torchrun's c10d rendezvous (`--rdzv-backend c10d`), each rank on its own node's agent.
    Which launcher's worker becomes rank 0 is the rendezvous' choice; the backend maps group
    ranks to job ranks either way."""
    from oddl.launch.processes import free_port
    from oddl.launch.testbed import RunningTestbed

    (tmp_path / "testbed").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    with RunningTestbed(tmp_path / "testbed", EMULATED) as tb:
        job = tb.operator.submit("elastic-c10d", tb.launched.node_ids[:RANKS], "ring", "optical")
        endpoint = f"127.0.0.1:{free_port()}"
        launchers = [subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes={RANKS}",
             "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
             "--rdzv-id=elastic-c10d", "--max-restarts=1", str(WORKER), str(out)],
            cwd=ROOT, env={**os.environ, "ODDL_LOCAL_API": api, "ODDL_JOB": job["id"],
                           "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for api in tb.launched.apis[:RANKS]]
        try:
            ends = [p.communicate(timeout=600) for p in launchers]
        finally:
            for p in launchers:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        tb.operator.cancel(job["id"])
    for p, (_stdout, stderr) in zip(launchers, ends, strict=True):
        assert p.returncode == 0, stderr[-4000:]
    _check_attempts(out)


def _check_attempts(out: Path) -> None:
    """Rank 1 died in the first attempt; every all-reduce of the second was exact."""
    first = json.loads((out / "attempt0-rank0.json").read_text())
    assert [c["step"] for c in first["checked"]] in ([1, 2], [1, 2, 3])  # rank 1 died at 3
    assert all(c["exact"] for c in first["checked"])
    for rank in range(RANKS):
        again = json.loads((out / f"attempt1-rank{rank}.json").read_text())
        assert [c["step"] for c in again["checked"]] == list(range(1, 7)), again
        assert all(c["exact"] for c in again["checked"]), again
