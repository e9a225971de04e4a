"""A job switch an agent has not heard of yet: a call that names no job moves to the live job.

An operator cancels a job and submits the next one; a training process calls allreduce at
once. The controller's event stream may reach one agent late, so that agent still takes the
ended job for the live one and starts its collective there (the ready exchange of a standing
schedule), while its peers run on the new job. Here that lag is made certain: the agent's job
events are held until it is inside the old job's exchange, then delivered. It must leave the
ended job and run the call on the new one, and every node's result must be exact.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import EMULATED

from oddl.agents.agent import Agent
from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all
from oddl.common.config import load_testbed
from oddl.controller.server import ControllerServer
from oddl.drivers.emulators.host import start_emulated_testbed
from oddl.operator.client import OperatorClient

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def bed() -> Iterator[dict[str, Any]]:
    cfg = load_testbed(EMULATED)
    # the peers wait for the late agent on the new job; a long receive timeout keeps the
    # test free of timing luck on a loaded machine
    cfg = dataclasses.replace(cfg, timing=dataclasses.replace(cfg.timing,
                                                              receive_timeout_ms=30_000))
    tb = start_emulated_testbed(cfg)
    server = ControllerServer(tb.resolved, "127.0.0.1:0", metrics_listen=None)
    server.start()
    agents, clients = [], []
    operator = OperatorClient(server.address)
    try:
        for node in server.cfg.nodes:
            agent = Agent(server.cfg, node.id, server.address)
            agent.start()
            agents.append(agent)
            clients.append(AgentClient(agent.local_api, timeout_s=60))
        yield {"agents": agents, "clients": clients, "operator": operator}
    finally:
        for c in clients:
            c.close()
        for a in agents:
            a.close()
        operator.close()
        server.stop()
        tb.close()


def _exact(clients: list[AgentClient], arrays: list[np.ndarray]) -> list[Any]:
    outs = allreduce_all(clients, arrays)[1]
    exact = np.sum(arrays, axis=0)
    return [o for o in outs if not (isinstance(o, np.ndarray) and np.array_equal(o, exact))]


def test_a_late_agent_leaves_the_ended_job_for_the_live_one(bed: dict[str, Any]) -> None:
    agents, clients, operator = bed["agents"], bed["clients"], bed["operator"]
    rng = np.random.default_rng(3)
    arrays = [rng.integers(-1000, 1000, 4096).astype(np.int32) for _ in clients]
    old = operator.submit("old", [], "ring", "optical")
    for _ in range(2):  # the second call runs on the standing schedule: agents agree alone
        assert _exact(clients, arrays) == []

    late = agents[0]
    held: list[tuple[str, Any]] = []
    deliver = {"on_ended": late.on_ended, "on_assigned": late.on_assigned}
    late.on_ended = lambda event: held.append(("on_ended", event))  # type: ignore[method-assign]
    late.on_assigned = lambda event: held.append(("on_assigned", event))  # type: ignore[method-assign]
    operator.cancel(old["id"])
    new = operator.submit("new", [], "ring", "ideal")

    result: dict[str, list[Any]] = {}
    caller = threading.Thread(target=lambda: result.setdefault("bad", _exact(clients, arrays)))
    caller.start()
    deadline = time.monotonic() + 30
    runner = late.runner
    # inside the old job's ready exchange (private state read for the test's only wait)
    while not (runner._running.is_set() and runner._current_job == old["id"]):
        assert time.monotonic() < deadline, "the late agent never entered the old job"
        time.sleep(0.005)
    assert ("on_ended", old["id"]) in {(n, getattr(e, "job_id", "")) for n, e in held}
    late.on_ended, late.on_assigned = deliver["on_ended"], deliver["on_assigned"]
    for name, event in held:
        deliver[name](event)
    caller.join(90)

    assert not caller.is_alive()
    assert result["bad"] == []
    # the late agent ran the call as the new job's collective, as its peers did
    assert late.jobs.jobs[new["id"]].next_seq == agents[1].jobs.jobs[new["id"]].next_seq
    assert late.jobs.jobs[old["id"]].ended
