"""The TT-FR slot scheduler: turn a collective plan into timed, contention-free slots.

Reconstruction of papers.md §1.2 (flow schedule per iteration):

1. Each plan step's transfers with the same (src, dst) merge into one flow (bytes summed).
2. A step whose flows form a matching (at most one flow per transmitter and per receiver) is
   one slot. Otherwise it is split into Δ rounds (Δ = largest number of flows at one node) by
   bipartite edge colouring (König), and each round is a slot. Since every receiver owns one
   channel per WSS, a matching also uses each (WSS, in-port, channel) and each
   (WSS, out-port, channel) at most once.
3. A flow to d travels on λ_rx(d): its transmitter must hold channel ``rx_channel(d)``.
4. Slot timing, with ``start = previous slot's end`` (the first starts at `start_s`):
   ``guard = timing.guard_s`` if any transmitter of the slot must retune (the channel it holds
   differs from the one it needs, or is unknown), else ``timing.skew_s``;
   ``data_start = start + guard``; ``hold = 8·max(flow bytes)/line_rate``;
   ``end = data_start + hold + slot_margin_s``.
5. Efficiency ``η = Σ hold / (Σ hold + Σ guard)`` over all slots, where a slot's hold is its
   longest flow's hold time and its guard is the guard it starts with (retune or skew-only).
   Slot margins count in neither sum; they are in the makespan.

Idle transmitters keep the channel they hold (no retune) and must not emit: agents keep the
output dark outside their own send windows, so an idle laser left on another node's receive
channel does not collide with that channel's sender at the WSS in-port.

Pure: no I/O, no clocks; time is the value `start_s`. Arrays are shared between slots where
they are identical (every ring slot reuses the plan's src/dst arrays), so N = 1024 is cheap.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from common.errors import ScheduleError
from controller.scheduling.collectives import Plan, Step, read_only
from controller.scheduling.topology import IN_PORT, Circuit, NodeSpec, TimingModel, Topology

_UNKNOWN = 0
"""Held-channel value of a transmitter whose channel is unknown (channels are 1-based)."""

_NO_FLOWS = read_only(np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class Retune:
    """A transmitter changing channel at the start of a slot (`from_channel` None: unknown)."""

    node: str
    transmitter: str
    from_channel: int | None
    to_channel: int


@dataclass(frozen=True)
class NodeEvent:
    """One send or receive of one node, for that node's agent (times in seconds)."""

    slot: int
    step: int
    kind: str
    """``"send"`` or ``"recv"``."""
    peer: str
    bytes: int
    channel: int
    """The channel the light travels on (the receiver's channel)."""
    start_s: float
    """Start of the slot: a transmitter that must retune does so from here."""
    data_start_s: float
    end_s: float


class _Job:
    """The job's nodes by rank, with per-rank numpy lookups into the topology."""

    def __init__(self, topology: Topology, nodes: Sequence[str], n_ranks: int) -> None:
        nodes = tuple(nodes)
        if len(nodes) != n_ranks:
            raise ScheduleError(
                f"the plan has {n_ranks} ranks but {len(nodes)} nodes were given; pass one node "
                "id per rank"
            )
        self.rank_of: dict[str, int] = {}
        for r, node_id in enumerate(nodes):
            if self.rank_of.setdefault(node_id, r) != r:
                raise ScheduleError(f"node {node_id!r} is given for two ranks; use each node once")
        self.topology = topology
        self.node_ids = nodes
        self.specs: tuple[NodeSpec, ...] = tuple(topology.node(n) for n in nodes)
        self.wss_ids = tuple(dict.fromkeys(s.wss for s in self.specs))
        wss_pos = {w: i for i, w in enumerate(self.wss_ids)}
        self.rx_channel = read_only(np.array([s.rx_channel for s in self.specs], dtype=np.int64))
        self.out_port = read_only(np.array([s.out_port for s in self.specs], dtype=np.int64))
        self.wss_index = read_only(np.array([wss_pos[s.wss] for s in self.specs], dtype=np.int64))

    def rank(self, node_id: str) -> int:
        r = self.rank_of.get(node_id)
        if r is None:
            raise ScheduleError(
                f"node {node_id!r} is not in this schedule; its nodes are "
                f"{', '.join(self.node_ids[:8])}{' …' if len(self.node_ids) > 8 else ''}"
            )
        return r


