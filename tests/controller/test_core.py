"""The controller's core (`oddl.controller.core`) on its own: request messages in, events out.

No gRPC and no agents: the core is driven with the requests the servicer would hand it, and
what it pushes is read from the registered nodes' event queues. Below it, the real
`DeviceManager` drives the emulated lasers and WSS, so a ring job's admission configures the
devices and its collectives start on circuits already in place (no slot executor thread).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from core_parts import NODES, events, go_of, ready, register_all
from helpers import EMULATED

from oddl.common.config import load_testbed
from oddl.common.errors import OperationRefused
from oddl.controller.announcer import Announcer
from oddl.controller.core import ControllerCore
from oddl.controller.devices import DeviceManager
from oddl.controller.jobs import JobRecord
from oddl.controller.server import default_configuration
from oddl.controller.store import Store
from oddl.drivers.emulators.host import start_emulated_testbed
from oddl.protos import oddl_pb2 as pb
from oddl.protos.schedule_wire import schedule_sha256


@pytest.fixture(scope="module")
def devices() -> Iterator[DeviceManager]:
    tb = start_emulated_testbed(load_testbed(EMULATED))
    for wss in tb.switches.values():
        wss.settle_s = 0.005
    dm = DeviceManager(tb.resolved)
    dm.connect()
    dm.initialise(default_configuration(tb.resolved))
    yield dm
    dm.close()
    tb.close()


@pytest.fixture
def core(devices: DeviceManager) -> Iterator[ControllerCore]:
    c = ControllerCore(devices.cfg, devices, store=Store(":memory:"))
    register_all(c)
    yield c
    c.close()


def _ring(core: ControllerCore) -> JobRecord:
    job = core.submit(pb.SubmitJobRequest(name="t", collective="ring"))
    for n in NODES:
        (event,) = events(core, n)
        assert event.assigned.job.id == job.id and event.assigned.rank == NODES.index(n)
    return job


def test_a_complete_barrier_pushes_one_go_to_every_node(core: ControllerCore):
    job = _ring(core)
    for n in NODES[:-1]:
        ready(core, job.id, 1, n, [1000])
    assert all(events(core, n) == [] for n in NODES)  # the barrier waits for n3
    ready(core, job.id, 1, "n3", [1000])
    gos = [go_of(core, n) for n in NODES]
    # the same start, each node with its own part of the schedule (decision record 0034)
    assert len({(g.job_id, g.seq, g.t0_ns) for g in gos}) == 1
    assert [g.schedule.node_id for g in gos] == list(NODES)
    assert len({g.schedule.whole_sha256 for g in gos}) == 1
    go = gos[0]
    assert (go.job_id, go.seq, go.error) == (job.id, 1, "")
    assert go.schedule.n_elems == 1000 and go.t0_ns > 0
    assert not core.slots.retuning()  # ring keeps the circuits admission made
    assert job.last_seq == 1 and job.guard_time_s == go.schedule.guard_total_s
    assert core.store is not None and core.store.jobs()[0]["last_seq"] == 1


def test_a_bucket_through_the_barrier_again_reuses_its_nodes_parts(core: ControllerCore):
    job = _ring(core)
    gos = []
    for seq in (1, 2):
        for n in NODES:
            ready(core, job.id, seq, n, [1000])
        gos.append({n: go_of(core, n) for n in NODES})
    assert [g["n2"].seq for g in gos] == [1, 2]
    assert gos[0]["n2"].schedule == gos[1]["n2"].schedule  # the same part, built once
    wire = core.schedules.wire(job, 1000, 4, "all_reduce", 0, core._node_channels(job))
    parts = core.schedules.parts(job, wire)
    assert parts is core.schedules.parts(job, wire)
    assert parts["n2"] == gos[1]["n2"].schedule and parts["n2"].node_id == "n2"


def test_mismatched_readies_are_refused_with_the_reason_at_every_node(core: ControllerCore):
    job = _ring(core)
    for n, step in zip(NODES, (9, 9, 3, 9), strict=True):
        ready(core, job.id, 1, n, [1000], step=step)
    for n in NODES:
        go = go_of(core, n)
        assert "collective 1 of job job-1 refused" in go.error and "n2 at step 3" in go.error
        assert dict(go.caller_steps) == {"n0": 9, "n1": 9, "n2": 3, "n3": 9}
    for n, shape in zip(NODES, ([10], [10], [10], [11]), strict=True):
        ready(core, job.id, 2, n, shape)
    assert "different arrays" in go_of(core, "n0").error
    with pytest.raises(OperationRefused, match="node n9 is not part of job job-1"):
        ready(core, job.id, 3, "n9", [10])


def test_a_dead_node_abandons_the_waiting_barrier_once(core: ControllerCore):
    job = _ring(core)
    for n in NODES[:-1]:
        ready(core, job.id, 1, n, [1000])
    core.registry.agents["n3"].last_seen -= 100  # it beat, then was silent for 100 s
    core.registry.agents["n3"].beaten = True
    core.sweep(time.monotonic())
    core.sweep(time.monotonic())  # already dead: nothing more
    assert core.errors["agent lost"] == 1
    for n in NODES[:-1]:
        go, lost = events(core, n)
        assert go.go.seq == 1 and "collective 1 of job job-1 abandoned: node n3" in go.go.error
        assert lost.peer_lost.node_id == "n3"
    assert events(core, "n3") == []  # the dead node is not told
    assert core.barriers.waiting(job.id) == []
    # n3's late ready for the abandoned collective is refused at once, at every node
    ready(core, job.id, 1, "n3", [1000])
    assert all("already abandoned" in go_of(core, n).error for n in NODES)
    # a new collective with n3 still dead ends at its first ready, once
    ready(core, job.id, 2, "n0", [1000])
    for n in NODES:
        go = go_of(core, n)
        assert go.seq == 2 and "node n3 stopped answering (no heartbeat)" in go.error
    ready(core, job.id, 2, "n1", [1000])
    assert all("already abandoned" in go_of(core, n).error for n in NODES)


def test_a_standing_start_runs_only_on_the_schedule_the_controller_would_send(
        core: ControllerCore):
    job = _ring(core)
    ours = schedule_sha256(core.schedule_pb(job.id, 4000, 4))

    def start(seq: int, node: str, digest: bytes) -> None:
        core.start_standing(pb.StartStandingRequest(
            node_id=node, job_id=job.id, seq=seq, t0_ns=time.time_ns(), message_bytes=4000,
            itemsize=4, schedule_sha256=digest))

    start(5, "n0", ours)
    start(5, "n1", ours)  # another agent's copy
    assert job.last_seq == 5 and not core.errors
    assert all(events(core, n) == [] for n in NODES)
    start(6, "n2", b"\0" * 32)
    for n in NODES:
        (event,) = events(core, n)
        assert "standing start refused: the devices no longer match" in \
            event.circuits_ready.error
    assert core.errors == {"standing start refused": 1}
    with pytest.raises(OperationRefused, match="in items of 3 B"):
        core.start_standing(pb.StartStandingRequest(node_id="n0", job_id=job.id, seq=7,
                                                    message_bytes=4000, itemsize=3))


def test_retunes_are_counted_into_the_job_under_the_lock(core: ControllerCore):
    job = _ring(core)
    with core.lock:  # the executor's report waits for the lock
        t = threading.Thread(target=core.retuned, args=(job.id, 2))
        t.start()
        t.join(0.2)
        assert t.is_alive() and job.reconfigurations == 0
    t.join(5)
    assert job.reconfigurations == 2
    core.retuned("job-99", 1)  # a job the core does not know: nothing to count


def test_cancel_clears_the_barriers_and_tells_the_nodes(core: ControllerCore):
    job = _ring(core)
    ready(core, job.id, 1, "n0", [1000])
    ready(core, job.id, 1, "n1", [1000])
    assert core.barriers.waiting(job.id) == [1]
    core.cancel(job.id)
    assert core.barriers.waiting(job.id) == []
    for n in NODES:
        (event,) = events(core, n)
        assert event.ended.job_id == job.id and event.ended.reason == "cancelled by the operator"
    with pytest.raises(OperationRefused, match="job job-1 is cancelled"):
        ready(core, job.id, 1, "n2", [1000])
    assert core.store is not None and core.store.jobs()[0]["state"] == "cancelled"


def test_a_restarted_core_reads_its_jobs_back_and_numbers_after_them(devices: DeviceManager):
    store = Store(":memory:")
    first = ControllerCore(devices.cfg, devices, store=store)
    job, _ = first.admit("a", [], "ring", "ideal", {}, 0)
    again = ControllerCore(devices.cfg, devices, store=store)
    assert again.jobs.get(job.id).to_doc() == job.to_doc()
    with pytest.raises(OperationRefused, match=f"already run job {job.id}"):
        again.admit("b", [], "ring", "ideal", {}, 0)
    again.cancel(job.id)
    assert again.admit("b", [], "ring", "ideal", {}, 0)[0].id == "job-2"


def test_an_agent_back_from_the_dead_is_announced_to_its_peers(core: ControllerCore):
    job = _ring(core)
    sessions = {n: core.registry.agents[n].session for n in NODES}
    core.registry.agents["n1"].dead = True
    assert core.heartbeat(pb.HeartbeatRequest(node_id="n1", session=sessions["n1"]))
    assert not core.registry.agents["n1"].dead
    core.announcer.settle()  # the end of the announcer's window (ADR 0032)
    for n in NODES:  # its peers learn it is back (and it hears its job again, harmlessly)
        (event,) = events(core, n)
        assert event.assigned.job.id == job.id
    assert core.heartbeat(pb.HeartbeatRequest(node_id="n1", session=sessions["n1"]))
    assert events(core, "n0") == []  # a live node's heartbeat announces nothing
    assert not core.heartbeat(pb.HeartbeatRequest(node_id="n1", session="stale"))
    # a new stream gets its running jobs' assignments first
    opened = core.open_stream("n2")
    assert opened is not None and events(core, "n2")[0].assigned.rank == 2


def test_a_burst_of_registrations_is_announced_once_per_node(core: ControllerCore):
    """Every agent re-registering (a controller restart) announces the job's peers once to
    each node, with every new address, not once per registration (ADR 0032)."""
    job = _ring(core)
    core.announcer.close()  # a window that does not end by itself here: flushed below
    core.announcer = Announcer(core._announce, quiet_s=3600, longest_s=3600)
    for n in NODES:
        core.register(pb.RegisterAgentRequest(node_id=n, data_address=f"tcp://{n}:1"))
    assert all(events(core, n) == [] for n in NODES)  # gathered, not yet announced
    core.announcer.settle()  # the window's end
    for n in NODES:
        (event,) = events(core, n)
        assert event.assigned.job.id == job.id and event.assigned.rank == NODES.index(n)
        assert dict(event.assigned.peers) == {m: f"tcp://{m}:1" for m in NODES}


def test_an_unread_queue_keeps_only_the_newest_assignment(core: ControllerCore):
    """A node whose stream does not read holds one assignment per job, the newest, in the
    place of the first; other events keep their order."""
    job = _ring(core)
    core.cancel(job.id)
    for n in NODES:
        events(core, n)
    second = core.submit(pb.SubmitJobRequest(name="t2", collective="ring"))
    core.sweep(time.monotonic())  # nobody is late: nothing pushed
    for k in range(3):
        core.register(pb.RegisterAgentRequest(node_id="n1", data_address=f"tcp://n1:{k}"))
        core.announcer.settle()
    got = events(core, "n0")
    assert [e.WhichOneof("event") for e in got] == ["assigned"]
    assert got[0].assigned.job.id == second.id
    assert got[0].assigned.peers["n1"] == "tcp://n1:2"


def test_a_stream_opened_before_a_registration_marks_the_new_record(core: ControllerCore):
    """An agent that registers again while its stream opens (a heartbeat told it to) is
    still streaming: the mark goes on the node's current record, not the one the stream
    was opened with."""
    import asyncio

    opened = core.open_stream("n0")
    assert opened is not None
    core.register(pb.RegisterAgentRequest(node_id="n0"))  # a new record for n0

    async def started() -> bool:
        stream = core.registry.stream(*opened, threading.Event())
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the stream runs until it parks on the empty queue
        streaming = core.registry.agents["n0"].streaming
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await stream.aclose()
        return streaming

    assert asyncio.run(started())
    assert not core.registry.agents["n0"].streaming  # and unmarked when it ends


def test_a_restarted_agent_fails_its_peers_collective_at_once(core: ControllerCore):
    """A new agent process registering for a node (a restarted rank) is not the same agent
    registering again: its peers are told at once, and a barrier they wait in fails there
    with that reason, rather than at their timeout."""
    for n in NODES:
        core.register(pb.RegisterAgentRequest(node_id=n, instance=f"{n}-a"))
    job = _ring(core)
    for n in ("n0", "n2"):
        ready(core, job.id, 1, n, [8])
    core.register(pb.RegisterAgentRequest(node_id="n1", instance="n1-a"))  # the same process
    # (its peers may hear their job again once the announcer's window ends; nothing else)
    assert all(_kinds(core, n) <= {"assigned"} for n in NODES)
    core.register(pb.RegisterAgentRequest(node_id="n1", instance="n1-b"))  # a new one
    for n in ("n0", "n2", "n3"):
        got = {e.WhichOneof("event"): e for e in events(core, n)}
        assert "restarted" in got["peer_lost"].peer_lost.reason
        assert got["peer_lost"].peer_lost.node_id == "n1"
        if n != "n3":  # in the barrier: its collective fails now, with the reason
            assert "restarted" in got["go"].go.error and got["go"].go.seq == 1
    assert _kinds(core, "n1") <= {"assigned"}  # the restarted agent is not told of itself
    assert core.errors["agent restarted"] == 1


def _kinds(core: ControllerCore, node: str) -> set[str]:
    return {e.WhichOneof("event") for e in events(core, node)}


def test_a_mass_loss_is_news_only_to_the_live(core: ControllerCore):
    """Nodes declared dead in the same sweep are not told of one another (a thousand lost
    at once would be a million events for streams nobody reads)."""
    _ring(core)
    later = time.monotonic() + 10 * core.cfg.controller.heartbeat_s
    for n in ("n0", "n1"):
        core.registry.agents[n].last_seen = later  # they beat; n2 and n3 fell silent
    core.sweep(later)
    for n in ("n0", "n1"):  # one event each for both losses (decision record 0034)
        (lost,) = [e.peer_lost for e in events(core, n) if e.HasField("peer_lost")]
        assert sorted([lost.node_id, *lost.also]) == ["n2", "n3"]
        assert all("stopped answering" in r for r in [lost.reason, *lost.also.values()])
    assert all(_kinds(core, n) <= {"go"} for n in ("n2", "n3"))
