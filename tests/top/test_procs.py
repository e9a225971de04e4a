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


CHILD = textwrap.dedent("""
    # a child of a ProcessGroup, in folder argv[1], named argv[2], with peers argv[3:]
    import json, os, signal, sys, time
    from pathlib import Path
    from oddl.launch.processes import request_parent_death_signal
    request_parent_death_signal()  # a failed test leaves none behind
    folder, me, peers = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]

    def wait_for(names, what):
        while not all((folder / f"{what}-{n}").exists() for n in names):
            time.sleep(0.02)

    def on_term(*_):
        (folder / f"term-{me}").touch()
        wait_for(peers, "term")  # each waits for its peers' SIGTERM: none comes one by one
        (folder / f"exited-{me}").touch()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    (folder / f"started-{me}").touch()
    wait_for(peers, "started")  # ready only once its peers run: none starts one by one
    print(json.dumps({"ready": True, "name": me}), flush=True)
    while True:
        time.sleep(1)
""")

FIRST = textwrap.dedent("""
    # started alone before the peers argv[3:]: on SIGTERM, exit 0 only if they all exited
    import json, os, signal, sys, time
    from pathlib import Path
    from oddl.launch.processes import request_parent_death_signal
    request_parent_death_signal()
    folder, peers = Path(sys.argv[1]), sys.argv[3:]
    signal.signal(signal.SIGTERM, lambda *_: os._exit(
        0 if all((folder / f"exited-{n}").exists() for n in peers) else 3))
    print(json.dumps({"ready": True}), flush=True)
    while True:
        time.sleep(1)
""")


def test_peers_started_together_start_and_stop_at_once_after_those_before(tmp_path):
    """Children that each wait for the others to start before they are ready, and for the
    others' SIGTERM before they exit, come up and go down together, within the group's
    grace: neither would one by one. The child started before them is stopped after them."""
    from oddl.launch.processes import Child, ProcessGroup

    names = ["a", "b", "c"]
    with ProcessGroup(tmp_path, grace=60.0) as group:
        group.start("first", [sys.executable, "-c", FIRST, str(tmp_path), "first", *names])
        ready = group.start_together(
            [Child(n, [sys.executable, "-c", CHILD, str(tmp_path), n,
                       *(p for p in names if p != n)]) for n in names], timeout=120)
        assert [r["name"] for r in ready] == names
        procs = list(group.procs)
        group.stop_all()
        assert [p.proc.returncode for p in procs] == [0, 0, 0, 0]
        assert not group.procs


def test_a_peer_that_never_gets_ready_fails_the_start_and_is_stopped(tmp_path):
    from oddl.common.errors import OddlError
    from oddl.launch.processes import Child, ProcessGroup

    silent = [sys.executable, "-c", "from oddl.launch.processes import "
              "request_parent_death_signal as r; r(); import time; time.sleep(600)"]
    with ProcessGroup(tmp_path, grace=5.0) as group:
        with pytest.raises(OddlError, match="mute did not become ready within 2 s"):
            group.start_together([Child("mute", silent), Child("mute2", silent)], timeout=2)
        procs = list(group.procs)
        assert [p.name for p in procs] == ["mute", "mute2"]  # both still in the group
        group.stop_all()  # as a caller stops the group: the one not waited for too
        assert all(p.proc.returncode is not None for p in procs)
        assert not group.procs
