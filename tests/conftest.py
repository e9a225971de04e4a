"""Shared test options (`--hardware FILE` runs the driver conformance suite on a lab testbed) and
the lab CAs the security tests share."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from oddl.common.security.files import SecurityFiles
from oddl.common.security.lab_ca import init_lab_ca

LAB_NODES = ("n0", "n1", "n2", "n3")
"""The nodes of the shared lab CAs (`lab`, `other_lab`)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hardware", metavar="TESTBED.toml", default=None,
                     help="run the driver conformance suite against the devices of this lab "
                          "testbed file instead of the emulators (changes laser channels and "
                          "WSS routes on the bench)")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> SecurityFiles:
    return init_lab_ca(tmp_path_factory.mktemp("lab") / "certs", LAB_NODES,
                       operators=("operator", "alice"))


@pytest.fixture(scope="module")
def other_lab(tmp_path_factory: pytest.TempPathFactory) -> SecurityFiles:
    """A second, unrelated lab CA (its certificates must not get in)."""
    return init_lab_ca(tmp_path_factory.mktemp("other") / "certs", LAB_NODES)


@pytest.fixture
def private_runtime(monkeypatch):
    """A private runtime folder for local API sockets (XDG_RUNTIME_DIR), removed after."""
    # short path: sun_path is 108 bytes
    base = Path(f"/tmp/oddl-t-{os.getpid()}")
    base.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    yield base
    for p in sorted(base.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() else p.rmdir()
    base.rmdir()


@pytest.fixture
def folder() -> Iterator[Path]:
    """A private folder with a short path (a Unix socket's sun_path is short)."""
    path = Path(tempfile.mkdtemp(prefix="oddl-bk-", dir="/tmp"))  # short: sun_path
    path.chmod(0o700)
    yield path
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()
