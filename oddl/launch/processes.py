"""Start and stop the testbed's processes: each prints one JSON line when it is ready.

Children get their own session (so a terminal's Ctrl-C reaches only the parent, which stops
them in order) and are killed by the kernel if the parent dies (PR_SET_PDEATHSIG on Linux).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from oddl.common.errors import OddlError

logger = logging.getLogger(__name__)


PARENT_ENV = "ODDL_DIE_WITH_PARENT"
"""Set by ManagedProcess to its own pid: the child asks the kernel for SIGTERM when that
process dies (`die_with_parent`, called first thing by `python -m oddl`)."""


def request_parent_death_signal() -> None:
    """Ask the kernel for SIGTERM when this process's parent dies (Linux; else nothing)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def die_with_parent() -> None:
    """In a child started by ManagedProcess: SIGTERM when the parent dies (Linux).

    Done in the child after exec, not in a preexec_fn: a preexec_fn makes subprocess fork()
    with the parent's fork handlers, and gRPC's restart its poller in the child, which then
    aborts on the descriptors close_fds closed (grpc/grpc#43055) before it can exec.
    """
    parent = os.environ.pop(PARENT_ENV, "")
    if not parent or not sys.platform.startswith("linux"):
        return
    request_parent_death_signal()
    if str(os.getppid()) != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


class ManagedProcess:
    """One child process whose stderr goes to a log file and whose first stdout line is JSON.

    A detached child (`detach=True`) writes its stdout to a file in the log folder and
    outlives this process (`oddl testbed up`); otherwise it dies with its parent.
    """

    def __init__(self, name: str, argv: list[str], log_dir: Path,
                 env: dict[str, str] | None = None, detach: bool = False):
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self.out_path = log_dir / f"{name}.out"
        self.detached = detach
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in release); a restart appends
        self._out = open(self.out_path, "wb") if detach else None  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv, stdout=self._out if detach else subprocess.PIPE, stderr=self._log,
            stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, **(env or {}),
                 **({} if detach else {PARENT_ENV: str(os.getpid())})})
        self.info: dict[str, Any] = {}
        self.together: int | None = None
        """The `ProcessGroup.start_together` call that started it (None: alone): a group
        stops those started together at once."""

    def _first_line(self, timeout: float) -> bytes:
        if self.detached:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                text = self.out_path.read_bytes()
                if b"\n" in text:
                    return text.split(b"\n", 1)[0] + b"\n"
                time.sleep(0.05)
            return b""
        line: list[bytes] = []
        stdout = self.proc.stdout
        assert stdout is not None  # not detached: a pipe
        reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return line[0] if line else b""

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for the child's ready line; raise with the log's tail if it fails or stalls."""
        line = [self._first_line(timeout)]
        if not line[0]:
            self.stop()
            raise OddlError(f"{self.name} did not become ready within {timeout:.0f} s "
                            f"(exit code {self.proc.poll()}); its log {self.log_path} ends with:\n"
                            f"{self.tail()}")
        try:
            self.info = json.loads(line[0])
        except ValueError as exc:
            raise OddlError(f"{self.name} printed {line[0][:200]!r} instead of its ready line; "
                            f"see {self.log_path}") from exc
        return self.info

    def tail(self, lines: int = 15) -> str:
        """The last lines of the child's log."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def alive(self) -> bool:
        """True while the child runs."""
        return self.proc.poll() is None

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds; returns the exit code."""
        self.ask_to_stop()
        return self.reap(time.monotonic() + grace, grace)

    def ask_to_stop(self) -> None:
        """SIGTERM, if the child still runs (`reap` waits for it)."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def reap(self, deadline: float, grace: float) -> int | None:
        """Wait for the child to exit until the monotonic `deadline` (`grace` s after its
        SIGTERM), then SIGKILL; release this side's handles; the exit code."""
        try:
            self.proc.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %.0f s; killing it", self.name, grace)
            self.proc.kill()
            self.proc.wait(5)
        self.release()
        return self.proc.returncode

    def release(self) -> None:
        """Close this side's file handles (a detached child keeps running)."""
        if self.proc.stdout:
            self.proc.stdout.close()
        if self._out is not None:
            self._out.close()
        self._log.close()


class Child(NamedTuple):
    """A child to start: its name (and log file's), argv and environment added."""

    name: str
    argv: list[str]
    env: dict[str, str] | None = None


class ProcessGroup:
    """Processes started in order and stopped in reverse, also on errors and Ctrl-C; peers
    started together are stopped together."""

    def __init__(self, log_dir: Path, grace: float = 5.0):
        self.log_dir = log_dir
        self.grace = grace
        """Seconds each child gets to stop after SIGTERM (one that writes its trace may need
        more) before SIGKILL."""
        self.procs: list[ManagedProcess] = []
        self._starts = itertools.count()

    def start(self, name: str, argv: list[str], timeout: float = 30.0,
              detach: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
        """Start a child (with `env` added to this process's environment) and wait for its
        ready line."""
        p = ManagedProcess(name, argv, self.log_dir, env=env, detach=detach)
        self.procs.append(p)
        return p.wait_ready(timeout)

    def start_together(self, children: Sequence[Child], timeout: float = 30.0,
                       detach: bool = False) -> list[dict[str, Any]]:
        """Start peers that need nothing of each other (a testbed's agents) at once, and
        wait until each is ready, each within `timeout` of the wait for it (as if started
        one by one: forty agents importing on two cores take longer together than one);
        their ready lines, in order. They are stopped together too. One that fails raises;
        those started stay in the group."""
        together = next(self._starts)
        started = []
        for child in children:
            p = ManagedProcess(child.name, child.argv, self.log_dir, env=child.env,
                               detach=detach)
            p.together = together
            self.procs.append(p)
            started.append(p)
        return [p.wait_ready(timeout) for p in started]

    def stop_all(self) -> None:
        """Stop every child, newest first; those started together at once."""
        while self.procs:
            batch = [self.procs.pop()]
            while (self.procs and batch[0].together is not None
                   and self.procs[-1].together == batch[0].together):
                batch.append(self.procs.pop())
            for p in batch:
                p.ask_to_stop()
            deadline = time.monotonic() + self.grace
            try:
                for p in batch:
                    p.reap(deadline, self.grace)
            finally:  # an error or Ctrl-C above: the rest of the batch is out of the group
                for p in batch:
                    if p.proc.returncode is None:
                        p.proc.kill()
                        p.release()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def oddl_command(*args: str) -> list[str]:
    """argv that runs the `oddl` CLI of this interpreter."""
    return [sys.executable, "-m", "oddl", *args]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (for a child that must be told one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
