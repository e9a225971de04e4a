"""Each node's part of a schedule, as a go carries it (decision record 0034)."""

from __future__ import annotations

import pytest

from oddl.controller.scheduling import Grid, TimingModel, Topology, make_plan, schedule_plan
from oddl.protos.schedule_wire import (
    confirmations,
    continuing_slots,
    decode_schedule,
    encode_schedule,
    ends_where_it_starts,
    node_parts,
    retunes,
    schedule_sha256,
)

TIMING = TimingModel(tune_s=1e-3, skew_s=1e-4, cdr_s=1e-5, command_s=1e-3, wss_settle_s=0.1,
                     slot_margin_s=1e-4, line_rate_bps=10e9)


def _whole(collective: str, n: int):
    topo = Topology.single_wss(n, Grid(193.1, 50.0, 64))
    nodes = tuple(topo.node_ids)
    plan = make_plan(collective, n, 64 * n)
    return nodes, encode_schedule(schedule_plan(plan, nodes, topo, TIMING, 4), "job-1", 1.0)


@pytest.mark.parametrize("collective", ["halving-doubling", "ring", "wrht"])
def test_a_part_holds_what_its_node_does_and_what_only_the_whole_tells(collective):
    nodes, whole = _whole(collective, 16)
    parts = node_parts(whole, nodes)
    decoded = decode_schedule(whole)
    assert retunes(whole) or collective == "ring"
    for rank, (node, part) in enumerate(parts.items()):
        assert part.node_id == node and not whole.node_id
        assert schedule_sha256(part) == schedule_sha256(whole)
        assert retunes(part) == retunes(whole)
        assert ends_where_it_starts(part) == ends_where_it_starts(whole)
        mine = decode_schedule(part)
        assert confirmations(mine.slots, node) == confirmations(decoded.slots, node)
        assert continuing_slots(mine.slots) == continuing_slots(decoded.slots) & {
            s.index for s in mine.slots}
        for k, (step, of_whole) in enumerate(zip(mine.steps, decoded.steps, strict=True)):
            assert {(s, d, o, n) for s, d, o, n in zip(step.src, step.dst, step.offset,
                                                       step.length, strict=True)} == {
                (s, d, o, n) for s, d, o, n in zip(of_whole.src, of_whole.dst, of_whole.offset,
                                                   of_whole.length, strict=True)
                if rank in (s, d)}, (node, k)
    # every circuit of the whole is in its sender's and its receiver's part, and no other
    for slot in whole.slots:
        for c in slot.circuits:
            holders = {n for n, p in parts.items() for s in p.slots if s.index == slot.index
                       and c in s.circuits}
            assert holders == {c.src, c.dst}


def test_the_parts_of_a_go_add_up_to_about_one_schedule_not_one_per_node():
    nodes, whole = _whole("halving-doubling", 64)
    sizes = [p.ByteSize() for p in node_parts(whole, nodes).values()]
    assert max(sizes) < whole.ByteSize() / 16
    assert sum(sizes) < 4 * whole.ByteSize()


def test_assignments_are_built_once_and_copied_with_each_nodes_rank():
    from oddl.controller.jobs import JobRecord
    from oddl.controller.wire_views import Assignments

    made = Assignments()
    calls = []

    def addresses(job):
        def peers():
            calls.append(job.id)
            return {n: f"tcp://{n}:{len(calls)}" for n in job.nodes}
        return peers

    a = JobRecord("job-a", "a", ("n0", "n1", "n2"), "ring", "optical", {}, 0)
    b = JobRecord("job-b", "b", ("n3", "n4"), "ring", "optical", {}, 0)
    first = made.events(a, ["n2", "n0"], 1, addresses(a))
    assert {n: e.assigned.rank for n, e in first.items()} == {"n2": 2, "n0": 0}
    assert dict(first["n0"].assigned.peers) == {n: "tcp://" + n + ":1" for n in a.nodes}
    assert made.events(b, ["n4"], 1, addresses(b))["n4"].assigned.peers.keys() == {"n3", "n4"}
    made.events(a, ["n1"], 1, addresses(a))  # same registry version: kept
    assert calls == ["job-a", "job-b"]
    again = made.events(a, ["n1"], 2, addresses(a))  # a registration since: asked again
    assert calls == ["job-a", "job-b", "job-a"] and again["n1"].assigned.peers["n1"] == \
        "tcp://n1:3"
    assert again["n1"].assigned.job.nodes == list(a.nodes) and again["n1"].assigned.next_seq == 1
