"""Who made a call: the training process behind a local API request (decision record 0033).

A client stamps each request with its process's identity, `[pid, start]`: its pid and the
start time the kernel gives the process (clock ticks since boot, /proc/PID/stat). A pid is
reused; the pair is not. The agent, on the same host, checks that pair once when the request
arrives (`watched`): where /proc shows the process as the client saw itself, the agent can
tell later whether that process is still there (`gone`); where it does not (no /proc, or the
client in another pid namespace, a container), the request is not watched and nothing about
it changes. The local API voids the call of a watched process that is gone
(`oddl.agents.local_api.server`).
"""

from __future__ import annotations

import os
from typing import Any

Caller = tuple[int, int]
"""(pid, start time in clock ticks since boot) of a training process."""

_PROC = "/proc"


def start_ticks(pid: int, proc: str = _PROC) -> int | None:
    """The start time of live process `pid` (clock ticks since boot); None when there is no
    such process, it has exited (a zombie waiting for its parent counts as gone), or /proc
    cannot say."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or parentheses itself
    fields = text[text.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    try:
        return int(fields[19])  # field 22, starttime
    except ValueError:
        return None


def identity() -> list[int] | None:
    """This process's identity as a client stamps it on its requests (None: /proc cannot
    say, so its calls are not watched)."""
    pid = os.getpid()
    start = start_ticks(pid)
    return None if start is None else [pid, start]


def watched(stamp: Any, proc: str = _PROC) -> Caller | None:
    """The caller of a request stamped `stamp` (its header's ``caller``), when this agent sees
    that very process now; None for no stamp, a malformed one, or a process it cannot see."""
    if not (isinstance(stamp, list) and len(stamp) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in stamp)):
        return None
    pid, start = stamp
    return (pid, start) if start_ticks(pid, proc) == start else None


def gone(caller: Caller, proc: str = _PROC) -> bool:
    """Whether the watched process `caller` has exited (its pid is free, reused, or a zombie)."""
    pid, start = caller
    return start_ticks(pid, proc) != start
