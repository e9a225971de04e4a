"""One controller for many agents (issue 35): more agents than the old server had threads
register, each holds its schedule stream, and every one gets what the controller pushes.

The agents are a `Fleet` (oddl/launch/fleet.py): the agent's real protocol over real gRPC
connections, one per node, without a data plane. The controller runs in this process on a
testbed of one-port hosts on circuit switches, without devices (nothing here retunes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from helpers import json_from_fresh_interpreter

from oddl.common.config import load_testbed
from oddl.controller.server import ControllerServer
from oddl.launch.fleet import Fleet
from oddl.launch.shapes import control_plane
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

AGENTS = 200  # far more than the 32 threads that used to cap the agents
PATIENCE_S = 240.0  # generous: the machine is shared; the assertions are about behaviour


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerServer]:
    path = Path(tmp_path_factory.mktemp("many")) / "control-plane.toml"
    path.write_text(control_plane(AGENTS), encoding="utf-8")
    srv = ControllerServer(load_testbed(path), "127.0.0.1:0", metrics_listen=None,
                           max_workers=4)  # a small pool: streams must not need threads
    srv.start(initialise_devices=False)
    yield srv
    srv.stop(0)


def _alive(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        status = pb_grpc.ControllerStub(channel).GetStatus(pb.GetStatusRequest(), timeout=30)
    return sum(1 for a in status.agents if a.alive)


async def _run(address: str) -> dict[str, object]:
    fleet = Fleet(address, [f"n{k}" for k in range(AGENTS)], heartbeat_s=1.0)
    await fleet.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PATIENCE_S
        alive = 0
        while loop.time() < deadline:  # every agent registered, streaming and beating
            alive = await loop.run_in_executor(None, _alive, address)
            if alive == AGENTS:
                break
            await asyncio.sleep(0.5)
        stub = pb_grpc.ControllerStub(next(iter(fleet.agents.values())).channel)
        # an operator call: the job of all of them, pushed to every stream
        job = await stub.SubmitJob(pb.SubmitJobRequest(
            name="all", nodes=list(fleet.agents), collective="ring", network="ideal"),
            timeout=60)
        assigned = await fleet.wait_all(
            lambda e: e.WhichOneof("event") == "assigned" and e.assigned.job.id == job.id,
            PATIENCE_S)
        ranks = {n: h.event.assigned.rank for n, h in assigned.items()}
        await fleet.ready_all(job.id, 1, [256])
        gone = await fleet.wait_all(
            lambda e: e.WhichOneof("event") == "go" and e.go.job_id == job.id, PATIENCE_S)
        errors = sorted({h.event.go.error for h in gone.values()})
        return {"alive": alive, "ranks": ranks, "errors": errors}
    finally:
        await fleet.close()


# the fleet runs in a process of its own, on its own event loop (as agents do)
FLEET = """
import asyncio, json, sys
sys.path[:0] = ["tests/controller", "tests/support"]
from test_many_agents import _run
print(json.dumps(asyncio.run(_run(sys.argv[1]))))
"""


def test_many_agents_register_and_all_hear_every_push(server: ControllerServer) -> None:
    got = json_from_fresh_interpreter(FLEET, server.address, timeout=3 * PATIENCE_S)
    assert got["alive"] == AGENTS  # every one registered, streams and beats
    assert sorted(got["ranks"].values()) == list(range(AGENTS))  # each heard its assignment
    assert got["errors"] == [""]  # and every one got the barrier's go, without an error
    status = server.service.core.status()
    assert {a.node_id for a in status.agents} == {f"n{k}" for k in range(AGENTS)}
