"""Keys the service user can read, and nobody else: the ownership plan of `oddl certs init
--owner` / `rotate --owner` / `certs chown`, and the error a service gives on a key it cannot
read. The tests that change owners run as root with throwaway users (skipped otherwise)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from as_user import run_as

from oddl.cli import certs as certs_cli
from oddl.cli.exit_codes import EXIT_FAILED, EXIT_OK
from oddl.common.errors import SecurityError
from oddl.common.security.files import SecurityFiles
from oddl.common.security.lab_ca import init_lab_ca
from oddl.common.security.ownership import (
    may_enter,
    parse_owner,
    resolve_owner,
    service_keys,
    unreadable_key_message,
)

AS_ROOT = os.geteuid() == 0 and shutil.which("useradd") is not None
needs_root = pytest.mark.skipif(not AS_ROOT, reason="changing owners needs root and useradd "
                                "(CI runs as root)")


# ---------------------------------------------------------------- the plan (no root needed)


def test_the_plan_hands_over_service_keys_only(lab: SecurityFiles) -> None:
    keys = service_keys(lab.manifest)
    assert "tls/server.key" in keys and "curve/fabric.key_secret" in keys
    for n in ("n0", "n1", "n2", "n3"):
        assert f"tls/agent-{n}.key" in keys and f"curve/{n}.key_secret" in keys
    assert not any("ca.key" in k or "operator" in k for k in keys)
    assert all(k.endswith((".key", ".key_secret")) and "/" in k for k in keys)
    assert sorted(service_keys(lab.manifest, nodes=["n2"], server=False,
                               curve_servers=False)) == ["curve/n2.key_secret",
                                                         "tls/agent-n2.key"]


def test_owner_spec_and_unknown_users_are_refused() -> None:
    assert parse_owner("oddl") == ("oddl", "")
    assert parse_owner("oddl:dialout") == ("oddl", "dialout")
    with pytest.raises(SecurityError, match="USER:GROUP"):
        parse_owner(":oddl")
    missing = f"nosuch{uuid.uuid4().hex[:8]}"
    with pytest.raises(SecurityError, match=f"no user '{missing}'.*useradd --system"):
        resolve_owner(missing)
    with pytest.raises(SecurityError, match=f"no group '{missing}'.*groupadd"):
        resolve_owner(f"root:{missing}")
    assert resolve_owner("root").uid == 0 and resolve_owner("root").group


def test_cli_refuses_an_unknown_owner_before_writing(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    argv = ["certs", "init", "--out", str(out), "--nodes", "n0", "--owner", "nosuch-oddl-user"]
    assert certs_cli.main(argv) == EXIT_FAILED
    assert "no user 'nosuch-oddl-user'" in capsys.readouterr().err
    assert not out.exists()


def test_who_may_enter_a_folder() -> None:
    # (mode, folder uid, folder gid, user uid, user groups) -> may search it
    assert may_enter(0o700, 0, 0, 998, [998]) is False
    assert may_enter(0o755, 0, 0, 998, [998]) is True
    assert may_enter(0o750, 0, 998, 998, [998]) is True
    assert may_enter(0o750, 0, 5, 998, [998]) is False
    assert may_enter(0o700, 998, 5, 998, [998]) is True
    assert may_enter(0o000, 5, 5, 0, [0]) is True          # root enters everything


def test_the_unreadable_key_message_names_owner_mode_user_and_fix(tmp_path: Path) -> None:
    key = tmp_path / "agent-n2.key"
    key.write_bytes(b"x")
    key.chmod(0o600)
    text = unreadable_key_message(key, "Permission denied")
    me = os.geteuid()
    assert str(key) in text and "mode 0600" in text and "owned by " in text
    assert f"(uid {me})" in text and "Permission denied" in text
    assert "chown " in text and "--owner" in text and "docs/explanation/security.md" in text


def test_as_root_without_owner_init_says_what_to_do(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["certs", "init", "--out", str(tmp_path / "certs"), "--nodes", "n0"]
    assert certs_cli.main(argv) == EXIT_OK
    err = capsys.readouterr().err
    if os.geteuid() == 0:
        assert "User=oddl" in err and "oddl certs chown" in err and "--owner oddl" in err
    else:
        assert "User=oddl" not in err


# ---------------------------------------------------------------- as root, real users


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[str, str]]:
    """Two throwaway system users: the service user and somebody else."""
    if not AS_ROOT:
        pytest.skip("changing owners needs root and useradd (CI runs as root)")
    names = (f"oddlsvc{uuid.uuid4().hex[:6]}", f"oddloth{uuid.uuid4().hex[:6]}")
    made = []
    try:
        for name in names:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                            "/usr/sbin/nologin", name], check=True, capture_output=True)
            made.append(name)
        yield names
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder every user may enter (pytest's tmp_path is 0700, root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="oddl-keys-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _read_as_service(root: str) -> tuple[int, str]:
    """What a service reads at start, then two keys it must not read: (code, text)."""
    files = SecurityFiles.load(root)
    try:
        files.agent_tls("n0").read()
        files.curve_keys("n0")
        files.server_tls().read()
        files.curve_keys("fabric")
    except SecurityError as exc:
        return 3, str(exc)
    for name in ("tls/ca.key", "tls/operator-operator.key"):
        try:
            (files.root / name).read_bytes()
        except PermissionError:
            continue
        return 4, f"read {name}"
    return 0, "ok"


def _as_user(user: str, root: str) -> tuple[int, str]:
    """Run :func:`_read_as_service` as `user`, as for a service started with User=."""
    return run_as(user, lambda: _read_as_service(root))


@needs_root
def test_the_service_user_reads_its_keys_and_nobody_else_does(
        users: tuple[str, str], open_folder: Path) -> None:
    service, other = users
    out = open_folder / "etc-oddl" / "certs"
    files = init_lab_ca(out, ("n0", "n1"), owner=resolve_owner(service))
    for rel in service_keys(files.manifest):
        st = (out / rel).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (resolve_owner(service).uid, 0o600)
    assert (out / "tls/ca.key").stat().st_uid == 0
    assert _as_user(service, str(out)) == (0, "ok")
    code, text = _as_user(other, str(out))
    assert code == 3, text
    assert "tls/agent-n0.key: cannot read (Permission denied)" in text
    assert f"owned by {service}:" in text and "mode 0600" in text
    assert f"runs as {other} (uid" in text and "--owner" in text


@needs_root
def test_chown_on_a_host_and_rotate_keep_the_keys_the_services(
        users: tuple[str, str], open_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    service, _ = users
    out = open_folder / "certs"
    assert certs_cli.main(["certs", "init", "--out", str(out), "--nodes", "n0,n1"]) == 0
    capsys.readouterr()
    code, text = _as_user(service, str(out))
    assert code == 3 and "owned by root:" in text and "oddl certs chown" in text
    # a host holds a subset: its own keys; `certs chown` hands over what is there
    (out / "tls/server.key").unlink()
    assert certs_cli.main(["certs", "chown", "--certs", str(out), "--owner", service]) == 0
    listed = capsys.readouterr().out
    assert "agent-n0.key" in listed and "server.key" not in listed and "ca.key" not in listed
    assert (out / "tls/ca.key").stat().st_uid == 0
    assert certs_cli.main(["certs", "rotate", "--certs", str(out), "--node", "n1", "--owner",
                           service]) == 0
    uid = resolve_owner(service).uid
    assert (out / "tls/agent-n1.key").stat().st_uid == uid
    assert stat.S_IMODE((out / "curve/n1.key_secret").stat().st_mode) == 0o600
    (out / "tls/server.key").write_bytes(b"")  # _as_user reads it; not the point here
    code, text = _as_user(service, str(out))
    assert code == 3 and "server.key" in text  # every agent key read; the stub is refused


@needs_root
def test_a_folder_the_service_user_cannot_enter_is_named(
        users: tuple[str, str], open_folder: Path) -> None:
    service, _ = users
    closed = open_folder / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(SecurityError, match=f"{closed}: user {service} may not enter it"):
        init_lab_ca(closed / "certs", ("n0",), owner=resolve_owner(service))
    init_lab_ca(closed / "certs", ("n0",))
    code, text = _as_user(service, str(closed / "certs"))
    assert code == 5 and f"the folder {closed}" in text and "chmod 755" in text, text
