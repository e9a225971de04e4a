"""The process group's timeout, as PyTorch promises it (issue 33).

`init_process_group(timeout=...)` and `new_group(timeout=...)` bound every collective and
barrier of the group; a call's own `timeout=` (`dist.barrier(timeout=...)`, options with a
timeout set) bounds that call instead. The bound reaches the agent with the call (its wait for
the other ranks, decision record 0016) and the client's wait for the agent's answer. A call that
fails only after its whole timeout has passed raises `CollectiveTimeout`, naming the group, the
call and the timeout, and how to go on; PyTorch's own barrier-timeout tests look for
"Timed out" or "timeout" in it, as gloo's says.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, Protocol

from oddl.common.errors import CollectiveError, OperationRefused

__all__ = ["DEFAULT_TIMEOUT_S", "CollectiveTimeout", "bounded", "call_timeout_s", "seconds"]

DEFAULT_TIMEOUT_S = 1800.0
"""c10d's default process-group timeout for CPU backends (30 minutes)."""

GO_ON = ("the group's ranks no longer agree on which collective comes next, so the oddl "
         "backend refuses this process's later collectives; to go on, make a new process "
         "group on every rank (dist.new_group(), or destroy_process_group and "
         "init_process_group again: its creation re-agrees the job's step numbers), or start "
         "the job's next step: restart every training process together (torchrun "
         "--max-restarts does) from the last checkpoint")
"""What to do after a collective failed once its data had gone to the agent."""


class CollectiveTimeout(CollectiveError):
    """A collective or barrier did not complete within its process group's timeout."""


class Bounded(Protocol):
    """A channel whose calls can be bounded (`Channel`, `MeshChannel`)."""

    def bounded(self, timeout_s: float) -> Any:
        """A context in which the channel's calls wait at most `timeout_s`."""
        ...


def seconds(timeout: Any, default: float = DEFAULT_TIMEOUT_S) -> float:
    """A timedelta (or a number of seconds) as seconds; `default` when unset (c10d's unset
    timeout is negative)."""
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        s = float(timeout)
    else:
        return default
    return s if s > 0 else default


def call_timeout_s(opts: Any, group_timeout_s: float) -> float:
    """A call's bound: its options' own timeout when set, else the group's."""
    return seconds(getattr(opts, "timeout", None), group_timeout_s)


def bounded(channel: Bounded | None, group: str, kind: str, timeout_s: float,
            fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` run with the channel's calls bounded by `timeout_s` (None: `fn` passes the bound to
    its calls itself); a failure that came only after the whole timeout becomes
    `CollectiveTimeout` (module docstring)."""
    def run(*args: Any) -> Any:
        start = time.monotonic()
        with channel.bounded(timeout_s) if channel is not None else nullcontext():
            try:
                return fn(*args)
            except (CollectiveError, OperationRefused) as exc:
                elapsed = time.monotonic() - start
                if elapsed < timeout_s or isinstance(exc, CollectiveTimeout):
                    raise
                raise CollectiveTimeout(
                    f"{kind} on {group} Timed out after {elapsed:.1f} s: not every rank of the "
                    f"group made the call within its timeout of {timeout_s:g} s (set by "
                    f"init_process_group / new_group(timeout=...), or the call's own timeout=); "
                    f"the agent said: {exc}. If a rank is only slow, give the group a longer "
                    f"timeout; otherwise {GO_ON}") from exc
    return run
