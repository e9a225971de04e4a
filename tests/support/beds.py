"""Emulated testbeds the end-to-end tests share: `Bench`, whose processes a test may kill and
restart, and `allreduce_all`, every node's all-reduce at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers import EMULATED

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all as run_on_all
from oddl.launch.testbed import RestartableTestbed
from oddl.operator.client import OperatorClient


def allreduce_all(clients: list[AgentClient], arrays: list[np.ndarray],
                  step: int | None = None) -> list[object]:
    """Call allreduce on every node at once; each result or the exception it raised."""
    return run_on_all(clients, arrays, step=step)[1]


class Bench(RestartableTestbed):
    """An emulated testbed whose processes the test may kill and restart."""

    def __init__(self, tmp: Path, heartbeat_s: float = 0.3):
        super().__init__(tmp, EMULATED, heartbeat_s=heartbeat_s)
        self.tmp = tmp
        self.operator = OperatorClient(self.address)
        self.iteration = 0
        """The training loop's own count: every call is numbered with it (`step=`), so a
        client made anew after an agent restart pairs with the others' calls."""

    def next_step(self) -> int:
        self.iteration += 1
        return self.iteration

    def allreduce(self, seed: int, n: int = 2000) -> list[object]:
        rng = np.random.default_rng(seed)
        arrays = [rng.integers(-1000, 1000, n) for _ in self.cfg.nodes]
        outs = allreduce_all([self.clients[nd.id] for nd in self.cfg.nodes], arrays,
                             step=self.next_step())
        exact = np.sum(arrays, axis=0)
        return [o if not isinstance(o, np.ndarray) else np.array_equal(o, exact) for o in outs]

    def close(self) -> None:
        self.operator.close()
        super().close()