@dataclass(frozen=True, eq=False, slots=True)
class Slot:
    """One round of circuits: a matching of flows between `data_start_s` and `end_s`.

    Flow i goes from rank ``src_rank[i]`` to ``dst_rank[i]`` carrying ``bytes[i]``. The
    arrays are read-only and may be shared with other slots and with the plan.
    """

    index: int
    step: int
    round: int
    """Round within the step (0 unless the step was split by edge colouring)."""
    start_s: float
    data_start_s: float
    end_s: float
    guard_s: float
    hold_s: float
    src_rank: np.ndarray = field(repr=False)
    dst_rank: np.ndarray = field(repr=False)
    elems: np.ndarray = field(repr=False)
    """Elements per flow; ``bytes = elems · itemsize``."""
    itemsize: int = field(repr=False)
    retune_flows: np.ndarray = field(repr=False)
    """Indices of the flows whose transmitter retunes at the start of this slot."""
    retune_from: np.ndarray = field(repr=False)
    """Channel each of those transmitters held before (0 = unknown)."""
    _job: _Job = field(repr=False)

    @property
    def bytes(self) -> np.ndarray:
        """Bytes per flow (int64 array)."""
        return self.elems * self.itemsize

    @property
    def n_flows(self) -> int:
        """Number of flows (circuits) in the slot."""
        return int(self.src_rank.shape[0])

    @property
    def retuned(self) -> bool:
        """Whether any transmitter retunes at the start of this slot."""
        return bool(self.retune_flows.shape[0])

    def channels(self) -> np.ndarray:
        """Return the channel of each flow (its receiver's channel)."""
        return self._job.rx_channel[self.dst_rank]

    def circuits(self) -> list[Circuit]:
        """Return the slot's circuits, built from the topology."""
        specs, rx = self._job.specs, self._job.rx_channel
        out = []
        for s, d in zip(self.src_rank.tolist(), self.dst_rank.tolist(), strict=True):
            a, b = specs[s], specs[d]
            out.append(Circuit(a.id, a.transmitter, int(rx[d]), b.wss, IN_PORT, b.out_port, b.id))
        return out

    def retunes(self) -> list[Retune]:
        """Return the transmitters that retune at the start of this slot."""
        specs, rx = self._job.specs, self._job.rx_channel
        out = []
        for i, frm in zip(self.retune_flows.tolist(), self.retune_from.tolist(), strict=True):
            a = specs[int(self.src_rank[i])]
            to = int(rx[self.dst_rank[i]])
            out.append(Retune(a.id, a.transmitter, None if frm == _UNKNOWN else frm, to))
        return out


