"""Hand-offs: which arrivals must be confirmed before a circuit changes."""

from __future__ import annotations

from oddl.controller.scheduling import Grid, TimingModel, Topology, make_plan, schedule_plan
from oddl.protos.schedule_wire import confirmations_for, handoffs

TIMING = TimingModel(tune_s=1e-3, skew_s=1e-4, cdr_s=1e-5, command_s=1e-3, wss_settle_s=0.1,
                     slot_margin_s=1e-4, line_rate_bps=10e9)


def _pairs(collective: str, n: int = 4, **params):
    topo = Topology.single_wss(n, Grid(193.1, 100.0, 48))
    plan = make_plan(collective, n, 1000, **params)
    nodes = topo.node_ids
    # start from the channels of the first slot, as after admission
    first = schedule_plan(plan, nodes, topo, TIMING, 4)
    sched = schedule_plan(plan, nodes, topo, TIMING, 4, initial_channels=first.final_channels)
    return [(s.index, [(c.src, c.dst, bool(c.transmitter in {r.transmitter for r in s.retunes()}))
                       for c in s.circuits()]) for s in sched.slots]


def test_a_ring_never_changes_a_circuit():
    assert handoffs(_pairs("ring")) == {}


def test_halving_doubling_waits_for_the_last_flow_of_each_retuned_transmitter():
    needs = handoffs(_pairs("halving-doubling"))
    assert needs  # partners change between steps
    for slot, need in needs.items():
        assert all(j < slot for j, _src, _dst in need)
    # each node confirms what it received just before its partner's transmitter moved
    confirm = confirmations_for("node0", _pairs("halving-doubling"))
    assert confirm and all(src != "node0" for _j, src in confirm)


def test_a_receiver_hearing_a_new_sender_is_a_handoff():
    slots = [(0, [("a", "r", False)]), (1, [("b", "r", False)]), (2, [("b", "r", False)])]
    assert handoffs(slots) == {1: [(0, "a", "r")]}
    assert confirmations_for("r", slots) == {(0, "a")}


def test_a_retune_without_an_earlier_flow_still_needs_a_grant():
    assert handoffs([(0, [("a", "b", True)])]) == {0: []}


def test_the_encoder_carries_the_handoffs_and_the_receive_timeout():
    from oddl.protos.schedule_wire import decode_schedule, encode_schedule, wire_handoffs

    topo = Topology.single_wss(4, Grid(193.1, 100.0, 48))
    plan = make_plan("halving-doubling", 4, 1000)
    sched = schedule_plan(plan, topo.node_ids, topo, TIMING, 4)
    wire = encode_schedule(sched, "job-1", 0.25)
    assert wire.receive_timeout_s == 0.25
    pairs = [(s.index, [(c.src, c.dst, c.retune) for c in s.circuits]) for s in wire.slots]
    assert wire_handoffs(wire) == handoffs(pairs) != {}
    decoded = decode_schedule(wire)
    assert decoded.receive_timeout_s == 0.25
    assert {s.index for s in decoded.slots if s.changes_circuits} == set(handoffs(pairs))
    assert {(j, src) for s in decoded.slots for j, src, dst in s.handoffs
            if dst == "node0"} == confirmations_for("node0", pairs)
