"""Helpers the tests share for child processes: a command that serves until SIGTERM, the
`oddl` command line, and code run in a fresh interpreter.

The emulated testbed itself is started with `oddl.launch.testbed` (`RunningTestbed`,
`launch_emulated`, `RestartableTestbed`), the same launcher the demos and benchmarks use.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
"""The repository."""
EMULATED = ROOT / "deploy" / "testbeds" / "emulated-4node.toml"
"""The emulated four-node testbed file."""


def start_child(argv: list[str], capture_stderr: bool = False) -> subprocess.Popen[str]:
    """Start `argv` unbuffered with its stdout (and, if asked, its stderr) as text pipes."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE if capture_stderr else None, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def first_line(proc: subprocess.Popen[str], timeout: float = 20.0,
               what: str = "the emulator") -> str:
    """The child's first stdout line (the address it serves on), stripped; fails the test
    if none comes within `timeout` s."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(timeout=timeout), f"{what} printed nothing"
    return proc.stdout.readline().strip()


def close_child(proc: subprocess.Popen[Any]) -> None:
    """Kill the child if it still runs and close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@contextmanager
def serving(argv: list[str], timeout: float = 20.0, what: str = "the emulator",
            capture_stderr: bool = False) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start `argv`, wait for its first stdout line (the address it serves on) and yield
    (process, line); on leaving, a process still running is killed and its pipes closed."""
    proc = start_child(argv, capture_stderr)
    try:
        yield proc, first_line(proc, timeout, what)
    finally:
        close_child(proc)


def stop_with_sigterm(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM, then the exit code (within `timeout` s)."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=timeout)


def run_oddl(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `oddl ARGS` (this interpreter's) and return the finished process."""
    return subprocess.run([sys.executable, "-m", "oddl", *args], capture_output=True, text=True,
                          timeout=timeout, input=stdin, env={**os.environ, **(env or {})})


def run_in_fresh_interpreter(code: str, *args: str, timeout: float,
                             env: dict[str, str] | None = None
                             ) -> subprocess.CompletedProcess[str]:
    """`python -c CODE ARGS` from the repository (a process that has not used gRPC yet)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def json_from_fresh_interpreter(code: str, *args: str, timeout: float,
                                env: dict[str, str] | None = None) -> Any:
    """Run `code` as `run_in_fresh_interpreter` does; it must succeed; its last stdout line
    as JSON."""
    proc = run_in_fresh_interpreter(code, *args, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def train_demo_summary(run_dir: Path, epochs: int, options: str = "", timeout: float = 180,
                       env: dict[str, str] | None = None) -> Any:
    """`oddl demo --train` (ring, JSON) with `epochs` epochs in a fresh interpreter (this one
    may have used gRPC, and the demo forks its testbed processes); its summary. `options`:
    more keyword arguments of `run_train_demo` as source text, e.g. ``", backend='oddl'"``."""
    code = ("import json, sys; from pathlib import Path; from oddl.demo.train import "
            "run_train_demo; print(json.dumps(run_train_demo(None, Path(sys.argv[1]), "
            f"{epochs}, 'ring', True{options})))")
    return json_from_fresh_interpreter(code, str(run_dir), timeout=timeout, env=env)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> float:
    """Poll `predicate` until it is true; the seconds that took. Fails the test after
    `timeout` s, naming `what`."""
    start = time.monotonic()
    wait_for(predicate, timeout, what, interval)
    return time.monotonic() - start


def wait_for(probe: Callable[[], T | Literal[False] | None], timeout: float, what: str,
             interval: float = 0.05) -> T:
    """Poll `probe` until it returns something true, and return that. Fails the test after
    `timeout` s, naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(interval)


def run_ranks(argv: list[str], apis: list[str], timeout: float,
              env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Start one process per agent API as torchrun would (rank r on `apis`, a fresh
    rendezvous port, `env` added), each running `argv` from the project's root; their last
    stdout lines as JSON, in rank order. Fails naming a rank's error output; kills the others.
    A rendezvous port another process took between its choice and rank 0's bind (torch's
    store says EADDRINUSE before any rank reaches its agent) is chosen again, up to 3 times."""
    for attempt in range(3):
        try:
            return _run_ranks_once(argv, apis, timeout, env)
        except _PortTaken:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class _PortTaken(AssertionError):
    """Rank 0 could not bind the rendezvous port (another process took it)."""


def _run_ranks_once(argv: list[str], apis: list[str], timeout: float,
                    env: dict[str, str] | None) -> list[dict[str, Any]]:
    from oddl.launch.processes import free_port
    from oddl.launch.testbed import torchrun_env

    port = free_port()
    procs = [subprocess.Popen(argv, env={**torchrun_env(rank, len(apis), port, apis),
                                         **(env or {})},
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for rank in range(len(apis))]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0 and "EADDRINUSE" in err and p is procs[0]:
                raise _PortTaken(err[-3000:])
            assert p.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return results