@dataclass(frozen=True, eq=False)
class Schedule:
    """A plan laid out in time on a topology: slots, channel states and totals."""

    plan: Plan
    nodes: tuple[str, ...]
    topology: Topology
    timing: TimingModel
    itemsize: int
    slots: tuple[Slot, ...]
    start_s: float
    end_s: float
    reconfigurations: int
    """Number of transmitter retunes over all slots."""
    guard_total_s: float
    hold_total_s: float
    margin_total_s: float
    initial_channels: Mapping[str, int | None]
    """Channel each node's transmitter holds before the first slot (None: unknown)."""
    final_channels: Mapping[str, int | None]
    """Channel each node's transmitter holds after the last slot (feed to the next schedule)."""
    _job: _Job = field(repr=False)
    _starts: list[float] = field(repr=False)

    @property
    def makespan_s(self) -> float:
        """Time from `start_s` to the end of the last slot."""
        return self.end_s - self.start_s

    @property
    def efficiency(self) -> float:
        """η = Σhold / (Σhold + Σguard) over all slots (1.0 for an empty schedule)."""
        busy = self.hold_total_s + self.guard_total_s
        return self.hold_total_s / busy if busy > 0 else 1.0

    def wss_tables(self) -> dict[str, dict[int, int]]:
        """Return the job-scale WSS tables: {wss id: {channel: out-port}} for the job's nodes."""
        tables: dict[str, dict[int, int]] = {w: {} for w in self._job.wss_ids}
        for s in sorted(self._job.specs, key=lambda s: (s.wss, s.rx_channel)):
            tables[s.wss][s.rx_channel] = s.out_port
        return tables

    def slot_at(self, t_s: float) -> Slot | None:
        """Return the slot whose [start_s, end_s) contains `t_s`, or None."""
        i = bisect.bisect_right(self._starts, t_s) - 1
        if i >= 0 and t_s < self.slots[i].end_s:
            return self.slots[i]
        return None

    def node_view(self, node_id: str) -> list[NodeEvent]:
        """Return `node_id`'s sends and receives in slot order (sends first within a slot)."""
        job = self._job
        r = job.rank(node_id)
        ids, rx = job.node_ids, job.rx_channel.tolist()
        seen: dict[tuple[int, int], tuple[list[int], list[int]]] = {}  # slots sharing arrays
        events: list[NodeEvent] = []
        for slot in self.slots:
            key = (id(slot.src_rank), id(slot.dst_rank))
            hit = seen.get(key)
            if hit is None:
                sends = np.flatnonzero(slot.src_rank == r).tolist()
                recvs = np.flatnonzero(slot.dst_rank == r).tolist()
                hit = seen[key] = (sends, recvs)
            sends, recvs = hit
            if not sends and not recvs:
                continue
            src, dst, elems = slot.src_rank, slot.dst_rank, slot.elems
            for i in sends:
                d = int(dst[i])
                events.append(
                    NodeEvent(
                        slot.index,
                        slot.step,
                        "send",
                        ids[d],
                        int(elems[i]) * self.itemsize,
                        rx[d],
                        slot.start_s,
                        slot.data_start_s,
                        slot.end_s,
                    )
                )
            for i in recvs:
                events.append(
                    NodeEvent(
                        slot.index,
                        slot.step,
                        "recv",
                        ids[int(src[i])],
                        int(elems[i]) * self.itemsize,
                        rx[r],
                        slot.start_s,
                        slot.data_start_s,
                        slot.end_s,
                    )
                )
        return events

    def check_contention_free(self) -> None:
        """Raise ScheduleError unless every slot uses each transmitter, receiver,
        (WSS, in-port, channel) and (WSS, out-port, channel) at most once, and every flow's
        ends hang on the same WSS."""
        job = self._job
        n = len(job.node_ids)
        n_ch = self.topology.grid.channels + 1
        n_port = int(job.out_port.max(initial=0)) + 1
        checked: set[tuple[int, int]] = set()  # slots sharing arrays are checked once
        for slot in self.slots:
            src, dst = slot.src_rank, slot.dst_rank
            key = (id(src), id(dst))
            if key in checked:
                continue
            where = f"slot {slot.index} (step {slot.step})"
            if len(src) and (src.min() < 0 or dst.min() < 0 or max(src.max(), dst.max()) >= n):
                raise ScheduleError(f"{where}: ranks out of range 0..{n - 1}")
            wss = job.wss_index[src]
            apart = np.flatnonzero(wss != job.wss_index[dst])
            if len(apart):
                i = apart[0]
                raise ScheduleError(
                    f"{where}: {job.node_ids[src[i]]!r} and {job.node_ids[dst[i]]!r} hang on "
                    "different WSS; a single-stage fabric cannot connect them"
                )
            ch = job.rx_channel[dst]
            for what, k in (
                ("transmitter", src),
                ("receiver", dst),
                (f"(WSS, {IN_PORT!r}, channel)", wss * n_ch + ch),
                ("(WSS, out-port, channel)", (wss * n_port + job.out_port[dst]) * n_ch + ch),
            ):
                dup = _first_duplicate(k)
                if dup is not None:
                    i, j = dup
                    raise ScheduleError(
                        f"{where}: {what} is used twice, by {job.node_ids[src[i]]!r} -> "
                        f"{job.node_ids[dst[i]]!r} and {job.node_ids[src[j]]!r} -> "
                        f"{job.node_ids[dst[j]]!r}; split the step into matchings"
                    )
            checked.add(key)


