"""Who may read which private key: the service user's keys, and nobody else's.

The services of a lab (``deploy/systemd/``) run as a service user (``User=oddl``), while
``oddl certs init`` usually runs as root. The keys a service reads are handed to that user
(owner USER, group GROUP, mode 0600: nobody else but root reads them); every other private
key stays with whoever issued it:

- the controller reads ``tls/server.key``;
- an agent reads ``tls/agent-NODE.key`` and ``curve/NODE.key_secret``;
- a ZeroMQ server such as the emulated fabric reads ``curve/SERVER.key_secret``;
- ``tls/ca.key`` (issues certificates) and the operators' keys (each operator's own) are never
  handed to the service user.

:func:`service_keys` is the plan (pure: the manifest in, relative paths out);
:func:`resolve_owner` and :func:`hand_over` are the thin shell that looks the user up and
changes the owner. :func:`unreadable_key_message` says why a process cannot read a key.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oddl.common.errors import SecurityError
from oddl.common.file_access import group_name, permits, user_name

DOCS = "docs/explanation/security.md"


@dataclass(frozen=True)
class KeyOwner:
    """The user (and group) that is to own the service keys."""

    user: str
    uid: int
    group: str
    gid: int

    def __str__(self) -> str:
        return f"{self.user}:{self.group}"


def service_keys(manifest: Mapping[str, Any], *, nodes: Iterable[str] | None = None,
                 server: bool = True, curve_servers: bool = True) -> list[str]:
    """The private keys (paths relative to the certs folder) the services read: the
    controller's TLS key, each node's agent TLS key and CURVE secret, and each CURVE server's
    secret. `nodes` limits the nodes (None: all); `server`/`curve_servers` False leave the
    controller's and the CURVE servers' keys out. Never the CA key nor an operator's key."""
    wanted = list(manifest["nodes"]) if nodes is None else list(nodes)
    keys: list[str] = []
    if server:
        keys.append(manifest["server"]["key"])
    for node in wanted:
        keys.append(manifest["agent_certs"][node]["key"])
        keys.append(manifest["curve"]["nodes"][node]["secret"])
    if curve_servers:
        keys += [e["secret"] for e in manifest["curve"]["servers"].values()]
    kept = {manifest["ca"]["key"],
            *(e["key"] for e in manifest["operator_certs"].values()),
            *(e["secret"] for e in manifest["curve"]["operators"].values())}
    return [k for k in keys if k not in kept]


def parse_owner(spec: str) -> tuple[str, str]:
    """``USER`` or ``USER:GROUP`` as (user, group); group "" means the user's own group."""
    user, _, group = spec.partition(":")
    if not user.strip():
        raise SecurityError(f"bad owner {spec!r}: use USER or USER:GROUP, e.g. --owner oddl")
    return user.strip(), group.strip()


def resolve_owner(spec: str) -> KeyOwner:
    """Look USER[:GROUP] up on this host; an unknown user or group is refused with the fix."""
    user, group = parse_owner(spec)
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SecurityError(
            f"--owner {spec}: there is no user {user!r} on this host; create the service "
            f"user first (sudo useradd --system --no-create-home --shell /usr/sbin/nologin "
            f"{user}) or name the user the services run as (User= in deploy/systemd/)"
        ) from None
    if not group:
        try:
            group = grp.getgrgid(entry.pw_gid).gr_name
        except KeyError:
            group = str(entry.pw_gid)
        return KeyOwner(user, entry.pw_uid, group, entry.pw_gid)
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise SecurityError(f"--owner {spec}: there is no group {group!r} on this host; "
                            f"create it (sudo groupadd --system {group}) or leave it out "
                            f"(--owner {user}: the user's own group)") from None
    return KeyOwner(user, entry.pw_uid, group, gid)


def check_can_hand_over(owner: KeyOwner) -> None:
    """Refuse, before anything is written, to hand keys to another user without root."""
    if os.geteuid() not in (0, owner.uid):
        raise SecurityError(f"--owner {owner}: only root can give files to another user; run "
                            "the command with sudo (or leave --owner out to keep the keys "
                            "yours)")


def may_enter(mode: int, uid: int, gid: int, owner_uid: int, owner_gids: Iterable[int]
              ) -> bool:
    """Whether a user (`owner_uid`, its groups) may search a folder of that mode, owner
    `uid` and group `gid` (`file_access.permits`, the one rule for every permission check)."""
    return permits(mode, stat.S_IXUSR, is_root=owner_uid == 0, is_owner=uid == owner_uid,
                   in_group=gid in set(owner_gids))


