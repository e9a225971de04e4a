"""Point-to-point flows: send and recv on their own circuits (oddl.agents.point_to_point, oddl.controller.flows).

The pure book first (windows never overlap on a transmitter or a receiver, numbers only
grow, also across a restart), then real processes on loopback as `tests/e2e/test_e2e.py` runs
them: emulators, controller, four agents, on the emulated optical fabric (where a chunk
arrives only if the light reaches the receiver) and on direct links.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import pytest
from helpers import EMULATED

from oddl.agents.agent_jobs import AgentJob
from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import collective_all
from oddl.agents.point_to_point import MAX_LEAD_S, Flows, next_lead_s
from oddl.agents.slot_gate import SlotGate
from oddl.common.config import load_testbed
from oddl.common.errors import CollectiveError, OperationRefused
from oddl.controller.flow_book import MAX_NUMBER, FlowBook, FlowNumbersExhausted, next_number
from oddl.controller.flows import FlowDesk
from oddl.controller.testbed_model import timing_from_config, topology_from_config
from oddl.launch.testbed import RunningTestbed, write_config
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc


# ---- the book ------------------------------------------------------------------------------
def test_windows_never_overlap_on_a_transmitter_or_a_receiver():
    book = FlowBook()
    a = book.book(("j", "n0", "n2", 0), "tx0", "n2", 10.0, 1.0, 0.1, 0.0)
    assert (a.t0_s, a.end_s) == (10.0, 11.0)
    # another sender into the same receiver waits for it (and the margin)
    b = book.book(("j", "n1", "n2", 0), "tx1", "n2", 10.0, 2.0, 0.1, 0.0)
    assert b.t0_s == pytest.approx(11.1)
    # the first sender to another receiver waits for its transmitter
    c = book.book(("j", "n0", "n3", 0), "tx0", "n3", 10.5, 1.0, 0.1, 0.0)
    assert c.t0_s == pytest.approx(11.1)
    # a pair on free devices goes at once
    d = book.book(("j", "n3", "n1", 0), "tx3", "n1", 10.0, 1.0, 0.1, 0.0)
    assert d.t0_s == 10.0
    assert book.transmitter_free_at("tx0") == pytest.approx(12.2)
    assert book.transmitter_free_at("tx9") == 0.0


def test_flow_numbers_only_grow_even_after_a_restart():
    book = FlowBook()
    numbers = [book.book(("j", "n0", "n1", 5), "tx0", "n1", 0.0, 0.0, 0.0, 0.002).number
               for _ in range(3)]
    assert numbers == [3, 4, 5]  # at least the job's age in ms, then one more each
    # other tags and pairs count on their own
    assert book.book(("j", "n0", "n1", 6), "tx0", "n1", 0.0, 0.0, 0.0, 0.002).number == 3
    # a controller restarted 1 s into the job has forgotten `last`: its numbers are above
    assert FlowBook().book(("j", "n0", "n1", 5), "tx0", "n1", 0.0, 0.0, 0.0, 1.0).number > 5
    assert next_number(0, 0.0) == 1
    book.forget_job("j")
    assert book.book(("j", "n0", "n1", 5), "tx0", "n1", 0.0, 0.0, 0.0, 0.0).number == 1
    with pytest.raises(FlowNumbersExhausted, match="submit it again"):
        next_number(MAX_NUMBER, 1.0)


def test_a_window_opens_no_sooner_than_the_lead_its_sender_asked_for():
    cfg = load_testbed(EMULATED)
    # the ideal network moves no laser, so the desk needs no devices
    desk = FlowDesk(cfg, topology_from_config(cfg), timing_from_config(cfg),
                    cast(Any, None), lambda why: None)

    def grant(src: str, dst: str, lead_us: int) -> float:
        return desk.grant(pb.RequestFlowRequest(node_id=src, job_id="j", dst=dst,
                                                message_bytes=8, lead_us=lead_us),
                          "j", "ideal", time.time_ns()).t0_ns / 1e9

    before = time.time()
    assert grant("n0", "n1", 250_000) >= before + 0.25
    assert before <= grant("n2", "n3", 0) <= time.time()  # free devices, no lead: at once


# ---- a sender late for its window ---------------------------------------------------------
class _Grants:
    """A controller link that grants windows starting at the given times (wall clock)."""

    def __init__(self, starts: list[float]):
        self.starts = starts
        self.asked = 0
        self.leads: list[float] = []
        self.clock = type("Clock", (), {"offset_s": 0.0})()

    def request_flow(self, job_id: str, dst: str, message_bytes: int, tag: int,
                     timeout_s: float, lead_s: float) -> pb.FlowGrant:
        t0 = self.start(lead_s)
        self.asked += 1
        self.leads.append(lead_s)
        return pb.FlowGrant(flow=100 + self.asked, t0_ns=round(t0 * 1e9), hold_s=1e-5)

    def start(self, lead_s: float) -> float:
        return self.starts[self.asked]


class _SlowReplies(_Grants):
    """Grants whose reply reaches the sender `delay_s` after the window opened as asked
    (a loaded host where a grant's round trip alone outlasts the margin, every time)."""

    def __init__(self, delay_s: float):
        super().__init__([])
        self.delay_s = delay_s

    def start(self, lead_s: float) -> float:
        return time.time() + lead_s - self.delay_s


def test_a_sender_late_for_its_window_asks_for_another_and_sends_nothing_in_it():
    # the next sender into the same receiver may start a margin after this window's start:
    # a sender that only gets going later would collide with it, so it leaves the window
    # unused (its number is never sent; the receiver skips it) and asks again
    # (a margin of 5 s: the first window began 10 s ago, the second 1 s ago, so neither
    # outcome hangs on how fast a loaded machine wakes this thread)
    job = AgentJob("job-1", ("n0", "n1"), 0, "optical", "ring")
    now = time.time()
    grants = _Grants([now - 10.0, now - 1.0])
    flows = Flows("n0", grants, None, SlotGate(), margin_s=5.0)
    assert flows._window(job, "n1", 40, 0, 5.0, [job], optical=True) == 102
    assert (grants.asked, flows.missed_windows) == (2, 1)
    # on the ideal network there is no light to collide: the first grant serves
    assert Flows("n0", _Grants([now - 0.5]), None, SlotGate(), margin_s=0.7e-3)._window(
        job, "n1", 40, 0, 5.0, [job], optical=False) == 101
    # a host that misses every window gives the flow up, naming the cause and the fix
    late = Flows("n0", _Grants([now - 1.0] * 20), None, SlotGate(), margin_s=0.7e-3)
    with pytest.raises(CollectiveError, match="missed 10 windows in a row.*slot_margin_us"):
        late._window(job, "n1", 40, 0, 5.0, [job], optical=True)


def test_a_sender_whose_grants_always_arrive_late_asks_its_windows_ahead():
    # every reply arrives 0.2 s after the window it grants opens, twice the margin: a sender
    # that only asked again would miss all ten; this one asks the next window to open
    # further ahead than it was late, waits for it, and keeps it (0.1 s of margin for its
    # wake-up, so a loaded machine does not decide the outcome)
    job = AgentJob("job-1", ("n0", "n1"), 0, "optical", "ring")
    grants = _SlowReplies(0.2)
    flows = Flows("n0", grants, None, SlotGate(), margin_s=0.1)
    assert flows._window(job, "n1", 40, 0, 5.0, [job], optical=True) == 102
    assert flows.missed_windows == 1 and grants.leads[0] == 0.0
    assert grants.leads[1] >= 0.4  # twice the lateness
    # the lead it learned carries to its next flow, which keeps its first window
    assert flows._window(job, "n1", 40, 0, 5.0, [job], optical=True) == 103
    assert (grants.asked, flows.missed_windows) == (3, 1)
    assert grants.leads[2] > 0.2  # still ahead of the replies' delay, though less than 0.4
    assert grants.leads[2] < grants.leads[1]


def test_the_lead_grows_with_each_miss_and_gives_slack_back():
    assert next_lead_s(0.0, 0.003, 0.0) == pytest.approx(0.006)
    assert next_lead_s(0.006, 0.001, 0.0) == pytest.approx(0.014)
    assert next_lead_s(0.4, 0.2, 0.0) == MAX_LEAD_S  # never past what the controller takes
    assert next_lead_s(0.010, None, 0.004) == pytest.approx(0.008)  # kept, 4 ms to spare
    assert next_lead_s(0.001, None, 0.010) == 0.0
    assert next_lead_s(0.010, None, -0.0002) == 0.010  # kept, though a little late


# ---- end to end ----------------------------------------------------------------------------
N = 4


@pytest.fixture(scope="module", params=["fabric", "direct"])
def testbed(request, tmp_path_factory) -> Iterator[tuple[RunningTestbed, str]]:
    tmp = tmp_path_factory.mktemp(f"p2p-{request.param}")
    path = EMULATED if request.param == "fabric" else write_config(
        EMULATED, Path(tmp) / "direct.toml", {'link = "fabric"': 'link = "direct"'})
    with RunningTestbed(tmp, path) as tb:
        job = tb.operator.submit(f"p2p-{request.param}", [], "ring", "optical")["id"]
        yield tb, job


def _channel_of(tb: RunningTestbed, node: str) -> int:
    """The channel `node`'s transmitter reports now (read back from the device)."""
    tx = next(n["transmitter"] for n in tb.operator.topology()["nodes"] if n["id"] == node)
    return int(next(d["channel"] for d in tb.operator.devices()["devices"] if d["id"] == tx))


def _rx_channel(tb: RunningTestbed, node: str) -> int:
    return int(next(n["rx_channel"] for n in tb.operator.topology()["nodes"] if n["id"] == node))


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_send_arrives_exactly_on_a_circuit_made_for_it(testbed):
    tb, job = testbed
    c = tb.clients
    rng = np.random.default_rng(3)
    for dtype, n in (("<f8", 3_000_000), ("<i4", 7), ("<u2", 1)):  # > and < one chunk
        data = rng.integers(0, 1000, n).astype(dtype)
        c[0].send(data, 2, job=job)
        assert _channel_of(tb, "n0") == _rx_channel(tb, "n2")  # the circuit n0 -> n2
        out = np.zeros_like(data)
        assert c[2].recv(out, 0, job=job) is out
        assert np.array_equal(out, data), dtype
    status = c[0].status()
    assert status["flows_sent"] >= 3 and status["flows_that_retuned"] >= 1, status
    assert c[2].status()["flows_received"] >= 3
    # the ring's standing schedule assumed n0 -> n1: the next all-reduce is exact anyway
    xs = [np.full(1000, r + 1.0) for r in range(N)]
    for _ in range(2):
        outs = collective_all(c, lambda cl, r: cl.allreduce(xs[r], job=job))[1]
        assert all(np.array_equal(o, np.full(1000, 10.0)) for o in outs), outs


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_receives_posted_first_pair_in_order_per_sender_and_tag(testbed):
    tb, job = testbed
    c = tb.clients
    # a ring exchange with every receive posted before the sends: no deadlock (a client is
    # one socket, used by one thread: the receives have their own, as the torch backend's)
    got: dict[int, Any] = {}
    receivers = [AgentClient(client.address) for client in c]

    def receive(r: int) -> None:
        try:
            got[r] = [receivers[r].recv(np.empty(5, np.int64), (r - 1) % N, tag=t,
                                        job=job).copy() for t in (1, 2)]
        except Exception as exc:  # handed to the test
            got[r] = exc
        finally:
            receivers[r].close()
    threads = [threading.Thread(target=receive, args=(r,)) for r in range(N)]
    for t in threads:
        t.start()
    for tag in (2, 1):  # sent in the other order: each tag is a stream of its own
        collective_all(c, lambda cl, r, tag=tag: cl.send(np.full(5, 10 * r + tag), (r + 1) % N,
                                                         tag=tag, job=job))
    for t in threads:
        t.join(60)
    for r in range(N):
        left = (r - 1) % N
        assert not isinstance(got[r], Exception), got[r]
        assert [a.tolist() for a in got[r]] == [[10 * left + 1] * 5, [10 * left + 2] * 5]
    # a receive from any rank takes each flow whole and names its sender
    for r in (0, 2, 3):
        c[r].send(np.full(4, r), 1, tag=12, job=job)
    seen = []
    for _ in range(3):
        out, src = c[1].recv_any(np.empty(4, np.int64), tag=12, job=job)
        seen.append((src, out.tolist()))
    assert sorted(seen) == [(r, [r] * 4) for r in (0, 2, 3)]
    # two flows on one pair and tag arrive in the order sent
    for k in range(3):
        c[3].send(np.full(2, k), 1, tag=9, job=job)
    assert [c[1].recv(np.empty(2, np.int64), 3, tag=9, job=job)[0] for _ in range(3)] == [0, 1, 2]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_bad_sends_and_receives_name_the_fix_and_lose_nothing(testbed):
    tb, job = testbed
    c = tb.clients
    with pytest.raises(OperationRefused, match="another rank"):
        c[1].send(np.ones(3), 1, job=job)
    with pytest.raises(OperationRefused, match="peer 7 is not a rank"):
        c[1].send(np.ones(3), 7, job=job)
    with pytest.raises(OperationRefused, match="not part of job"):
        c[1].send(np.ones(3), 2, job="job-999")
    # a receive of another shape fails naming both, and the next flow is taken whole
    c[0].send(np.arange(6.0), 3, tag=4, job=job)
    with pytest.raises(CollectiveError, match="sent 48 B of <f8 .* takes 40 B of <f8"):
        c[3].recv(np.empty(5), 0, tag=4, job=job)
    c[0].send(np.arange(5.0), 3, tag=4, job=job)
    assert c[3].recv(np.empty(5), 0, tag=4, job=job).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    # a flow one session left unreceived never pairs with another session's receive
    c[2].send(np.full(3, 7.0), 0, session="run-a", job=job)
    with pytest.raises(CollectiveError, match="nothing from n2 on tag 0"):
        c[0].recv(np.empty(3), 2, session="run-b", job=job, timeout_s=0.5)
    assert c[0].recv(np.empty(3), 2, session="run-a", job=job).tolist() == [7.0] * 3
    with pytest.raises(OperationRefused, match="session 'a b' is not"):
        c[0].send(np.ones(1), 2, session="a b", job=job)
    # nobody sends: the receive ends at its timeout, naming the peer
    with pytest.raises(CollectiveError, match="nothing from n2 on tag 3"):
        c[1].recv(np.empty(2), 2, tag=3, job=job, timeout_s=0.5)
    # the agents took no harm: a collective still runs exactly
    outs = collective_all(c, lambda cl, r: cl.allreduce(np.full(8, r), job=job))[1]
    assert all(np.array_equal(o, np.full(8, 6)) for o in outs), outs


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_the_controller_refuses_a_flow_it_cannot_grant(testbed):
    tb, job = testbed
    stub = pb_grpc.ControllerStub(grpc.insecure_channel(tb.address))
    cases = {("n0", job, "n0", 8): "must be another node of job",
             ("n0", job, "n9", 8): "must be another node of job",
             ("n0", "job-999", "n1", 8): "is not running",
             ("n0", job, "n1", 0): "send 1 B",
             ("n0", job, "n1", 8, 1_000_001): "ask for at most 1000000 us"}
    for (node, job_id, dst, nbytes, *lead_us), why in cases.items():
        with pytest.raises(grpc.RpcError) as err:
            stub.RequestFlow(pb.RequestFlowRequest(node_id=node, job_id=job_id, dst=dst,
                                                   message_bytes=nbytes,
                                                   lead_us=sum(lead_us)), timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert why in err.value.details()


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_relay_transport_refuses_flows_naming_the_one_that_carries_them(tmp_path):
    path = write_config(EMULATED, tmp_path / "relay.toml",
                        {'link = "fabric"': 'link = "fabric"\ntransport = "relay"'})
    with RunningTestbed(tmp_path, path) as tb:
        job = tb.operator.submit("p2p-relay", [], "ring", "optical")["id"]
        with pytest.raises(OperationRefused, match='transport = "streams" for point-to-point'):
            tb.clients[0].send(np.ones(4), 1, job=job)
        with pytest.raises(OperationRefused, match="a receive from any rank needs"):
            tb.clients[1].recv_any(np.ones(4), job=job)
        outs = collective_all(tb.clients, lambda cl, r: cl.allreduce(np.full(4, r), job=job))[1]
        assert all(np.array_equal(o, np.full(4, 6)) for o in outs), outs  # collectives still go
