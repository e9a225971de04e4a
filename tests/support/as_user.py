"""Running a piece of a test as another user (root only): the kernel then checks that user's
permissions, as for a service started with ``User=`` or an operator logged in."""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable


def run_as(user: str, fn: Callable[[], tuple[int, str]]) -> tuple[int, str]:
    """`fn()` in a forked child that has become `user` (uid, gid, no supplementary groups):
    its (exit code, text), or (5, the exception) when it raised."""
    entry = pwd.getpwnam(user)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code, text = 5, "child failed"
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            code, text = fn()
        except BaseException as exc:  # report anything to the parent
            text = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(wfd, text.encode())
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text
