"""Driving every rank's client at once, from one process (tests, benchmarks, the demo):
`collective_all` runs a call on every client together, `allreduce_all` an all-reduce."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from oddl.agents.client.agent_client import AgentClient


def collective_all(clients: Sequence[AgentClient],
                   call: Callable[[AgentClient, int], Any]) -> tuple[float, list[Any]]:
    """Run `call(client, rank)` on every client at once (one thread each, released
    together). Returns the wall time from the common start to the last result, and per
    client its result or the exception it raised."""
    outs: list[Any] = [None] * len(clients)
    start = threading.Barrier(len(clients) + 1)

    def run(r: int) -> None:
        start.wait()
        try:
            outs[r] = call(clients[r], r)
        except Exception as exc:  # handed back to the caller
            outs[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(clients))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, outs


def allreduce_all(clients: Sequence[AgentClient], arrays: Sequence[np.ndarray], *,
                  inplace: bool = False, step: int | None = None, op: str = "sum"
                  ) -> tuple[float, list[Any]]:
    """Call allreduce on every client at once; with `inplace` each result is written into its
    input array, as gloo does; `step` numbers the call on every client (default: each
    client's own count). Returns (wall time, per client its result or exception)."""
    return collective_all(clients, lambda c, r: c.allreduce(
        arrays[r], out=arrays[r] if inplace else None, step=step, op=op))