def schedule_plan(
    plan: Plan,
    nodes: Sequence[str],
    topology: Topology,
    timing: TimingModel,
    itemsize: int,
    start_s: float = 0.0,
    initial_channels: Mapping[str, int | None] | None = None,
) -> Schedule:
    """Lay `plan` out as slots on `topology`, rank r running on node ``nodes[r]``.

    `initial_channels` maps node id → channel its transmitter holds at `start_s` (None or
    missing: unknown, so that node's first send counts as a retune; nodes outside the job are
    ignored). Pass a previous schedule's `final_channels` to chain collectives.
    """
    try:
        itemsize = operator.index(itemsize)
    except TypeError:
        raise ScheduleError(f"itemsize must be a whole number of bytes; got {itemsize!r}") from None
    if itemsize < 1:
        raise ScheduleError(f"itemsize must be >= 1 byte; got {itemsize}, e.g. 4 for float32")
    if not math.isfinite(start_s):
        raise ScheduleError(f"start_s must be a finite time; got {start_s}")
    job = _Job(topology, nodes, plan.n_ranks)
    held = _initial_held(job, initial_channels)
    initial = _channel_map(job, held)

    bits_per_elem = 8.0 * itemsize / timing.line_rate_bps
    guard_retune, guard_plain, margin = timing.guard_s, timing.skew_s, timing.slot_margin_s
    # Whether a step's flows form a matching, by (src, dst) array identity (the plan keeps the
    # arrays alive, so ids are unique here): steps sharing arrays are checked once.
    matching: dict[tuple[int, int], bool] = {}
    splits: dict[tuple[int, int], _Split] = {}  # edge colourings, by (src, dst) array identity
    slots: list[Slot] = []
    starts: list[float] = []
    t = float(start_s)
    guard_total = hold_total = 0.0
    reconfigurations = 0
    last: tuple[np.ndarray, np.ndarray] | None = None
    for step_index, step in enumerate(plan.steps):
        if not len(step):
            continue
        key = (id(step.src), id(step.dst))
        if key not in matching:
            matching[key] = _is_matching(step.src, step.dst, job, step_index)
        if matching[key]:
            rounds = [(step.src, step.dst, step.length)]
        else:
            split = splits.get(key)
            if split is None:
                split = splits[key] = _Split.of(step, job)
            rounds = split.rounds(step)
        for round_index, (src, dst, elems) in enumerate(rounds):
            if last is not None and src is last[0] and dst is last[1]:
                retune_flows = retune_from = _NO_FLOWS  # same circuits as the previous slot
            else:
                need = job.rx_channel[dst]
                mask = held[src] != need
                if mask.any():
                    retune_flows = read_only(np.flatnonzero(mask))
                    movers = src[retune_flows]
                    retune_from = read_only(held[movers])
                    held[movers] = need[retune_flows]
                else:
                    retune_flows = retune_from = _NO_FLOWS
                last = (src, dst)
            n_retunes = len(retune_flows)
            guard = guard_retune if n_retunes else guard_plain
            hold = int(elems.max()) * bits_per_elem
            data_start = t + guard
            end = data_start + hold + margin
            slots.append(
                Slot(
                    len(slots),
                    step_index,
                    round_index,
                    t,
                    data_start,
                    end,
                    guard,
                    hold,
                    src,
                    dst,
                    elems,
                    itemsize,
                    retune_flows,
                    retune_from,
                    job,
                )
            )
            starts.append(t)
            reconfigurations += n_retunes
            guard_total += guard
            hold_total += hold
            t = end

    return Schedule(
        plan=plan,
        nodes=job.node_ids,
        topology=topology,
        timing=timing,
        itemsize=itemsize,
        slots=tuple(slots),
        start_s=float(start_s),
        end_s=t,
        reconfigurations=reconfigurations,
        guard_total_s=guard_total,
        hold_total_s=hold_total,
        margin_total_s=margin * len(slots),
        initial_channels=initial,
        final_channels=_channel_map(job, held),
        _job=job,
        _starts=starts,
    )


