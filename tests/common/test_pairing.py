"""Calls pair across ranks only when they are the same call: step numbers, agent generations.

An agent restart once paired a training process's step 51 with its peers' step 133 and
shifted every later call, without an error. What must hold: a collective whose ranks handed in
different calls fails on every rank with the story (`StepMismatch`), a request made to an
agent before it restarted is never run by the new one, and a loop that numbers its calls
itself carries on exactly once the agent is back.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from beds import Bench
from helpers import wait_until

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all
from oddl.common.errors import CollectiveError, StepMismatch, StepPassed
from oddl.common.pairing import passed_by, refusal, step_mismatch, step_passed
from oddl.controller.barriers import BarrierBook
from oddl.launch.testbed import agent_command

NODES = ("n0", "n1", "n2", "n3")


def test_steps_pair_when_equal_or_not_given():
    assert step_mismatch("j", 4, {"n0": 7, "n1": 7, "n2": 0}) == ""
    text = step_mismatch("j", 4, {"n0": 133, "n1": 51})
    assert "collective 4 of job j refused" in text and "n0 at step 133, n1 at step 51" in text


def test_a_rank_behind_another_is_told_it_was_passed():
    assert passed_by("n3", {"n0": 6, "n1": 7, "n2": 5, "n3": 5}) == ("n1", 7)
    assert passed_by("n1", {"n0": 6, "n1": 7, "n3": 5}) is None
    assert passed_by("n3", {"n0": 6, "n3": 0}) is None  # no number given: pairs with any
    assert step_passed("j", 4, "n0", {"n0": 3, "n1": 3}) == ""
    text = step_passed("j", 4, "n3", {"n0": 6, "n3": 5})
    assert "step 5" in text and "n0 is already at step 6" in text and "next step" in text
    assert type(refusal("n0", "j", 4, {}, "no schedule: x")) is CollectiveError


def test_the_controllers_barrier_refuses_calls_of_different_steps():
    barriers, job = BarrierBook(), "job-1"
    outcome = None
    for node, step in zip(NODES, (9, 9, 3, 9), strict=True):
        outcome = barriers.ready(job, len(NODES), 1, node, [10], "<f4", step)
    assert outcome is not None and "n2 at step 3" in outcome.error
    # each node learns the steps with the refusal: the one behind goes on, the others wait
    assert outcome.caller_steps == {"n0": 9, "n1": 9, "n2": 3, "n3": 9}
    behind = refusal("n2", job, 1, outcome.caller_steps, outcome.error)
    assert isinstance(behind, StepPassed) and "n0 is already at step 9" in str(behind)
    ahead = refusal("n0", job, 1, outcome.caller_steps, outcome.error)
    assert type(ahead) is StepMismatch and str(ahead) == outcome.error
    for node in NODES:
        outcome = barriers.ready(job, len(NODES), 2, node, [10], "<f4", 10)
    assert outcome is not None and not outcome.error and outcome.n_elems == 10


@pytest.fixture
def bench(tmp_path):
    b = Bench(tmp_path)
    yield b
    b.close()


def _agent_at(bench: Bench, node: str, socket_path: Path) -> None:
    """(Re)start a node's agent with its local API at a fixed path, as a lab's unit does."""
    bench.agent_info[node] = bench.group.start(f"agent-{node}", agent_command(
        bench.resolved, node, bench.address) + ["--local-api", f"ipc://{socket_path}"],
        timeout=60)


def _alive(bench: Bench) -> list[bool]:
    return [a["alive"] for a in bench.operator.status()["agents"]]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_an_agent_restart_never_pairs_different_training_steps(bench: Bench):
    bench.operator.submit("pairing", [], "ring", "optical")
    folder = Path(tempfile.mkdtemp(prefix="oddl-pair-"))
    socket_path = folder / "agent-n3.sock"
    trainers: dict[str, AgentClient] = {}
    try:
        # n3's agent listens where a lab's unit puts it, so its training process's client
        # outlives the agent's restarts, as it does on a lab host
        os.kill(bench.proc("agent-n3").proc.pid, signal.SIGKILL)
        wait_until(lambda: _alive(bench) == [True, True, True, False], 30, "n3 marked dead")
        _agent_at(bench, "n3", socket_path)
        wait_until(lambda: all(_alive(bench)), 30, "n3 back")
        trainers = {n: AgentClient(bench.agent_info[n]["local_api"], timeout_s=30)
                    for n in NODES}
        rng = np.random.default_rng(5)

        def call(nodes, step=None):
            arrays = [rng.integers(-1000, 1000, 3000) for _ in nodes]
            outs = allreduce_all([trainers[n] for n in nodes], arrays, step=step)[1]
            return arrays, outs

        arrays, outs = call(NODES)  # every rank's call 1
        assert all(np.array_equal(o, np.sum(arrays, axis=0)) for o in outs), outs
        # n3's agent dies while its training process computes; the others' call 2 fails
        os.kill(bench.proc("agent-n3").proc.pid, signal.SIGKILL)
        _, outs = call(("n0", "n1", "n2"))
        assert all(isinstance(o, CollectiveError) for o in outs), outs
        assert all("n3" in str(o) for o in outs), outs
        # the agent comes back at the same socket; n3's client is the same object
        _agent_at(bench, "n3", socket_path)
        wait_until(lambda: all(_alive(bench)), 30, "n3 back again")
        # the others go on to their call 3 and wait in it; n3 makes its call 2
        _behind_is_refused_then_pairs(trainers, rng)
        # a loop that numbers its calls (the training iteration) carries on exactly
        for step in (40, 41):
            arrays, outs = call(NODES, step=step)
            assert all(isinstance(o, np.ndarray) for o in outs), outs
            assert all(np.array_equal(o, np.sum(arrays, axis=0)) for o in outs)
        # n3 retries step 49 (its reply was lost) while the others are in step 50: n3 is told
        # it was passed, goes on with step 50, and that call pairs with theirs
        _behind_is_refused_then_pairs(trainers, rng, steps=(49, 50))
    finally:
        for client in trainers.values():
            client.close()
        shutil.rmtree(folder)  # the sockets the killed agents left


def test_a_node_declared_down_that_answers_again_is_announced_to_its_peers():
    # a link that was down: the node never restarts, its heartbeats resume; its peers wait
    # for it until the controller announces the job again (oddl.agents.agent_jobs: down cleared)
    from core_parts import events, register_all, unconnected_core

    from oddl.protos import oddl_pb2 as pb

    core = unconnected_core()
    job, _ = core.admit("x", [], "ring", "optical", {}, 0)
    sessions = register_all(core)
    core.announcer.settle()  # the registrations' own announcement, then quiet
    for n in NODES:
        events(core, n)
    core.registry.agents["n1"].dead = True
    assert core.heartbeat(pb.HeartbeatRequest(node_id="n1", session=sessions["n1"]))
    assert not core.registry.agents["n1"].dead
    assert any(e.action == "agent back" and e.device == "n1" for e in core.devices.events)
    core.announcer.settle()  # the announcer's thread may not have run yet
    for n in ("n0", "n2", "n3"):
        (event,) = events(core, n)
        assert event.assigned.job.id == job.id
    # the announcement lists every peer to every node of the job (decision record 0032)
    assert all(e.assigned.job.id == job.id for e in events(core, "n1"))
    # a heartbeat of a live node announces nothing
    assert core.heartbeat(pb.HeartbeatRequest(node_id="n1", session=sessions["n1"]))
    assert events(core, "n0") == []

def _behind_is_refused_then_pairs(trainers: dict[str, AgentClient],
                                  rng: np.random.Generator,
                                  steps: tuple[int, int] | None = None) -> None:
    """n3's call 2 is refused there, never paired with the others' waiting call 3; n3's next
    call (its call 3) pairs with theirs, exactly. With `steps` (behind, ahead) the calls carry
    those numbers, as a loop that retries a failed step numbers them."""
    behind, ahead = steps or (None, None)
    others = ("n0", "n1", "n2")
    arrays = [rng.integers(-1000, 1000, 3000) for _ in NODES]
    waiting: dict[str, object] = {}

    def other(i: int) -> None:
        try:
            waiting[NODES[i]] = trainers[NODES[i]].allreduce(arrays[i], step=ahead)
        except Exception as exc:  # handed to the test
            waiting[NODES[i]] = exc
    threads = [threading.Thread(target=other, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    with pytest.raises(StepPassed) as err:
        trainers["n3"].allreduce(rng.integers(-1000, 1000, 3000), step=behind)
    assert f"its step {behind or 2}" in str(err.value)
    assert f"already at step {ahead or 3}" in str(err.value)
    assert not any(isinstance(waiting.get(n), np.ndarray) for n in others)
    # n3's next call is its call 3: it pairs with the others' waiting call 3, exactly
    out = trainers["n3"].allreduce(arrays[3], step=ahead)
    for t in threads:
        t.join(60)
    exact = np.sum(arrays, axis=0)
    assert np.array_equal(out, exact)
    assert all(np.array_equal(waiting[n], exact) for n in others), waiting
