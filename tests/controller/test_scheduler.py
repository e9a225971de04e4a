"""The TT-FR slot scheduler: contention-free slots, guards where lasers retune, bytes delivered."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import TESTBED_TIMING

from oddl.common.errors import ScheduleError
from oddl.controller.scheduling import (
    IN_PORT,
    Circuit,
    Grid,
    NodeSpec,
    Plan,
    Schedule,
    TimingModel,
    Topology,
    WssSpec,
    make_plan,
    schedule_plan,
)

TIMING = TESTBED_TIMING


def timings() -> st.SearchStrategy[TimingModel]:
    t = st.floats(min_value=0.0, max_value=1e-2, allow_nan=False)
    return st.builds(
        TimingModel,
        tune_s=t,
        skew_s=t,
        cdr_s=t,
        command_s=t,
        wss_settle_s=t,
        slot_margin_s=t,
        line_rate_bps=st.sampled_from([1e9, 10e9, 100e9]),
    )


@st.composite
def jobs(draw: st.DrawFn) -> tuple[Plan, Topology, list[str], dict[str, int | None]]:
    """A collective on a random subset of a one-WSS fabric, with random initial channels."""
    name = draw(st.sampled_from(["ring", "halving-doubling"]))
    n = draw(st.integers(1, 12)) if name == "ring" else 1 << draw(st.integers(0, 4))
    spare = draw(st.integers(0, 3))
    topo = Topology.single_wss(n + spare)
    nodes = draw(st.permutations(topo.node_ids))[:n]
    plan = make_plan(name, n, draw(st.integers(0, 200)))
    initial = draw(
        st.dictionaries(
            st.sampled_from(topo.node_ids),
            st.none() | st.integers(1, topo.grid.channels),
        )
    )
    return plan, topo, nodes, initial


def held_before(schedule: Schedule, initial: dict[str, int | None]) -> list[dict[str, int | None]]:
    """Replay the channel each transmitter holds before every slot (independent of the code)."""
    held = {n: initial.get(n) for n in schedule.nodes}
    states = []
    for slot in schedule.slots:
        states.append(dict(held))
        for c in slot.circuits():
            held[c.src] = c.channel
    states.append(held)
    return states


def check_circuits(circuits: list[Circuit], topo: Topology) -> None:
    """Contention-free, checked from the circuits themselves; each on its receiver's channel."""
    for key in (
        lambda c: c.transmitter,
        lambda c: c.dst,
        lambda c: (c.wss, c.in_port, c.channel),
        lambda c: (c.wss, c.out_port, c.channel),
    ):
        assert len({key(c) for c in circuits}) == len(circuits)
    for c in circuits:
        d = topo.node(c.dst)
        assert (c.channel, c.wss, c.out_port, c.in_port) == (
            d.rx_channel,
            d.wss,
            d.out_port,
            IN_PORT,
        )
        assert c.transmitter == topo.node(c.src).transmitter


