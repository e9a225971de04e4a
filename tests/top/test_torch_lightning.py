"""PyTorch Lightning trains on the `oddl` backend as it does on gloo (issue 33; extra
`oddl[lightning]`, which `make test` installs).

examples/lightning_ddp.py runs under torchrun with two ranks on a job of two nodes of the
emulated testbed: `DDPStrategy(process_group_backend="oddl")`, losses logged with
`sync_dist=True`, validation, a checkpoint callback and early stopping, two short epochs. The
same script then runs on gloo from the same seed. With two ranks every sum the collectives
make is of two operands, which IEEE addition gives the same whichever order the ring or gloo
adds them in; so the final parameters must be equal bit for bit, not merely close.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import EMULATED, ROOT

pytest.importorskip("torch")
pytest.importorskip("pytorch_lightning")

EXAMPLE = ROOT / "examples" / "lightning_ddp.py"
RANKS = 2


def torchrun(out: Path, backend: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """The example under torchrun (RANKS processes on this host); each rank's JSON line."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={RANKS}", str(EXAMPLE), "--out", str(out / backend),
         "--backend", backend, "--epochs", "2"],
        cwd=ROOT, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, capture_output=True,
        text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    # each rank's file: on the shared stdout two ranks' long lines can interleave
    lines = [json.loads((out / backend / f"result-rank{r}.json").read_text())
             for r in range(RANKS)]
    assert [r["rank"] for r in lines] == list(range(RANKS)), proc.stdout[-2000:]
    return lines


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_lightning_ddp_trains_on_oddl_to_gloos_parameters(tmp_path: Path) -> None:
    from oddl.launch.testbed import RunningTestbed

    (tmp_path / "testbed").mkdir()
    with RunningTestbed(tmp_path / "testbed", EMULATED) as tb:
        nodes = tb.launched.node_ids[:RANKS]
        job = tb.operator.submit("lightning", nodes, "ring", "optical")
        env = {"ODDL_LOCAL_API": ",".join(tb.launched.apis[:RANKS]), "ODDL_JOB": job["id"]}
        env.update({k: "" for k in ("ODDL_TORCH_FALLBACK", "ODDL_TORCH_SUBGROUPS")})
        oddl = torchrun(tmp_path, "oddl", env)
        tb.operator.cancel(job["id"])
    gloo = torchrun(tmp_path, "gloo", {})
    for r in oddl:
        # it trained: two epochs, the synced validation loss fell from the sanity check's
        assert r["epochs"] == 2 and r["global_step"] == 2 * 256 // (16 * RANKS)
        assert r["val_losses"][-1] < r["val_losses"][0], r["val_losses"]
        assert Path(r["best_checkpoint"]).is_file()
        # every collective went over the optics, none to a fallback
        total = r["counters"]["total"]
        assert total["optical_bytes"] > 0 and total["fallback_calls"] == 0, total
        assert "all_reduce(SUM)" in r["counters"]["kinds"]  # DDP's gradient buckets
    assert len({r["digest"] for r in oddl}) == 1  # the replicas agree
    assert oddl[0]["params"] == gloo[0]["params"]  # bit for bit (module docstring)
    assert oddl[0]["val_losses"] == gloo[0]["val_losses"]
    assert gloo[0]["counters"]["total"]["calls"] == 0  # gloo's run used no oddl call
