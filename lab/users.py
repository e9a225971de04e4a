"""The service user `oddl` and a training user in group `oddl`, made when absent and removed
at the end only if this run made them."""

from __future__ import annotations

import grp
import json
import pwd
from pathlib import Path

from lab.procedure import SERVICE_USER, SERVICE_USER_ADD
from lab.shell import run

__all__ = ["SERVICE_USER", "TRAINING_USER", "ensure_users", "owe", "remove_made", "take_owed"]
TRAINING_USER = "oddl-trainer"
OWED = "made-users.json"
"""Under the rigs' state folder: what a rig made and left because another rig was up."""


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _group_exists(group: str) -> bool:
    try:
        grp.getgrnam(group)
    except KeyError:
        return False
    return True


def ensure_users() -> list[str]:
    """Make what is absent; the list of what was made ("user:NAME" / "group:NAME")."""
    made = []
    if not _exists(SERVICE_USER):
        run(SERVICE_USER_ADD)
        made += [f"user:{SERVICE_USER}", f"group:{SERVICE_USER}"]
    elif not _group_exists(SERVICE_USER):
        run(["groupadd", "--system", SERVICE_USER])
        made.append(f"group:{SERVICE_USER}")
    if not _exists(TRAINING_USER):
        run(["useradd", "--user-group", "--no-create-home", "--home-dir", "/tmp",
             "--shell", "/usr/sbin/nologin", "--groups", SERVICE_USER, TRAINING_USER])
        made += [f"user:{TRAINING_USER}", f"group:{TRAINING_USER}"]
    else:
        run(["usermod", "-aG", SERVICE_USER, TRAINING_USER])
    return made


def remove_made(made: list[str]) -> None:
    """Remove what `ensure_users` made (users first; their own groups go with them)."""
    for item in made:
        kind, name = item.split(":", 1)
        if kind == "user" and _exists(name):
            run(["userdel", name], check=False)
    for item in made:
        kind, name = item.split(":", 1)
        if kind == "group" and _group_exists(name):
            run(["groupdel", name], check=False)


def owe(made: list[str], state_root: Path) -> None:
    """Leave `made` for the last rig to remove: a rig that ends while another is up must not
    take that one's users away, and the one still up did not make them."""
    ledger = state_root / OWED
    owed = set(take_owed(state_root)) | set(made)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    tmp = ledger.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(owed)), encoding="utf-8")
    tmp.replace(ledger)


def take_owed(state_root: Path) -> list[str]:
    """What rigs that ended earlier left for the last one (emptied)."""
    ledger = state_root / OWED
    try:
        owed = json.loads(ledger.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        owed = []
    ledger.unlink(missing_ok=True)
    return [item for item in owed if isinstance(item, str) and ":" in item]