@settings(max_examples=150, deadline=None)
@given(
    job=jobs(),
    timing=timings(),
    itemsize=st.sampled_from([1, 2, 4, 8]),
    start=st.floats(min_value=-10.0, max_value=1e4, allow_nan=False),
)
def test_schedule_properties(job, timing: TimingModel, itemsize: int, start: float) -> None:
    plan, topo, nodes, initial = job
    s = schedule_plan(plan, nodes, topo, timing, itemsize, start_s=start, initial_channels=initial)
    s.check_contention_free()
    states = held_before(s, initial)
    assert s.final_channels == states[-1]
    assert s.initial_channels == states[0]
    delivered: Counter[tuple[int, int, int]] = Counter()
    t = start
    retunes = 0
    for i, slot in enumerate(s.slots):
        circuits = slot.circuits()
        check_circuits(circuits, topo)
        # timing: back to back, in step order, guard before the data window
        assert slot.index == i
        assert slot.start_s == pytest.approx(t, abs=1e-9)
        assert i == 0 or slot.step >= s.slots[i - 1].step
        assert slot.data_start_s - slot.start_s == pytest.approx(slot.guard_s, abs=1e-9)
        movers = {c.src for c in circuits if states[i][c.src] != c.channel}
        assert {r.node for r in slot.retunes()} == movers
        assert slot.retuned == bool(movers)
        for r in slot.retunes():
            assert r.from_channel == states[i][r.node]
            assert r.to_channel == states[i + 1][r.node]
        if movers:
            assert slot.guard_s >= timing.guard_s
            assert slot.data_start_s - slot.start_s >= timing.guard_s - 1e-12
        else:
            assert slot.guard_s == timing.skew_s
        hold = 8 * int(slot.bytes.max()) / timing.line_rate_bps
        assert slot.hold_s == pytest.approx(hold)
        assert slot.end_s - slot.data_start_s == pytest.approx(
            hold + timing.slot_margin_s, abs=1e-9
        )
        retunes += len(movers)
        t = slot.end_s
        for src, dst, b in zip(
            slot.src_rank.tolist(), slot.dst_rank.tolist(), slot.bytes.tolist(), strict=True
        ):
            delivered[slot.step, src, dst] += b
    # every byte of the plan is scheduled, in the slots of its own step
    wanted: Counter[tuple[int, int, int]] = Counter()
    for k, step in enumerate(plan.steps):
        for src, dst, ln in zip(
            step.src.tolist(), step.dst.tolist(), step.length.tolist(), strict=True
        ):
            wanted[k, src, dst] += ln * itemsize
    assert delivered == wanted
    # totals and efficiency
    assert s.reconfigurations == retunes
    assert s.end_s == pytest.approx(t)
    assert s.makespan_s == pytest.approx(t - start, abs=1e-9)
    assert s.hold_total_s == pytest.approx(sum(x.hold_s for x in s.slots))
    assert s.guard_total_s == pytest.approx(sum(x.guard_s for x in s.slots))
    busy = s.hold_total_s + s.guard_total_s
    assert s.efficiency == (pytest.approx(s.hold_total_s / busy) if busy else 1.0)
    assert s.makespan_s == pytest.approx(busy + s.margin_total_s, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(job=jobs())
def test_node_view_lists_each_nodes_flows(job) -> None:
    plan, topo, nodes, _ = job
    s = schedule_plan(plan, nodes, topo, TIMING, itemsize=4)
    for node in nodes:
        expected = []
        for slot in s.slots:
            for c, b in zip(slot.circuits(), slot.bytes.tolist(), strict=True):
                if c.src == node:
                    expected.append((slot.index, "send", c.dst, b, c.channel))
            for c, b in zip(slot.circuits(), slot.bytes.tolist(), strict=True):
                if c.dst == node:
                    expected.append((slot.index, "recv", c.src, b, c.channel))
        view = s.node_view(node)
        assert [(e.slot, e.kind, e.peer, e.bytes, e.channel) for e in view] == expected
        for e in view:
            slot = s.slots[e.slot]
            assert (e.step, e.start_s, e.data_start_s, e.end_s) == (
                slot.step,
                slot.start_s,
                slot.data_start_s,
                slot.end_s,
            )


def test_ring_on_4_nodes_retunes_only_at_the_start() -> None:
    topo = Topology.single_wss(4)
    plan = make_plan("ring", 4, 1000)
    own = {n.id: n.rx_channel for n in topo.nodes}  # each laser parked on its own receiver: wrong
    s = schedule_plan(plan, topo.node_ids, topo, TIMING, itemsize=4, initial_channels=own)
    assert len(s.slots) == 6
    assert [x.retuned for x in s.slots] == [True] + [False] * 5
    assert s.reconfigurations == 4
    assert s.slots[0].guard_s == TIMING.guard_s
    assert all(x.guard_s == TIMING.skew_s for x in s.slots[1:])
    assert {r.node: (r.from_channel, r.to_channel) for r in s.slots[0].retunes()} == {
        "node0": (1, 2),
        "node1": (2, 3),
        "node2": (3, 4),
        "node3": (4, 1),
    }
    again = schedule_plan(
        plan,
        topo.node_ids,
        topo,
        TIMING,
        itemsize=4,
        start_s=s.end_s,
        initial_channels=s.final_channels,
    )
    assert again.reconfigurations == 0
    assert again.start_s == s.end_s


def test_unknown_initial_channels_count_as_retunes() -> None:
    topo = Topology.single_wss(4)
    s = schedule_plan(make_plan("ring", 4, 1000), topo.node_ids, topo, TIMING, itemsize=4)
    assert s.reconfigurations == 4
    assert all(r.from_channel is None for r in s.slots[0].retunes())
    assert s.initial_channels == dict.fromkeys(topo.node_ids)
    assert s.final_channels == {"node0": 2, "node1": 3, "node2": 4, "node3": 1}


def test_halving_doubling_on_4_nodes_retunes_between_steps() -> None:
    topo = Topology.single_wss(4)
    plan = make_plan("halving-doubling", 4, 1000)
    first_partner = {f"node{i}": (i ^ 1) + 1 for i in range(4)}  # already on step 0's partner
    s = schedule_plan(plan, topo.node_ids, topo, TIMING, itemsize=4, initial_channels=first_partner)
    # partners per step: i^1, i^2 (reduce-scatter), then i^2, i^1 (all-gather)
    assert [x.retuned for x in s.slots] == [False, True, False, True]
    assert s.reconfigurations == 8
    for i in (1, 3):
        assert s.slots[i].data_start_s - s.slots[i].start_s == pytest.approx(TIMING.guard_s)
    assert (
        s.efficiency
        < schedule_plan(
            make_plan("ring", 4, 1000),
            topo.node_ids,
            topo,
            TIMING,
            4,
            initial_channels={f"node{i}": (i + 1) % 4 + 1 for i in range(4)},
        ).efficiency
    )


def test_vgg19_ring_matches_the_bandwidth_term() -> None:
    """docs/sources.md §1.2: VGG19 at 100 Gbit/s on 4 nodes holds 11.49 ms per step, 68.96 ms in all."""
    topo = Topology.single_wss(4)
    fast = dataclasses.replace(TIMING, line_rate_bps=100e9, slot_margin_s=0.0)
    s = schedule_plan(make_plan("ring", 4, 143_667_240), topo.node_ids, topo, fast, itemsize=4)
    assert s.slots[0].hold_s == pytest.approx(11.49e-3, rel=1e-3)
    assert s.hold_total_s == pytest.approx(68.96e-3, rel=1e-3)


def test_wss_tables_and_slot_lookup() -> None:
    topo = Topology.single_wss(4)
    s = schedule_plan(
        make_plan("ring", 3, 300), ["node3", "node1", "node2"], topo, TIMING, 4, start_s=5.0
    )
    assert s.wss_tables() == {"wss0": {2: 2, 3: 3, 4: 4}}
    assert s.slot_at(4.9) is None
    assert s.slot_at(5.0) is s.slots[0]
    assert s.slot_at(s.slots[2].start_s) is s.slots[2]
    assert s.slot_at(s.slots[2].end_s - 1e-9) is s.slots[2]
    assert s.slot_at(s.end_s) is None
    assert [c.dst for c in s.slots[0].circuits()] == ["node1", "node2", "node3"]


def test_contention_check_catches_a_shared_receiver() -> None:
    topo = Topology.single_wss(4)
    s = schedule_plan(make_plan("ring", 4, 100), topo.node_ids, topo, TIMING, 4)
    s.check_contention_free()
    bad = dataclasses.replace(s.slots[2], dst_rank=np.array([1, 1, 3, 0]))
    broken = dataclasses.replace(s, slots=(*s.slots[:2], bad, *s.slots[3:]))
    with pytest.raises(ScheduleError, match="slot 2 .*receiver is used twice"):
        broken.check_contention_free()


def two_wss_topology() -> Topology:
    grid = Grid(193.1, 100.0, 8)
    nodes = [NodeSpec(f"a{i}", f"ta{i}", i + 1, "wssA", i + 1) for i in range(2)]
    nodes += [NodeSpec(f"b{i}", f"tb{i}", i + 1, "wssB", i + 1) for i in range(2)]
    return Topology(grid, tuple(nodes), (WssSpec("wssA", 2), WssSpec("wssB", 2)))


def test_two_wss_fabric() -> None:
    topo = two_wss_topology()
    s = schedule_plan(make_plan("ring", 2, 10), ["b0", "b1"], topo, TIMING, 4)
    s.check_contention_free()
    assert s.wss_tables() == {"wssB": {1: 1, 2: 2}}
    assert {c.wss for x in s.slots for c in x.circuits()} == {"wssB"}
    with pytest.raises(ScheduleError, match="'a1' -> 'b0' crosses from WSS 'wssA' to 'wssB'"):
        schedule_plan(make_plan("ring", 4, 10), ["a0", "a1", "b0", "b1"], topo, TIMING, 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": ["node0", "node1"]}, "3 ranks but 2 nodes"),
        ({"nodes": ["node0", "node1", "node1"]}, "'node1' is given for two ranks"),
        ({"nodes": ["node0", "node1", "nodeX"]}, "unknown node 'nodeX'"),
        ({"itemsize": 0}, "itemsize must be >= 1"),
        ({"initial_channels": {"node0": 9}}, "off the grid; use 1..4"),
        ({"initial_channels": {"ghost": 1}}, "unknown node 'ghost'"),
        ({"start_s": float("nan")}, "finite"),
    ],
)
def test_schedule_refusals(kwargs: dict, message: str) -> None:
    topo = Topology.single_wss(4)
    args = {
        "plan": make_plan("ring", 3, 30),
        "nodes": ["node0", "node1", "node2"],
        "topology": topo,
        "timing": TIMING,
        "itemsize": 4,
    } | kwargs
    with pytest.raises(ScheduleError, match=message):
        schedule_plan(**args)


