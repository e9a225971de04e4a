"""An operator's own credentials for their login user, and nothing of the services' (issue 34:
an operator who was not root was sent to `certs chown`, which gave them every service key and
still not their own). The tests that change owners run as root with a throwaway login user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from as_user import run_as

from oddl.cli import certs as certs_cli
from oddl.cli.exit_codes import EXIT_FAILED, EXIT_OK
from oddl.common.errors import SecurityError
from oddl.common.security.files import SecurityFiles
from oddl.common.security.handout import is_login_user, operator_kit
from oddl.common.security.lab_ca import init_lab_ca
from oddl.common.security.ownership import unreadable_key_message

AS_ROOT = os.geteuid() == 0 and shutil.which("useradd") is not None


def test_the_kit_holds_the_operators_own_files_only(lab: SecurityFiles) -> None:
    kit, files = operator_kit(lab.manifest, "alice")
    paths = {rel for rel, _ in files}
    assert paths == {"tls/ca.crt", "tls/operator-alice.crt", "tls/operator-alice.key",
                     "curve/operator-alice.key", "curve/operator-alice.key_secret"}
    assert {rel for rel, private in files if private} == {"tls/operator-alice.key",
                                                          "curve/operator-alice.key_secret"}
    assert kit["operators"] == ["alice"] and list(kit["operator_certs"]) == ["alice"]
    assert list(kit["curve"]["operators"]) == ["alice"]
    assert {f["path"] for f in kit["files"]} == paths
    with pytest.raises(SecurityError, match="no operator 'bob' .*--operators bob"):
        operator_kit(lab.manifest, "bob")


def test_a_process_that_cannot_read_an_operator_key_is_sent_to_hand_out(
        tmp_path: Path) -> None:
    key = tmp_path / "tls" / "operator-alice.key"
    key.parent.mkdir()
    key.write_bytes(b"x")
    text = unreadable_key_message(key, "Permission denied")
    assert "operator alice's key" in text
    assert f"oddl certs hand-out --certs {tmp_path} --operator alice --to" in text
    assert "certs chown" not in text


@pytest.fixture(scope="module")
def login_user() -> Iterator[str]:
    """A throwaway login user (a home, a shell, a regular uid)."""
    if not AS_ROOT:
        pytest.skip("changing owners needs root and useradd (CI runs as root)")
    name = f"oddlop{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True,
                   capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


def test_hand_out_gives_a_login_user_their_own_key_and_chown_refuses_them(
        login_user: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert is_login_user(login_user) and not is_login_user("nobody")
    certs = tmp_path / "certs"
    init_lab_ca(certs, ["n0", "n1"], operators=("operator", "alice"))
    os.chmod(tmp_path, 0o755)
    # certs chown would hand every service key over: refused, with the right command
    assert certs_cli.main(["certs", "chown", "--certs", str(certs), "--owner",
                           login_user]) == EXIT_FAILED
    err = " ".join(capsys.readouterr().err.split())
    assert f"{login_user}: that is a login user" in err
    assert f"certs hand-out --certs {certs} --operator NAME --to {login_user}" in err
    assert (certs / "tls" / "server.key").stat().st_uid == 0  # nothing was handed over
    assert certs_cli.main(["certs", "hand-out", "--certs", str(certs), "--operator", "alice",
                           "--to", login_user]) == EXIT_OK
    dest = Path(pwd.getpwnam(login_user).pw_dir) / ".config" / "oddl" / "certs"
    assert f"--certs {dest}" in capsys.readouterr().out
    on_disk = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert on_disk == {"manifest.json", "tls/ca.crt", "tls/operator-alice.crt",
                       "tls/operator-alice.key", "curve/operator-alice.key",
                       "curve/operator-alice.key_secret"}
    assert (dest / "tls" / "operator-alice.key").stat().st_mode & 0o777 == 0o600

    def read_as_operator() -> tuple[int, str]:
        mine = SecurityFiles.load(dest)
        mine.operator_tls("alice").read()
        assert mine.operators == ("alice",)
        try:
            (certs / "tls" / "server.key").read_bytes()
        except PermissionError:
            return 0, "ok"
        return 4, "read the controller's key"

    assert run_as(login_user, read_as_operator) == (0, "ok")


def test_the_cli_uses_the_one_operator_a_handed_out_folder_names(
        lab: SecurityFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from oddl.cli import operator as operator_cli
    from oddl.common.security.handout import hand_out
    from oddl.common.security.ownership import resolve_owner
    from oddl.operator import client as client_module

    me = pwd.getpwuid(os.geteuid()).pw_name
    dest = tmp_path / "mine"
    hand_out(lab.root, lab.manifest, "alice", resolve_owner(me), dest)
    chosen: dict[str, str] = {}

    class Recorder:
        def __init__(self, address: str, *, certs: str, operator: str) -> None:
            chosen.update(address=address, certs=certs, operator=operator)

    monkeypatch.setattr(client_module, "OperatorClient", Recorder)
    monkeypatch.delenv("ODDL_CONFIG", raising=False)
    operator_cli.connect(argparse.Namespace(certs=str(dest), controller="127.0.0.1:1",
                                            config=None))
    assert chosen["operator"] == "alice" and chosen["certs"] == str(dest)