def bipartite_edge_colouring(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Colour the edges (left[i], right[i]) of a bipartite graph with Δ colours.

    No two edges sharing a left or a right vertex get the same colour, and colours are
    0..Δ−1 with Δ the maximum degree (König's theorem). Alternating-path algorithm: give each
    edge a colour free at both ends, swapping an a/b path first when none is (O(E·V)).
    """
    ls, rs = np.asarray(left).tolist(), np.asarray(right).tolist()
    if len(ls) != len(rs):
        raise ScheduleError(f"edge lists differ in length: {len(ls)} and {len(rs)}")
    colour = [-1] * len(ls)
    at_left: dict[int, dict[int, int]] = {}  # vertex -> colour -> edge
    at_right: dict[int, dict[int, int]] = {}
    for e, (u, v) in enumerate(zip(ls, rs, strict=True)):
        lu = at_left.setdefault(u, {})
        rv = at_right.setdefault(v, {})
        a = _first_free(lu)
        if a not in rv:
            c = a
        else:
            b = _first_free(rv)
            if b not in lu:
                c = b
            else:
                # Flip the path from v alternating a, b, a, ...; it cannot reach u (a is free
                # at u and the graph is bipartite), and afterwards a is free at v.
                path = []
                x, on_right, col = v, True, a
                while (f := (at_right if on_right else at_left)[x].get(col)) is not None:
                    path.append(f)
                    x = ls[f] if on_right else rs[f]
                    on_right, col = not on_right, (b if col == a else a)
                for f in path:
                    del at_left[ls[f]][colour[f]], at_right[rs[f]][colour[f]]
                for f in path:
                    colour[f] = b if colour[f] == a else a
                    at_left[ls[f]][colour[f]] = at_right[rs[f]][colour[f]] = f
                c = a
        colour[e] = c
        lu[c] = rv[c] = e
    return np.array(colour, dtype=np.int64)


# --------------------------------------------------------------------------- helpers


def _is_matching(src: np.ndarray, dst: np.ndarray, job: _Job, step_index: int) -> bool:
    """Check a step's flows can run on the fabric; return whether they form a matching."""
    n = len(job.node_ids)
    if src.min() < 0 or dst.min() < 0 or max(src.max(), dst.max()) >= n:
        raise ScheduleError(f"plan step {step_index} names ranks outside 0..{n - 1}")
    same = np.flatnonzero(src == dst)
    if len(same):
        raise ScheduleError(
            f"plan step {step_index}: rank {src[same[0]]} sends to itself; drop the transfer"
        )
    if len(job.wss_ids) > 1:
        apart = np.flatnonzero(job.wss_index[src] != job.wss_index[dst])
        if len(apart):
            i = apart[0]
            raise ScheduleError(
                f"plan step {step_index}: {job.node_ids[src[i]]!r} -> "
                f"{job.node_ids[dst[i]]!r} crosses from WSS {job.specs[src[i]].wss!r} to "
                f"{job.specs[dst[i]].wss!r}; a single-stage fabric needs both on one WSS"
            )
    return _at_most_once(src, n) and _at_most_once(dst, n)


@dataclass(frozen=True, eq=False)
class _Split:
    """How a non-matching step's transfers merge per (src, dst) and split into matchings.

    Computed once per distinct (src, dst) arrays and reused for every step sharing them (a
    plan's steps share their rank arrays), so only the per-step lengths are summed again.
    """

    order: np.ndarray
    first: np.ndarray
    rounds_idx: tuple[np.ndarray, ...]
    rounds_src: tuple[np.ndarray, ...]
    rounds_dst: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, step: Step, job: _Job) -> _Split:
        n = len(job.node_ids)
        pair = step.src * n + step.dst
        order = np.argsort(pair, kind="stable")
        sorted_pair = pair[order]
        first = np.flatnonzero(np.r_[True, sorted_pair[1:] != sorted_pair[:-1]])
        src = step.src[order][first]
        dst = step.dst[order][first]
        colour = _colour(src, dst, n)
        idx = tuple(np.flatnonzero(colour == c) for c in range(int(colour.max(initial=-1)) + 1))
        idx = tuple(i for i in idx if len(i))
        return cls(order, first, idx, tuple(read_only(src[i]) for i in idx),
                   tuple(read_only(dst[i]) for i in idx))

    def rounds(self, step: Step) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The step's matchings: (src, dst, elements) per round."""
        elems = np.add.reduceat(step.length[self.order], self.first)
        return [(s, d, read_only(elems[i]))
                for s, d, i in zip(self.rounds_src, self.rounds_dst, self.rounds_idx, strict=True)]


def _colour(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """Δ-colouring of the merged flows; vectorised when one side has degree one (a star)."""
    if _at_most_once(src, n) and _at_most_once(dst, n):
        return np.zeros(len(src), dtype=np.int64)
    for one, many in ((src, dst), (dst, src)):
        if _at_most_once(one, n):
            # only `many` repeats: colour = the edge's rank among the edges at its vertex
            order = np.argsort(many, kind="stable")
            sorted_many = many[order]
            starts = np.flatnonzero(np.r_[True, sorted_many[1:] != sorted_many[:-1]])
            rank = np.arange(len(many)) - np.repeat(starts, np.diff(np.r_[starts, len(many)]))
            colour = np.empty(len(many), dtype=np.int64)
            colour[order] = rank
            return colour
    return bipartite_edge_colouring(src, dst)


def _initial_held(job: _Job, initial: Mapping[str, int | None] | None) -> np.ndarray:
    held = np.full(len(job.node_ids), _UNKNOWN, dtype=np.int64)
    if not initial:
        return held
    channels = job.topology.grid.channels
    for node_id, ch in initial.items():
        job.topology.node(node_id)  # a typo must not pass silently
        r = job.rank_of.get(node_id)
        if r is None or ch is None:
            continue
        if not 1 <= ch <= channels:
            raise ScheduleError(
                f"initial channel of {node_id!r} is {ch}, off the grid; use 1..{channels} or None"
            )
        held[r] = ch
    return held


def _channel_map(job: _Job, held: np.ndarray) -> dict[str, int | None]:
    return {
        n: (None if c == _UNKNOWN else c) for n, c in zip(job.node_ids, held.tolist(), strict=True)
    }


def _at_most_once(ranks: np.ndarray, n: int) -> bool:
    return not len(ranks) or int(np.bincount(ranks, minlength=n).max()) <= 1


def _first_duplicate(keys: np.ndarray) -> tuple[int, int] | None:
    """Return two indices with equal keys, or None."""
    if len(keys) < 2:
        return None
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    hit = np.flatnonzero(k[1:] == k[:-1])
    if not len(hit):
        return None
    return int(order[hit[0]]), int(order[hit[0] + 1])


def _first_free(used: dict[int, int]) -> int:
    c = 0
    while c in used:
        c += 1
    return c
