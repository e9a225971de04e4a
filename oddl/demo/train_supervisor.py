"""The parent side of `oddl demo --train`'s training processes: start them, follow their JSON
lines, collect what they report (`WorkersReport`).

Each is `python -m oddl.demo.train_worker` (or a test's stand-in), a `ManagedProcess` started
without a preexec_fn: the parent holds live gRPC channels by now, and a plain fork runs gRPC's
fork handlers in the child, which sometimes abort it ("epoll_wait error: Bad file
descriptor"). Without one, subprocess uses vfork and no fork handler runs; the worker asks
for SIGTERM on its parent's death itself (oddl.demo.train_worker.main).
"""

from __future__ import annotations

import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oddl.launch.processes import ManagedProcess, free_port

logger = logging.getLogger(__name__)

WORLD = 4
"""Training processes (ranks) of the demo, one a node."""

Event = tuple[int, "dict[str, Any] | None"]
"""(rank, one JSON line of that rank) or (rank, None) when its stdout closed."""


def start_workers(workers: list[ManagedProcess], run_dir: Path, args: list[str],
                  apis: list[str], networks: str, worker_module: str) -> None:
    """Start the training processes (into `workers`, which the caller stops) and wait until
    each has imported torch."""
    port = free_port()
    for rank in range(WORLD):
        argv = [sys.executable, "-m", worker_module, "--rank", str(rank), "--world",
                str(WORLD), "--store", f"127.0.0.1:{port}", "--agent", apis[rank],
                "--networks", networks, *args]
        workers.append(ManagedProcess(f"worker-{rank}", argv, run_dir))
    for worker in workers:  # started together: the torch imports run in parallel
        worker.wait_ready(120.0)


def follow(workers: list[ManagedProcess]) -> queue.Queue[Event]:
    """A queue of every worker's JSON lines, fed by one thread a worker."""
    events: queue.Queue[Event] = queue.Queue()

    def read(rank: int, worker: ManagedProcess) -> None:
        assert worker.proc.stdout is not None
        for raw in iter(worker.proc.stdout.readline, b""):
            try:
                events.put((rank, json.loads(raw)))
            except ValueError:
                logger.warning("worker %d printed %r", rank, raw[:200])
        events.put((rank, None))

    for rank, worker in enumerate(workers):
        threading.Thread(target=read, args=(rank, worker), daemon=True).start()
    return events


@dataclass
class WorkersReport:
    """What the training processes reported: their results by network, the problems (for
    people) and which ranks failed, and which of them because the optical all-reduce differed
    from the exact reduction (for the summary's checks)."""

    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    failed_ranks: set[int] = field(default_factory=set)
    inexact_ranks: set[int] = field(default_factory=set)
    """Ranks whose all-reduce results differed from the exact reduction (``mismatch``)."""

    def event(self, rank: int, event: dict[str, Any], say: Callable[[str], None]) -> None:
        """Take one JSON line of `rank`."""
        kind = event.get("event")
        if kind == "epoch" and rank == 0:
            say(f"  {event['network']:7} epoch {event['epoch']}: loss {event['loss']:.4f}, "
                f"test accuracy {event['test_accuracy']:.4f}, {event['epoch_s']:.2f} s")
        elif kind == "result":
            self.results.setdefault(event["network"], []).append(event)
            if len(self.results[event["network"]]) == WORLD and event["network"] != "gloo":
                say("training the gloo baseline from the same seed")
        elif kind == "failed":
            self.failed_ranks.add(rank)
            if event.get("mismatch"):
                self.inexact_ranks.add(rank)
                what = "the optical all-reduce differed from the exact reduction"
            else:
                what = f"training over {event.get('network')} failed"
            self.problems.append(f"rank {rank}: {what}: {event.get('error')}")

    def ended(self, rank: int, worker: ManagedProcess) -> bool:
        """A worker's stdout closed; True if it failed (the others would wait for it)."""
        code = worker.proc.wait(30)
        if code != 0 and rank not in self.failed_ranks:
            self.failed_ranks.add(rank)
            self.problems.append(f"rank {rank}: exited with code {code}; its log "
                                 f"{worker.log_path} ends with:\n{worker.tail(8)}")
        return code != 0


def run_workers(workers: list[ManagedProcess], run_dir: Path, args: list[str],
                apis: list[str], networks: str, deadline_s: float, say: Callable[[str], None],
                worker_module: str) -> WorkersReport:
    """Start the four training processes (into `workers`, which the caller stops), follow
    their JSON lines; return what they reported."""
    start_workers(workers, run_dir, args, apis, networks, worker_module)
    events = follow(workers)
    seen = WorkersReport()
    open_streams = set(range(WORLD))
    deadline = time.monotonic() + deadline_s
    while open_streams:
        try:
            rank, event = events.get(timeout=0.5)
        except queue.Empty:
            if time.monotonic() > deadline:
                seen.problems.append(f"training did not finish within {deadline_s:.0f} s")
                break
            continue
        if event is not None:
            seen.event(rank, event, say)
            continue
        open_streams.discard(rank)
        if seen.ended(rank, workers[rank]):
            break  # fail fast: the other ranks would wait for it until their timeout
    return seen
