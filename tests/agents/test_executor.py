"""The agents' collective executor: plans run over an in-memory link give the exact sum."""

from __future__ import annotations

import time

import numpy as np
import pytest
from loopback_ranks import loopback_links, on_every_rank, step_specs

from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.plan_run import run_collective
from oddl.agents.slot_gate import SlotGate
from oddl.common.errors import CollectiveError
from oddl.controller.scheduling import make_plan


def _run_all(collective: str, arrays: list[np.ndarray], dead: frozenset[str] = frozenset(),
             timeout: float = 2.0):
    """Run the plan on real stream links on loopback; frames to `dead` nodes go nowhere
    (their senders are given an address where nothing listens)."""
    n = len(arrays)
    nodes = tuple(f"n{i}" for i in range(n))
    steps = step_specs(make_plan(collective, n, arrays[0].size).steps)
    with loopback_links(nodes, dead=dead) as links:
        def go(r: int) -> object:
            run = CollectiveRun("job-1", 1, r, nodes, steps, network="ideal",
                                receive_timeout_s=timeout)
            return run_collective(run, arrays[r], links[nodes[r]], SlotGate())

        return on_every_rank(n, go)


@pytest.mark.parametrize("collective,n", [("ring", 4), ("ring", 3), ("halving-doubling", 4),
                                          ("halving-doubling", 8)])
def test_exact_integer_sum(collective, n):
    rng = np.random.default_rng(n)
    arrays = [rng.integers(-1000, 1000, (7, 13)) for _ in range(n)]
    outs = _run_all(collective, arrays)
    exact = np.sum(arrays, axis=0)
    for out in outs:
        assert isinstance(out, np.ndarray)
        assert out.shape == (7, 13)
        assert np.array_equal(out, exact)


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_large_buckets_cross_many_chunks(dtype):
    # 3 MiB per rank: every ring segment spans several chunks
    rng = np.random.default_rng(5)
    arrays = [rng.integers(-2**20, 2**20, 3 * 2**17 + 5).astype(dtype) for _ in range(4)]
    exact = np.sum(arrays, axis=0)
    for collective in ("ring", "halving-doubling"):
        outs = _run_all(collective, [a.copy() for a in arrays])
        for out in outs:
            assert isinstance(out, np.ndarray) and np.array_equal(out, exact), out


def test_lost_peer_is_an_error_not_a_hang():
    arrays = [np.ones(64, dtype=np.float32) for _ in range(4)]
    t = time.monotonic()
    outs = _run_all("ring", arrays, dead=frozenset({"n2"}), timeout=0.3)
    assert time.monotonic() - t < 5
    assert isinstance(outs[2], CollectiveError)
    assert "lost data" in str(outs[2]) and "from n1" in str(outs[2])


def test_gate_releases_at_the_edge():
    gate = SlotGate()
    edges = [time.time() + 0.002 * (k + 1) for k in range(20)]
    errs = [gate.wait_until(t) for t in edges]
    assert all(e >= 0 for e in errs)  # never early
    p50, p99, worst = gate.percentiles()
    assert p50 <= p99 <= worst


def _wire_schedule(slots: list[list[tuple[str, int, bool]]]):
    """A wire schedule whose slot k has circuits (transmitter, channel, retune)."""
    from oddl.protos import oddl_pb2 as pb

    out = pb.Schedule(job_id="j", collective="c")
    for k, circuits in enumerate(slots):
        slot = out.slots.add(index=k, start_ns=k * 1000, data_start_ns=k * 1000 + 100)
        for tx, ch, retune in circuits:
            slot.circuits.add(transmitter=tx, channel=ch, retune=retune)
    return out


def test_a_schedule_that_returns_its_lasers_can_stand_one_that_moves_them_cannot():
    from oddl.protos.schedule_wire import ends_where_it_starts

    # halving-doubling's shape: away and back again
    assert ends_where_it_starts(_wire_schedule([[("a", 2, False), ("b", 1, False)],
                                                [("a", 3, True), ("b", 4, True)],
                                                [("a", 2, True), ("b", 1, True)]]))
    # a tree's shape: the lasers end on other channels than they start on
    assert not ends_where_it_starts(_wire_schedule([[("a", 2, False)], [("a", 3, True)]]))
    # a first circuit that needs a retune: where the laser starts is not known
    assert not ends_where_it_starts(_wire_schedule([[("a", 2, True)], [("a", 2, False)]]))


def _decoded(collective: str, elems: int = 1000, parts: bool = False):
    """The nodes and the decoded schedule of `collective` on a 4-node single-WSS testbed
    (with `parts`: each node's part of it, by node, as its go carries it)."""
    from oddl.controller.scheduling import Grid, TimingModel, Topology, schedule_plan
    from oddl.protos.schedule_wire import decode_schedule, encode_schedule, node_parts

    timing = TimingModel(tune_s=1e-3, skew_s=1e-4, cdr_s=1e-5, command_s=1e-3,
                         wss_settle_s=0.01, slot_margin_s=1e-4, line_rate_bps=10e9)
    topo = Topology.single_wss(4, Grid(193.1, 100.0, 48))
    nodes = tuple(topo.node_ids)
    plan = make_plan(collective, 4, elems)
    wire = encode_schedule(schedule_plan(plan, nodes, topo, timing, 8), "job-1", 2.0)
    if parts:
        return nodes, {n: decode_schedule(p) for n, p in node_parts(wire, nodes).items()}
    return nodes, decode_schedule(wire)