def check_reachable(folder: Path, owner: KeyOwner) -> None:
    """Refuse a `folder` (or a folder above it) that `owner` may not enter: the service
    could not reach its keys however they are owned."""
    gids = os.getgrouplist(owner.user, owner.gid)
    for f in [*reversed(folder.absolute().parents), folder.absolute()]:
        if not f.exists():
            return  # made by `certs init`, 0755
        st = f.stat()
        if not may_enter(st.st_mode, st.st_uid, st.st_gid, owner.uid, gids):
            raise SecurityError(f"{f}: user {owner.user} may not enter it ({describe_owner(st)}"
                                f"), so the services cannot reach their keys; sudo chmod 755 "
                                f"{f} (the keys themselves stay 0600)")


def hand_over(root: Path, keys: Iterable[str], owner: KeyOwner) -> list[Path]:
    """Make each key of `keys` under `root` that exists here owned by `owner`, mode 0600;
    return the paths changed. A host holds a subset of the folder, so a key that is not
    here is passed over. Needs root unless `owner` is the caller."""
    present = [root / k for k in keys if (root / k).exists()]
    for path in present:
        try:
            os.chown(path, owner.uid, owner.gid)
            os.chmod(path, 0o600)
        except PermissionError:
            raise SecurityError(f"{path}: cannot give it to {owner} (permission denied); run "
                                "the command as root (sudo)") from None
        except OSError as exc:
            raise SecurityError(f"{path}: cannot give it to {owner} ({exc.strerror})") from None
    return present


def describe_owner(st: os.stat_result) -> str:
    """``user:group, mode 0600`` for a stat result."""
    return (f"owned by {user_name(st.st_uid)}:{group_name(st.st_gid)}, "
            f"mode {stat.S_IMODE(st.st_mode):04o}")


def process_user() -> str:
    """The user this process runs as (name and uid)."""
    uid = os.geteuid()
    return f"{user_name(uid)} (uid {uid})"


def unreadable_key_message(path: Path, reason: str, *, private: bool = True) -> str:
    """Why this process cannot read `path` (a private key unless `private` is False),
    naming its owner and mode (or the folder that stops it), the user this process runs as,
    and the fix."""
    me = process_user()
    user = me.split(" ", 1)[0]
    try:
        st = path.stat()
    except OSError:
        blocked = _first_closed_folder(path)
        where = (f"the folder {blocked} ({describe_owner(blocked.stat())}) cannot be entered"
                 if blocked is not None else "a folder on its path cannot be entered")
        return (f"{path}: cannot read ({reason}): {where} by this process, which runs as "
                f"{me}; let it in (sudo chmod 755 {blocked or path.parent}) — the keys "
                f"themselves stay 0600 ({DOCS})")
    if not private:
        return (f"{path}: cannot read ({reason}): it is {describe_owner(st)} and this process "
                f"runs as {me}; it holds nothing secret: sudo chmod 644 {path} ({DOCS})")
    if path.name.startswith("operator-"):  # tls/operator-NAME.key, curve/operator-NAME.key_secret
        name = path.name.removeprefix("operator-").split(".", 1)[0]
        return (f"{path}: cannot read ({reason}): it is {describe_owner(st)}, operator {name}'s "
                f"key, and this process runs as {me}. Operators get their own copy, never the "
                f"services' keys: ask the lab's admin to run `sudo oddl certs hand-out --certs "
                f"{path.parent.parent} --operator {name} --to {user}`, then use --certs with "
                f"the folder it names ({DOCS})")
    return (f"{path}: cannot read ({reason}): it is {describe_owner(st)} and this process runs "
            f"as {me}; give the service user its key (sudo chown {user}: {path} && sudo chmod "
            f"600 {path}), or issue the keys with `sudo oddl certs init ... --owner {user}` / "
            f"hand them over with `sudo oddl certs chown --certs DIR --owner {user}` ({DOCS})")


def _first_closed_folder(path: Path) -> Path | None:
    """The first folder above `path` this process may not search (no x permission)."""
    for folder in reversed(path.absolute().parents):
        if folder.exists() and not os.access(folder, os.X_OK):
            return folder
    return None
