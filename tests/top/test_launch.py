"""The launcher's pieces without processes: the three lab commands, config copies with edits,
a training rank's environment and what a started testbed reports."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from helpers import EMULATED

from oddl.common.config import load_testbed
from oddl.common.errors import ConfigError
from oddl.launch.processes import free_port
from oddl.launch.testbed import (
    Launched,
    agent_command,
    controller_command,
    emulators_command,
    torchrun_env,
    write_config,
)


def test_the_commands_are_the_ones_a_lab_runs(tmp_path: Path) -> None:
    resolved = tmp_path / "r.toml"
    assert emulators_command(EMULATED, resolved) == [
        sys.executable, "-m", "oddl", "emulate", "testbed", "--config", str(EMULATED),
        "--resolved", str(resolved)]
    assert emulators_command(EMULATED, resolved, reuse=resolved)[-2:] == ["--reuse",
                                                                          str(resolved)]
    assert controller_command(resolved)[3:] == ["controller", "serve", "--config",
                                                str(resolved), "--listen", "127.0.0.1:0"]
    assert controller_command(resolved, "127.0.0.1:5", tmp_path / "s")[-4:] == [
        "--listen", "127.0.0.1:5", "--state", str(tmp_path / "s")]
    assert agent_command(resolved, "n2", "127.0.0.1:5")[3:] == [
        "agent", "serve", "--config", str(resolved), "--node", "n2", "--controller",
        "127.0.0.1:5"]
    assert agent_command(resolved, "n2", "127.0.0.1:5", verbose=True)[3] == "-v"


def test_write_config_edits_a_copy_and_names_what_it_cannot_find(tmp_path: Path) -> None:
    out = write_config(EMULATED, tmp_path / "t.toml", {"heartbeat_s = 1.0": "heartbeat_s = 0.3"},
                       extra="\n# appended\n")
    text = out.read_text()
    assert "heartbeat_s = 0.3" in text and text.endswith("# appended\n")
    assert load_testbed(out).name == load_testbed(EMULATED).name
    with pytest.raises(ConfigError, match="no 'no such line' to replace"):
        write_config(EMULATED, tmp_path / "u.toml", {"no such line": "x"})


def test_a_rank_gets_torchruns_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ODDL_TORCH_FALLBACK", "gloo")
    env = torchrun_env(2, 4, 1234, ["ipc://a", "ipc://b"])
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT", "ODDL_LOCAL_API")} == {
        "RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234", "ODDL_LOCAL_API": "ipc://a,ipc://b"}
    assert "ODDL_TORCH_FALLBACK" not in env


def test_launched_lists_the_agents_in_node_order(tmp_path: Path) -> None:
    cfg = load_testbed(EMULATED)
    ids = [n.id for n in cfg.nodes]
    agents = {n: {"local_api": f"ipc://{n}", "metrics": f"m-{n}"} for n in reversed(ids)}
    launched = Launched(tmp_path / "r.toml", cfg, "127.0.0.1:9", agents, {"fabric": "tcp://f"},
                        {"address": "127.0.0.1:9", "metrics": "m-ctl"})
    assert launched.node_ids == ids
    assert launched.apis == [f"ipc://{n}" for n in ids]
    assert launched.fabric == "tcp://f"
    assert launched.metrics == {"controller": "m-ctl", **{n: f"m-{n}" for n in ids}}


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