class _Recorder:
    """Per node, the grants waited for, the arrivals confirmed and the slot edges gated on."""

    def __init__(self, nodes: tuple[str, ...]):
        self.calls: dict[str, list[tuple]] = {nd: [] for nd in nodes}
        self.edges: dict[str, list[float]] = {nd: [] for nd in nodes}

    def handoffs(self, node: str):
        calls = self.calls[node]

        class Grants:
            def wait_circuits(self, seq: int, slot: int, deadline: float) -> None:
                calls.append(("wait", slot))

            def confirm(self, seq: int, slot: int, src: str) -> None:
                calls.append(("confirm", slot, src))

        return Grants()

    def gate(self, node: str) -> SlotGate:
        edges = self.edges[node]

        class RecordingGate(SlotGate):
            def wait_until(self, t_local, cancel=None):
                edges.append(t_local)
                return super().wait_until(t_local, cancel)

        return RecordingGate()


def _run_gated(nodes, decoded, elems: int, circuits_standing: bool = False
               ) -> tuple[_Recorder, float]:
    """Run the decoded schedule (or each node its own, given a dict by node) on real stream
    links from t0 = now + 0.2 s, check the exact sum at every node; return what each node
    waited for and confirmed, and t0."""
    seen = _Recorder(nodes)
    arrays = [np.arange(elems, dtype=np.int64) * (r + 1) for r in range(len(nodes))]
    t0 = time.time() + 0.2
    with loopback_links(nodes) as links:
        def go(r: int) -> object:
            mine = decoded[nodes[r]] if isinstance(decoded, dict) else decoded
            run = CollectiveRun("job-1", 1, r, nodes, mine.steps, mine.slots, t0_local=t0,
                                receive_timeout_s=mine.receive_timeout_s,
                                circuits_standing=circuits_standing)
            return run_collective(run, arrays[r], links[nodes[r]], seen.gate(nodes[r]),
                                  handoffs=seen.handoffs(nodes[r]))

        outs = on_every_rank(len(nodes), go)
    for out in outs:
        assert isinstance(out, np.ndarray) and np.array_equal(out, np.sum(arrays, axis=0))
    return seen, t0


def test_a_gated_run_waits_for_and_confirms_the_handoffs_its_schedule_carries():
    nodes, decoded = _decoded("halving-doubling")
    assert any(s.handoffs for s in decoded.slots)
    seen, _ = _run_gated(nodes, decoded, 1000)
    for node in nodes:
        calls = seen.calls[node]
        assert {c[1:] for c in calls if c[0] == "confirm"} == {
            (j, src) for s in decoded.slots for j, src, dst in s.handoffs if dst == node}
        assert {c[1] for c in calls if c[0] == "wait"} == {
            s.index for s in decoded.slots if s.changes_circuits
            and any(a == node for a, _b in s.pairs)}


def test_slots_that_keep_the_previous_circuits_continue_it():
    from oddl.protos.schedule_wire import continuing_slots

    _, ring = _decoded("ring")
    assert [s.changes_circuits for s in ring.slots] == [True] + [False] * 5
    assert continuing_slots(ring.slots) == {1, 2, 3, 4, 5}
    _, hd = _decoded("halving-doubling")
    # partners 1, 2 apart, then 2, 1 apart: only the third slot keeps the second's circuits
    same = [sorted(s.pairs) == sorted(p.pairs)
            for s, p in zip(hd.slots[1:], hd.slots[:-1], strict=True)]
    assert same == [False, True, False]
    assert continuing_slots(hd.slots) == {2}


def test_a_send_that_continues_the_previous_slots_circuits_waits_for_no_edge():
    nodes, decoded = _decoded("ring", 100_000)
    seen, t0 = _run_gated(nodes, decoded, 100_000)
    # each node waited for the first slot's edge only: slots 1-5 keep its circuits
    for node in nodes:
        assert seen.edges[node] == [t0 + decoded.slots[0].data_start_s]


def test_a_run_on_standing_circuits_waits_for_no_edge_at_all():
    # a standing schedule that retunes nothing (decision record 0022): the circuits are up
    # before the run and stay up, so not even the first slot's send waits for its edge
    nodes, decoded = _decoded("ring", 100_000)
    seen, t0 = _run_gated(nodes, decoded, 100_000, circuits_standing=True)
    assert all(seen.edges[node] == [] for node in nodes), seen.edges
    assert all(c[0] != "wait" for node in nodes for c in seen.calls[node])


@pytest.mark.parametrize("collective", ["halving-doubling", "ring"])
def test_each_node_runs_on_its_own_part_of_the_schedule(collective):
    # a go carries each node only its part (decision record 0034): the same waits, hand-off
    # confirmations and slot edges as on the whole schedule, and the exact sum
    nodes, whole = _decoded(collective, 100_000)
    _, parts = _decoded(collective, 100_000, parts=True)
    for node, part in parts.items():
        assert all(node in pair for s in part.slots for pair in s.pairs)
        assert len(part.steps) == len(whole.steps)
    seen, t0 = _run_gated(nodes, parts, 100_000)
    for node in nodes:
        calls = seen.calls[node]
        assert {c[1:] for c in calls if c[0] == "confirm"} == {
            (j, src) for s in whole.slots for j, src, dst in s.handoffs if dst == node}
        assert {c[1] for c in calls if c[0] == "wait"} == {
            s.index for s in whole.slots if s.changes_circuits
            and any(a == node for a, _b in s.pairs)}
    if collective == "ring":  # slots 1-5 keep the first slot's circuits: one edge each
        assert all(seen.edges[n] == [t0 + whole.slots[0].data_start_s] for n in nodes)
