"""`torch.compile`d models under DDP train on the `oddl` backend as on gloo (issue 33).

tests/workers/torch_compile_worker.py runs under torchrun with two ranks on a job of two nodes
of the emulated testbed: a small model wrapped in DistributedDataParallel and compiled
(`torch.compile(ddp)`: DDP's optimizer splits the graph at the gradient buckets, and each
bucket's all-reduce runs on the backend between compiled pieces). The same worker then runs
on gloo from the same seed. With two ranks every sum the collectives make is of two operands,
which IEEE addition gives the same in either order, so the final parameters must be equal
bit for bit. Inductor (torch.compile's default) needs a C++ compiler; aot_eager (the graph
captured and traced, run without code generation) needs none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import EMULATED, ROOT

pytest.importorskip("torch")

WORKER = ROOT / "tests" / "workers" / "torch_compile_worker.py"
RANKS = 2


def torchrun(out: Path, backend: str, compiler: str, env: dict[str, str]
             ) -> list[dict[str, Any]]:
    """The worker under torchrun (RANKS processes on this host); each rank's result."""
    out.mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={RANKS}", str(WORKER), str(out), backend, compiler],
        cwd=ROOT, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, capture_output=True,
        text=True, timeout=420)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]


@pytest.mark.e2e
@pytest.mark.timeout(900)
@pytest.mark.parametrize("compiler", ["inductor", "aot_eager"])
def test_a_compiled_ddp_model_trains_on_oddl_to_gloos_parameters(
        tmp_path: Path, compiler: str) -> None:
    if compiler == "inductor" and shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("torch.compile's inductor backend needs a C++ compiler (g++, or $CXX) "
                    "to build its CPU kernels, and none is on PATH")
    from oddl.launch.testbed import RunningTestbed

    (tmp_path / "testbed").mkdir()
    with RunningTestbed(tmp_path / "testbed", EMULATED) as tb:
        job = tb.operator.submit("compiled", tb.launched.node_ids[:RANKS], "ring", "optical")
        env = {"ODDL_LOCAL_API": ",".join(tb.launched.apis[:RANKS]), "ODDL_JOB": job["id"],
               **{k: "" for k in ("ODDL_TORCH_FALLBACK", "ODDL_TORCH_SUBGROUPS")}}
        oddl = torchrun(tmp_path / "oddl", "oddl", compiler, env)
        tb.operator.cancel(job["id"])
    gloo = torchrun(tmp_path / "gloo", "gloo", compiler, {})
    for r in oddl:
        total = r["counters"]["total"]  # DDP's buckets went over the optics, none to gloo
        assert total["optical_bytes"] > 0 and total["fallback_calls"] == 0, total
        # DDP's gradient buckets: one in the first step (DDP learns the order), two after
        assert r["counters"]["kinds"]["all_reduce(SUM)"]["calls"] > 4, r["counters"]
    assert len({r["digest"] for r in oddl}) == 1  # the replicas agree
    assert oddl[0]["params"] == gloo[0]["params"]  # bit for bit (module docstring)
    assert [r["losses"] for r in oddl] == [r["losses"] for r in gloo]
    assert gloo[0]["counters"]["total"]["calls"] == 0
