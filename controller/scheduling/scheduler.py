"""The TT-FR slot scheduler: turn a collective plan into timed, contention-free slots.

Reconstruction of docs/sources.md §1.2 (flow schedule per iteration):

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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from oddl.common.errors import ScheduleError
from oddl.controller.scheduling.job_nodes import JobNodes
from oddl.controller.scheduling.matchings import StepSplit, first_duplicate, step_is_matching
from oddl.controller.scheduling.plan import Plan, read_only
from oddl.controller.scheduling.slot import UNKNOWN_CHANNEL, NodeEvent, Slot
from oddl.controller.scheduling.topology import IN_PORT, TimingModel, Topology

_NO_FLOWS = read_only(np.zeros(0, dtype=np.int64))


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
    _job: JobNodes = field(repr=False)
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
            times = (slot.start_s, slot.data_start_s, slot.end_s)
            for i in sends:
                d = int(dst[i])
                events.append(NodeEvent(slot.index, slot.step, "send", ids[d],
                                        int(elems[i]) * self.itemsize, rx[d], *times))
            for i in recvs:
                events.append(NodeEvent(slot.index, slot.step, "recv", ids[int(src[i])],
                                        int(elems[i]) * self.itemsize, rx[r], *times))
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
                dup = first_duplicate(k)
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
    job = JobNodes(topology, nodes, plan.n_ranks)
    held = _initial_held(job, initial_channels)
    initial = _channel_map(job, held)
    lay = _lay_out(_rounds(plan, job), job, held, timing, itemsize, float(start_s))
    return Schedule(
        plan=plan,
        nodes=job.node_ids,
        topology=topology,
        timing=timing,
        itemsize=itemsize,
        slots=tuple(lay.slots),
        start_s=float(start_s),
        end_s=lay.end_s,
        reconfigurations=lay.reconfigurations,
        guard_total_s=lay.guard_total,
        hold_total_s=lay.hold_total,
        margin_total_s=timing.slot_margin_s * len(lay.slots),
        initial_channels=initial,
        final_channels=_channel_map(job, held),
        _job=job,
        _starts=lay.starts,
    )


Round = tuple[np.ndarray, np.ndarray, np.ndarray]
"""One matching of a step: (src ranks, dst ranks, elements per flow)."""


def _rounds(plan: Plan, job: JobNodes) -> Iterator[tuple[int, int, Round]]:
    """(step index, round index, round) of every non-empty step, in order: the step itself
    if its flows form a matching, else its edge-coloured rounds."""
    # Whether a step's flows form a matching, by (src, dst) array identity (the plan keeps the
    # arrays alive, so ids are unique here): steps sharing arrays are checked once.
    matching: dict[tuple[int, int], bool] = {}
    splits: dict[tuple[int, int], StepSplit] = {}  # edge colourings, by array identity
    for step_index, step in enumerate(plan.steps):
        if not len(step):
            continue
        key = (id(step.src), id(step.dst))
        if key not in matching:
            matching[key] = step_is_matching(step.src, step.dst, job, step_index)
        if matching[key]:
            rounds = [(step.src, step.dst, step.length)]
        else:
            split = splits.get(key)
            if split is None:
                split = splits[key] = StepSplit.of(step, job)
            rounds = split.rounds(step)
        for round_index, r in enumerate(rounds):
            yield step_index, round_index, r


@dataclass(frozen=True)
class _Laid:
    """Slots laid end to end, with their totals."""

    slots: list[Slot]
    starts: list[float]
    end_s: float
    reconfigurations: int
    guard_total: float
    hold_total: float


def _lay_out(rounds: Iterator[tuple[int, int, Round]], job: JobNodes, held: np.ndarray,
             timing: TimingModel, itemsize: int, start_s: float) -> _Laid:
    """One slot per round, each starting where the previous one ended; `held` (the channel
    each transmitter holds) is updated as transmitters retune."""
    bits_per_elem = 8.0 * itemsize / timing.line_rate_bps
    guard_retune, guard_plain, margin = timing.guard_s, timing.skew_s, timing.slot_margin_s
    slots: list[Slot] = []
    starts: list[float] = []
    t = start_s
    guard_total = hold_total = 0.0
    reconfigurations = 0
    last: tuple[np.ndarray, np.ndarray] | None = None
    for step_index, round_index, (src, dst, elems) in rounds:
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
        slots.append(Slot(len(slots), step_index, round_index, t, data_start, end, guard, hold,
                          src, dst, elems, itemsize, retune_flows, retune_from, job))
        starts.append(t)
        reconfigurations += n_retunes
        guard_total += guard
        hold_total += hold
        t = end
    return _Laid(slots, starts, t, reconfigurations, guard_total, hold_total)


def _initial_held(job: JobNodes, initial: Mapping[str, int | None] | None) -> np.ndarray:
    held = np.full(len(job.node_ids), UNKNOWN_CHANNEL, dtype=np.int64)
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


def _channel_map(job: JobNodes, held: np.ndarray) -> dict[str, int | None]:
    return {
        n: (None if c == UNKNOWN_CHANNEL else c) for n, c in zip(job.node_ids, held.tolist(), strict=True)
    }
