"""The committed generated gRPC code matches protos/oddl.proto (`make protos` regenerates)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PROTOS = Path(__file__).resolve().parents[2] / "protos"


def _check(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(folder / "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=120)


def test_committed_code_is_fresh():
    result = _check(PROTOS)
    assert result.returncode == 0, result.stderr


def test_stale_code_is_detected(tmp_path):
    copy = tmp_path / "protos"
    shutil.copytree(PROTOS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    proto = copy / "oddl.proto"
    proto.write_text(proto.read_text().replace("message GetStatusRequest {}",
                                               "message GetStatusRequest { bool verbose = 1; }"))
    result = _check(copy)
    assert result.returncode == 1
    assert "run `make protos`" in result.stderr
