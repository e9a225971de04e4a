"""Operator commands find the testbed file without --config: --config, then ODDL_CONFIG, then
/etc/oddl/testbed.toml when it exists (here a file the test points SYSTEM_TESTBED at); the
controller address keeps its order (--controller, ODDL_CONTROLLER, the file, `testbed up`)."""

from __future__ import annotations

import argparse
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from oddl.cli import config_lookup
from oddl.cli.main import build_parser, main
from oddl.cli.operator import controller_address
from oddl.common.config import dump_testbed, load_testbed
from oddl.common.errors import ConfigError
from oddl.launch.testbed import DEFAULT_TESTBED


def _file_with_address(path: Path, address: str) -> Path:
    cfg = load_testbed(DEFAULT_TESTBED)
    path.write_text(dump_testbed(replace(cfg, controller=replace(cfg.controller,
                                                                  address=address))))
    return path


@pytest.fixture
def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where this test's "/etc/oddl/testbed.toml" is (absent until a test writes it)."""
    path = tmp_path / "etc" / "testbed.toml"
    path.parent.mkdir()
    monkeypatch.setattr(config_lookup, "SYSTEM_TESTBED", path)
    monkeypatch.delenv("ODDL_CONFIG", raising=False)
    monkeypatch.delenv("ODDL_CONTROLLER", raising=False)
    return path


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"config": None, "controller": None, **kw})


def test_config_then_env_then_the_system_file(system: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_lookup.testbed_file(_args()) is None                       # nothing anywhere
    _file_with_address(system, "10.0.0.10:50051")
    assert config_lookup.testbed_file(_args()) == str(system)
    env = _file_with_address(tmp_path / "env.toml", "10.0.0.11:50051")
    monkeypatch.setenv("ODDL_CONFIG", str(env))
    assert config_lookup.testbed_file(_args()) == str(env)
    assert config_lookup.testbed_file(_args(config="given.toml")) == "given.toml"
    monkeypatch.setenv("ODDL_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match=r"ODDL_CONFIG=.*missing.toml: no such testbed file"):
        config_lookup.testbed_file(_args())


def test_the_controller_address_keeps_its_order(system: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _file_with_address(system, "10.0.0.10:50051")
    assert controller_address(_args()) == "10.0.0.10:50051"
    monkeypatch.setenv("ODDL_CONTROLLER", "10.0.0.12:50051")
    assert controller_address(_args()) == "10.0.0.12:50051"
    assert controller_address(_args(controller="10.0.0.13:1")) == "10.0.0.13:1"


def test_status_reads_the_system_file_without_config(system: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:              # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    _file_with_address(system, dead)
    assert main(["status"]) == 3
    assert f"the controller at {dead} did not answer" in capsys.readouterr().err
    assert main(["devices", "probe", "--no-scan", "--json"]) == 0   # emulated: all skipped
    assert '"ok": true' in capsys.readouterr().out


def test_help_says_where_the_file_comes_from() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("status", "jobs", "devices", "watch", "reconfigure"):
        text = " ".join(sub.choices[command].format_help().split())
        assert "ODDL_CONFIG, else /etc/oddl/testbed.toml when it exists" in text, command
    devices = next(a for a in sub.choices["devices"]._actions
                   if isinstance(a, argparse._SubParsersAction))
    assert "/etc/oddl/testbed.toml" in " ".join(devices.choices["probe"].format_help().split())
