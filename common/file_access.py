"""Who may open a device port or a local socket, and the fix when a user may not.

A lab's services run as their own user (`oddl`), so a serial port or a socket folder that root
opens may still be closed to the service, and a training user outside group `oddl` cannot
reach the agent's socket. These helpers read the file's owner, group and mode (following
symbolic links such as ``/dev/serial/by-id/…``) and a user's groups, and say in one sentence
what stands in the way and the command that removes it. POSIX only; elsewhere they say
nothing.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

try:
    import grp
    import pwd
except ImportError:  # pragma: no cover - not POSIX
    grp = pwd = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Access:
    """A file's owner, group and permission bits."""

    path: str
    owner: str
    group: str
    mode: int

    def describe(self) -> str:
        """E.g. '/dev/ttyUSB0 (root:dialout, mode 0660)'."""
        return f"{self.path} ({self.owner}:{self.group}, mode {self.mode:04o})"


def access_of(path: str) -> Access | None:
    """The owner, group and mode of `path` (links followed), or None when it cannot be read."""
    if pwd is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return Access(os.path.realpath(path), user_name(st.st_uid), group_name(st.st_gid),
                  stat.S_IMODE(st.st_mode))


def user_groups(user: str) -> set[str] | None:
    """The groups `user` belongs to (primary and supplementary), or None for no such user."""
    if pwd is None or grp is None:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    groups = {g.gr_name for g in grp.getgrall() if user in g.gr_mem}
    groups.add(group_name(entry.pw_gid))
    return groups


def can_open(access: Access, user: str, *, write: bool = True,
             also_groups: frozenset[str] = frozenset()) -> bool | None:
    """Whether `user` (with `also_groups` besides its own, as a unit's ``Group=`` gives it)
    may open the file for reading (and writing) by its permission bits (root always may);
    None when the user is unknown."""
    return _may(access, user, stat.S_IRUSR | (stat.S_IWUSR if write else 0), also_groups)


def permits(mode: int, owner_bits: int, *, is_root: bool, is_owner: bool,
            in_group: bool) -> bool:
    """The POSIX rule: whether a file of `mode` grants `owner_bits` (given as the owner's:
    S_IRUSR, S_IWUSR, S_IXUSR) to a user who is root, its owner, in its group, or other."""
    if is_root:
        return True
    bits = owner_bits if is_owner else owner_bits >> 3 if in_group else owner_bits >> 6
    return mode & bits == bits


def _may(access: Access, user: str, owner_bits: int,
         also_groups: frozenset[str] = frozenset()) -> bool | None:
    """Whether `user` has `owner_bits` on the file through its owner, group or other bits;
    None when the user is unknown."""
    groups = user_groups(user)
    if groups is None:
        return None
    return permits(access.mode, owner_bits, is_root=user == "root",
                   is_owner=user == access.owner, in_group=access.group in groups | also_groups)


def permission_advice(path: str, user: str, *, write: bool = True,
                      also_groups: frozenset[str] = frozenset()) -> str:
    """Why `user` (with `also_groups`, as its unit runs it) cannot open `path` and the fix,
    or "" when it can (or nothing is known)."""
    access = access_of(path)
    if access is None:
        return ""
    allowed = can_open(access, user, write=write, also_groups=also_groups)
    if allowed is None or allowed:
        return ""
    who = user
    if also_groups:
        who = f"{user} (with group {', '.join(sorted(also_groups))}, as its unit runs it)"
    want = "read and write" if write else "read"
    group_bits = stat.S_IRGRP | (stat.S_IWGRP if write else 0)
    if access.mode & group_bits == group_bits and access.group != "root":
        return (f"user {who} may not {want} {access.describe()}: it is not in group "
                f"{access.group}; add it (sudo usermod -aG {access.group} {user}) and restart "
                "its service or log in again")
    return (f"user {who} may not {want} {access.describe()}; give its group {want} access "
            "(a udev rule for a device port, e.g. GROUP=\"dialout\", MODE=\"0660\") and add "
            f"{user} to that group")


def is_permission_error(exc: BaseException) -> bool:
    """True when `exc` (or what it wraps) is EACCES or EPERM."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.EACCES, errno.EPERM):
            return True
        if isinstance(seen, OSError) and seen.errno is None and "Permission denied" in str(seen):
            return True  # pyserial re-raises as SerialException(errno, "could not open …")
        seen = seen.__cause__ or seen.__context__
    return "[Errno 13]" in str(exc) or "Permission denied" in str(exc)


def current_user() -> str:
    """The name of the user this process runs as."""
    if pwd is None:
        return os.environ.get("USER", "")
    return user_name(os.geteuid())


def user_name(uid: int) -> str:
    """The name of user `uid` (its number when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    """The name of group `gid` (its number when it has none)."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def socket_advice(path: str, user: str | None = None) -> str:
    """Why `user` (default: this process's) cannot connect to the local socket at `path`, and
    the fix, or "" (the folder it is in must be searchable, the socket writable)."""
    user = user or current_user()
    folder = access_of(os.path.dirname(path) or ".")
    if folder is not None and _may(folder, user, stat.S_IXUSR) is False:
        return (f"user {user} may not enter {folder.describe()}, where the agent's socket "
                f"is: add it to group {folder.group} (sudo usermod -aG {folder.group} {user}) "
                "and log in again")
    sock = access_of(path)
    if sock is not None and _may(sock, user, stat.S_IWUSR) is False:
        return (f"user {user} may not write to the agent's socket {sock.describe()}: add it "
                f"to group {sock.group} (sudo usermod -aG {sock.group} {user}) and log in "
                "again")
    return ""
