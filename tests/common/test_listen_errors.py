"""An address a service cannot listen on is one line naming the node, the address, the testbed
file and key (or the option) and the fix, exit code 2, no traceback: a node address this host
does not have (TEST-NET 192.0.2.1) and ports held open by the test."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import run_oddl

from oddl.common.config import dump_testbed, load_testbed
from oddl.common.errors import ConfigError
from oddl.common.listen_errors import ListenOrigin, bind_errno, listen_error, split_address
from oddl.launch.testbed import DEFAULT_TESTBED

ABSENT = "192.0.2.1"  # TEST-NET-1 (RFC 5737): no host of a test machine has it


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port a listening socket of this test holds."""
    with socket.create_server(("127.0.0.1", 0)) as held:
        yield held.getsockname()[1]


def _direct_testbed(path: Path, node: str, host: str, data_port: int,
                    listen: str = "127.0.0.1:0") -> Path:
    cfg = load_testbed(DEFAULT_TESTBED)
    nodes = tuple(replace(n, host=host, data_port=data_port) if n.id == node else n
                  for n in cfg.nodes)
    cfg = replace(cfg, nodes=nodes, fabric=replace(cfg.fabric, link="direct"),
                  controller=replace(cfg.controller, listen=listen))
    path.write_text(dump_testbed(cfg))
    return path


def _one_line_error(proc: object) -> str:
    assert proc.returncode == 2, proc.stderr  # type: ignore[attr-defined]
    err: str = proc.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in err and "OSError" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- the message (pure)


def test_each_errno_names_the_key_and_the_fix() -> None:
    node = ListenOrigin("agent n2", "[[nodes]] host of node n2 in /etc/oddl/testbed.toml",
                        "[[nodes]] data_port of node n2 in /etc/oddl/testbed.toml",
                        "[[nodes]] host/data_port of node n2 in /etc/oddl/testbed.toml")
    text = str(listen_error(errno.EADDRNOTAVAIL, "Cannot assign requested address",
                            "10.0.0.12:7000", node))
    assert text.startswith("agent n2: cannot listen on 10.0.0.12:7000 ([[nodes]] host/data_port "
                           "of node n2 in /etc/oddl/testbed.toml): ")
    assert "this host has no address 10.0.0.12 (EADDRNOTAVAIL)" in text
    assert "set [[nodes]] host of node n2 in /etc/oddl/testbed.toml to an address" in text
    busy = str(listen_error(errno.EADDRINUSE, "Address in use", "10.0.0.12:7000", node))
    assert "port 7000 on 10.0.0.12 is in use by another process (EADDRINUSE)" in busy
    assert "ss -ltnp 'sport = :7000'" in busy and "another port in [[nodes]] data_port" in busy
    low = str(listen_error(errno.EACCES, "Permission denied", "[::1]:80",
                           ListenOrigin.option("controller", "--metrics")))
    assert "cannot listen on ::1:80 (--metrics)" in low and "from 1024 up in --metrics" in low
    assert split_address("tcp://10.0.0.1:7000") == ("10.0.0.1", 7000)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        split_address("10.0.0.1")


def test_bind_errno_finds_out_why(held_port: int) -> None:
    assert bind_errno(f"127.0.0.1:{held_port}")[0] == errno.EADDRINUSE
    assert bind_errno(f"{ABSENT}:7000")[0] == errno.EADDRNOTAVAIL
    assert bind_errno("127.0.0.1:0") == (None, "")


# ---------------------------------------------------------------- the services


def test_an_agent_on_a_host_without_its_address(tmp_path: Path) -> None:
    config = _direct_testbed(tmp_path / "testbed.toml", "n2", ABSENT, 7002)
    line = _one_line_error(run_oddl("agent", "serve", "--config", str(config), "--node", "n2",
                                    "--controller", "127.0.0.1:1", "--metrics", "",
                                    timeout=120))
    assert f"agent n2: cannot listen on {ABSENT}:7002" in line
    assert f"[[nodes]] host of node n2 in {config}" in line and "EADDRNOTAVAIL" in line
    assert "ip -brief address" in line


def test_an_agent_whose_data_port_is_taken(tmp_path: Path, held_port: int) -> None:
    config = _direct_testbed(tmp_path / "testbed.toml", "n1", "127.0.0.1", held_port)
    line = _one_line_error(run_oddl("agent", "serve", "--config", str(config), "--node", "n1",
                                    "--controller", "127.0.0.1:1", "--metrics", "",
                                    timeout=120))
    assert f"agent n1: cannot listen on 127.0.0.1:{held_port}" in line
    assert f"[[nodes]] data_port of node n1 in {config}" in line and "EADDRINUSE" in line
    line = _one_line_error(run_oddl("agent", "serve", "--config", str(config), "--node", "n1",
                                    "--controller", "127.0.0.1:1", "--metrics",
                                    f"127.0.0.1:{held_port}", "--data-bind", "127.0.0.1:0",
                                    timeout=120))
    assert f"agent n1: cannot listen on 127.0.0.1:{held_port} (--metrics)" in line


def test_a_controller_whose_listen_or_metrics_address_is_wrong(tmp_path: Path,
                                                                 held_port: int) -> None:
    config = _direct_testbed(tmp_path / "testbed.toml", "n0", "127.0.0.1", 0,
                             listen=f"127.0.0.1:{held_port}")
    line = _one_line_error(run_oddl("controller", "serve", "--config", str(config),
                                    "--metrics", "", timeout=120))
    assert f"controller: cannot listen on 127.0.0.1:{held_port} ([controller] listen in " \
           f"{config})" in line and "EADDRINUSE" in line
    line = _one_line_error(run_oddl("controller", "serve", "--config", str(config), "--listen",
                                    f"{ABSENT}:0", "--insecure", "--metrics", "", timeout=120))
    assert f"controller: cannot listen on {ABSENT}:0 (--listen)" in line
    assert "EADDRNOTAVAIL" in line
    line = _one_line_error(run_oddl("controller", "serve", "--config", str(config), "--listen",
                                    "127.0.0.1:0", "--metrics", f"{ABSENT}:9302", timeout=120))
    assert f"controller: cannot listen on {ABSENT}:9302 (--metrics)" in line
