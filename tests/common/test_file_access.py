"""Who may open a device port or the agent's socket: the owner, group and mode of the file,
the service user's groups, and the command that opens the way (issue 34: the probe passed as
root while the service, as user oddl, could not open the port)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import serial

from oddl.agents.client.connection import AgentSocket
from oddl.common import file_access
from oddl.common.config import DeviceConfig
from oddl.common.errors import CollectiveError
from oddl.common.file_access import (
    access_of,
    can_open,
    is_permission_error,
    permission_advice,
    socket_advice,
)
from oddl.drivers import transport
from oddl.operator.probe import check_service_access
from oddl.operator.probe_verdicts import OK, SERVICE_CANNOT_OPEN, DeviceProbe, ProbeReport

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="changes a file's owner and runs as nobody")


def _port(tmp_path: Path, mode: int, group: str | None = None) -> Path:
    path = tmp_path / "ttyUSB0"
    path.write_bytes(b"")
    if group is not None:
        os.chown(path, 0, __import__("grp").getgrnam(group).gr_gid)
    path.chmod(mode)
    return path


@needs_root
def test_a_user_outside_the_ports_group_is_told_to_join_it(tmp_path: Path) -> None:
    port = _port(tmp_path, 0o660, "dialout")
    access = access_of(str(port))
    assert access is not None and (access.owner, access.group, access.mode) == \
        ("root", "dialout", 0o660)
    assert can_open(access, "nobody") is False and can_open(access, "root") is True
    advice = permission_advice(str(port), "nobody")
    assert "not in group dialout" in advice and "sudo usermod -aG dialout nobody" in advice
    assert "root:dialout, mode 0660" in advice
    assert permission_advice(str(port), "root") == ""


def test_a_port_only_its_owner_opens_needs_a_udev_rule(tmp_path: Path) -> None:
    port = _port(tmp_path, 0o600)
    advice = permission_advice(str(port), "nobody")
    assert "may not read and write" in advice and "udev rule" in advice
    assert permission_advice(str(tmp_path / "absent"), "nobody") == ""
    assert permission_advice(str(port), "no-such-user-here") == ""


def test_permission_errors_are_told_apart_from_missing_ports() -> None:
    assert is_permission_error(PermissionError(13, "Permission denied"))
    assert is_permission_error(serial.SerialException(
        13, "could not open port /dev/ttyUSB0: [Errno 13] Permission denied: '/dev/ttyUSB0'"))
    assert not is_permission_error(FileNotFoundError(2, "No such file or directory"))


def test_a_service_that_cannot_open_its_port_says_why_and_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _port(tmp_path, 0o600)
    monkeypatch.setattr(transport, "current_user", lambda: "nobody")
    text = transport.open_failure(str(port), PermissionError(13, "Permission denied"))
    assert "permission denied" in text and "user nobody may not read and write" in text
    assert "is running" not in text  # not the wrong cause
    missing = transport.open_failure("/dev/ttyNOPE", FileNotFoundError(2, "No such file"))
    assert "check the resource in the testbed file" in missing


def test_the_probe_fails_a_port_the_service_user_cannot_open(tmp_path: Path) -> None:
    port = _port(tmp_path, 0o600)
    dev = DeviceConfig(id="laser0", kind="itla", resource=str(port))
    answered = DeviceProbe("laser0", "itla", str(port), OK, "identified")
    result = check_service_access(answered, dev, "nobody")
    assert result.status == SERVICE_CANNOT_OPEN and not ProbeReport(devices=[result]).ok
    assert "the controller's service will not open it: user nobody" in result.message
    fine = check_service_access(DeviceProbe("laser0", "itla", str(port), OK, "identified"),
                                dev, "")
    assert fine.status == OK


def test_a_training_user_outside_the_agents_group_is_told_to_join_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o750)
    owner = access_of(str(run))
    assert owner is not None
    advice = socket_advice(str(run / "agent-n0.sock"), "nobody")
    assert f"user nobody may not enter {run}" in advice
    assert f"sudo usermod -aG {owner.group} nobody" in advice
    run.chmod(0o755)
    assert socket_advice(str(run / "agent-n0.sock"), "nobody") == ""


def test_the_client_names_the_socket_folder_it_may_not_enter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o750)
    monkeypatch.setattr(file_access, "current_user", lambda: "nobody")
    sock = AgentSocket(f"ipc://{run}/agent-n0.sock", 0.3)
    try:
        with pytest.raises(CollectiveError, match="cannot reach the agent at .*user nobody may "
                           "not enter"):
            sock.ensure_connected()
    finally:
        sock.close()


@needs_root
def test_the_group_a_unit_gives_the_service_counts(tmp_path: Path) -> None:
    port = _port(tmp_path, 0o660, "dialout")
    assert permission_advice(str(port), "nobody", also_groups=frozenset({"dialout"})) == ""
    advice = permission_advice(str(port), "nobody", also_groups=frozenset({"tty"}))
    assert "user nobody (with group tty, as its unit runs it) may not" in advice
    assert "sudo usermod -aG dialout nobody" in advice


def test_the_probes_service_user_and_group_are_the_units() -> None:
    from oddl.cli.probe import SERVICE_GROUP, SERVICE_USER

    unit = (Path(__file__).resolve().parents[2] / "deploy" / "systemd"
            / "oddl-controller.service").read_text(encoding="utf-8").splitlines()
    assert f"User={SERVICE_USER}" in unit and f"Group={SERVICE_GROUP}" in unit
