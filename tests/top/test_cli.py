"""The operator's CLI, driven as a user would: subprocesses against a running emulated testbed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import run_oddl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


oddl = run_oddl
"""Run `oddl ARGS` and return the finished process."""


@pytest.fixture(scope="module")
def testbed(tmp_path_factory) -> Iterator[dict]:
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    up = oddl("testbed", "up", "--run-dir", str(run_dir), "--json")
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout.strip().splitlines()[-1])
    state["env"] = {"ODDL_CONTROLLER": state["controller"]}
    yield state
    down = oddl("testbed", "down", "--run-dir", str(run_dir))
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith("stopped 6 processes")
    assert not (run_dir / "state.json").exists()
    for pid in state["pids"].values():
        assert not Path(f"/proc/{pid}").exists() or b"oddl" not in Path(
            f"/proc/{pid}/cmdline").read_bytes()


def test_status_and_topology(testbed):
    env = testbed["env"]
    status = oddl("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    agents = json.loads(status.stdout)["agents"]
    assert [a["node_id"] for a in agents] == ["n0", "n1", "n2", "n3"]
    assert all(a["alive"] for a in agents)
    topo = oddl("topology", env=env)
    assert topo.returncode == 0
    lines = topo.stdout.splitlines()
    assert lines[0] == "testbed emulated-4node: grid 193.1 THz + k x 100.0 GHz, 48 channels"
    assert lines[2].split() == ["node", "host", "transmitter", "rx", "ch", "rx", "THz", "wss",
                                "port"]
    assert lines[3].split() == ["n0", "127.0.0.1", "laser0", "1", "193.1000", "wss0", "1"]
    assert lines[6].split() == ["n3", "127.0.0.1", "laser3", "4", "193.4000", "wss0", "4"]


def test_jobs_schedule_and_cancel(testbed):
    env = testbed["env"]
    submit = oddl("jobs", "submit", "--collective", "ring", "--name", "cli", env=env)
    assert submit.returncode == 0, submit.stderr
    assert submit.stdout.strip() == "submitted job-1 (ring on n0,n1,n2,n3, optical)"
    listed = json.loads(oddl("jobs", "list", "--json", env=env).stdout)
    assert [(j["id"], j["state"]) for j in listed] == [("job-1", "running")]
    show = oddl("schedule", "show", "job-1", "--bytes", "4MB", env=env)
    assert show.returncode == 0, show.stderr
    assert show.stdout.startswith("ring on job job-1: 1,000,000 x 4 B, 6 slots, 0 retunes")
    again = oddl("jobs", "submit", "--collective", "ring", env=env)
    assert again.returncode == 4
    assert "already run job job-1" in again.stderr and "oddl jobs cancel job-1" in again.stderr
    cancel = oddl("jobs", "cancel", "job-1", env=env)
    assert cancel.returncode == 0 and cancel.stdout.strip() == "job-1: cancelled"
    unknown = oddl("jobs", "cancel", "job-9", env=env)
    assert unknown.returncode == 4 and "unknown job 'job-9'" in unknown.stderr


def test_reconfigure_dry_run_confirmation_and_refusal(testbed):
    env = testbed["env"]
    dry = oddl("reconfigure", "--wss", "wss0", "--channel", "6", "--port", "2", "--dry-run",
               env=env)
    assert dry.returncode == 0
    assert dry.stdout.splitlines() == ["dry run:", "wss0: channel 6 → port 2 at 0.0 dB"]
    unconfirmed = oddl("reconfigure", "--wss", "wss0", "--channel", "6", "--port", "2", env=env)
    assert unconfirmed.returncode == 2 and "pass --yes" in unconfirmed.stderr
    applied = oddl("reconfigure", "--wss", "wss0", "--channel", "6", "--port", "2", "--yes",
                   env=env)
    assert applied.returncode == 0
    assert applied.stdout.strip() == "applied and verified: wss0: channel 6 → port 2 at 0.0 dB"
    no_port = oddl("reconfigure", "--wss", "wss0", "--channel", "6", "--yes", env=env)
    assert no_port.returncode == 2 and "needs --port" in no_port.stderr and "99" in no_port.stderr
    refused = oddl("reconfigure", "--transmitter", "laser0", "--channel", "40", "--yes", env=env)
    assert refused.returncode == 4
    assert "laser0: channel 40 is not allowed" in refused.stderr
    log = oddl("devices", "log", "--limit", "5", env=env)
    assert log.returncode == 0 and "transaction operator" in log.stdout
    devices = oddl("devices", env=env)
    assert "6→2" in devices.stdout and "laser0" in devices.stdout


def test_watch_once(testbed):
    view = oddl("watch", "--once", env={**testbed["env"], "COLUMNS": "120"})
    assert view.returncode == 0, view.stderr
    for part in ("agents", "jobs", "circuits (from device read-back)", "power meters",
                 "device log", "laser3"):
        assert part in view.stdout


def test_exit_codes_tell_problems_apart(tmp_path):
    unreachable = oddl("status", "--controller", "127.0.0.1:1", timeout=60)
    assert unreachable.returncode == 3 and "did not answer" in unreachable.stderr
    usage = oddl("jobs", "submit", "--network", "bogus")
    assert usage.returncode == 2
    # run from a folder without a testbed state file
    missing = subprocess.run([sys.executable, "-m", "oddl", "status"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path,
                             env={k: v for k, v in os.environ.items() if k != "ODDL_CONTROLLER"})
    assert missing.returncode == 2 and "no controller address" in missing.stderr