def test_initial_channels_of_nodes_outside_the_job_are_ignored() -> None:
    topo = Topology.single_wss(4)
    s = schedule_plan(
        make_plan("ring", 2, 30),
        ["node0", "node1"],
        topo,
        TIMING,
        4,
        initial_channels={"node3": 1, "node0": 2},
    )
    assert s.initial_channels == {"node0": 2, "node1": None}
    assert [r.node for r in s.slots[0].retunes()] == ["node1"]


def test_empty_plan_gives_an_empty_schedule() -> None:
    topo = Topology.single_wss(2)
    s = schedule_plan(make_plan("ring", 2, 0), topo.node_ids, topo, TIMING, 4, start_s=1.0)
    assert s.slots == ()
    assert (s.makespan_s, s.end_s, s.efficiency, s.reconfigurations) == (0.0, 1.0, 1.0, 0)
    assert s.node_view("node0") == []


def test_ring_at_1024_nodes_shares_arrays_and_retunes_once() -> None:
    topo = Topology.single_wss(1024)
    s = schedule_plan(make_plan("ring", 1024, 10_000), topo.node_ids, topo, TIMING, 4)
    assert len(s.slots) == 2046
    assert s.reconfigurations == 1024
    assert len({id(x.src_rank) for x in s.slots}) == 1
    s.check_contention_free()
    view = s.node_view("node5")
    assert len(view) == 2 * 2046
    assert {e.peer for e in view} == {"node4", "node6"}


def test_node_view_refuses_nodes_outside_the_job() -> None:
    topo = Topology.single_wss(4)
    s = schedule_plan(make_plan("ring", 2, 4), ["node0", "node1"], topo, TIMING, 4)
    with pytest.raises(ScheduleError, match="'node3' is not in this schedule"):
        s.node_view("node3")


def test_slots_of_a_step_hold_their_own_bytes() -> None:
    """Bytes per (step, src, dst) add up even when one step's flows are unequal."""
    topo = Topology.single_wss(3)
    plan = make_plan("ring", 3, 10)  # chunks of 3, 3, 4 elements
    s = schedule_plan(plan, topo.node_ids, topo, TIMING, itemsize=8)
    per_step = defaultdict(int)
    for slot in s.slots:
        per_step[slot.step] += int(slot.bytes.sum())
        assert slot.hold_s == pytest.approx(8 * 4 * 8 / TIMING.line_rate_bps)
    assert sum(per_step.values()) == int(plan.bytes_sent(8).sum())
