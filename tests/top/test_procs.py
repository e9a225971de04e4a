"""Child processes of the launchers: they stop with their parent, and starting them from a
process that talks gRPC does not crash them (no preexec_fn: grpc/grpc#43055)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG is Linux-only")

PARENT = textwrap.dedent("""
    import os, sys, tempfile
    from pathlib import Path
    import grpc
    from oddl.launch.processes import ProcessGroup, oddl_command
    # a live gRPC channel in the parent, as in every launcher, then a fork+exec
    channel = grpc.insecure_channel("127.0.0.1:1")
    g = ProcessGroup(Path(tempfile.mkdtemp()))
    for i in range(5):
        g.start(f"emu{i}", oddl_command("emulate", "testbed", "--config", sys.argv[1]),
                timeout=120)
    print(" ".join(str(p.proc.pid) for p in g.procs), flush=True)
    os._exit(0)  # no clean-up: the children must notice by themselves
""")


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)  # (they are not our children: no zombie answers kill(pid, 0))
    return False


def test_children_start_from_a_grpc_process_and_die_with_their_parent():
    from helpers import EMULATED

    out = subprocess.run([sys.executable, "-c", PARENT, str(EMULATED)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 5
    survivors = [p for p in pids if not _gone(p, 60)]
    for p in survivors:
        os.kill(p, 9)
    assert not survivors, f"children {survivors} outlived their parent"
