"""Runs one collective at one node: plan steps, gated into schedule slots, over a link.

The plan says, per step, which element ranges every rank sends to whom and whether the
receiver adds them (reduce) or overwrites (copy). Sends read the buffer as it was at the start
of the step. Transfers move in chunks: a step's sends run on a sender thread while the
executor receives and reduces chunk by chunk into the bucket, in place. On the optical network every send waits for the data window of the slot whose
circuit reaches its destination (slot edges are local: t0 converted to this agent's clock plus
the slot's offset); on the ideal network sends go as soon as the data is ready. A receive that
has not arrived by its slot's end plus the receive timeout fails the collective with a clear
error rather than hanging.

The ``optinc`` collective (`run_optinc`) has no plan steps: the node agrees a per-tensor scale
with its peers through the OptINC device, quantises its bucket to b-bit levels, sends them to
the device in the upload slot and returns N × the decoded quantised mean the device broadcasts
(so ``allreduce`` returns the approximate SUM, like every other collective).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from agents.chunkplan import ChunkPlan, StepSpec, busiest_port_bytes, chunk_plan
from agents.dataplane import Frame, Link
from agents.gate import SlotGate
from agents.streams import CHUNK_BYTES, ChunkHead, node_tag
from common.errors import CollectiveError
from protos.schedule_wire import handoffs as slot_handoffs

logger = logging.getLogger(__name__)

REDUCE = "reduce"
COPY = "copy"
OPTINC = "optinc"
OPTINC_SCALE_STEP = 0  # drivers.emulators.optinc.SCALE_STEP
OPTINC_LEVELS_STEP = 1  # drivers.emulators.optinc.LEVELS_STEP


@dataclass(frozen=True)
class SlotSpec:
    """One slot as the agent needs it: times relative to t0, the (src, dst) node pairs and
    the source nodes whose transmitters retune at the start of this slot."""

    index: int
    step: int
    data_start_s: float
    end_s: float
    pairs: tuple[tuple[str, str], ...]
    retuning: frozenset[str] = frozenset()


INLINE_SEND = 256 << 10
"""Steps that send at most this many bytes send inline (the kernel's socket buffers take
them at once); bigger ones send on the sender thread while this thread receives."""


class ChunkLink(Protocol):
    """What the executor needs to move chunks (`agents.streams.StreamLink` and the
    ZeroMQ links of `agents.dataplane`)."""

    def send_chunk(self, job: str, dst: str, head: ChunkHead, payload: memoryview,
                   deadline_s: float, cancel: threading.Event | None = None,
                   optical: bool = False) -> None:
        """Send one chunk (on the optical network where the light goes); give up after
        `deadline_s` without progress or on cancel."""

    def recv_chunk(self, job: str, src: str, seq: int, step: int, deadline: float,
                   cancel: threading.Event | None = None, into: memoryview | None = None
                   ) -> tuple[ChunkHead, memoryview]:
        """The next chunk from `src` for (seq, step); CollectiveError at `deadline`. The
        payload may be read straight into `into` when it fits exactly."""


class Handoffs(Protocol):
    """The control channel for reconfigurations (one message per retune, none per flow)."""

    def wait_circuits(self, seq: int, slot: int, deadline: float) -> None:
        """Block until the controller grants a slot that changes circuits; raise
        CollectiveError if it reports a failure or does not answer by `deadline`."""

    def confirm(self, seq: int, slot: int, src: str) -> None:
        """Tell the controller a flow whose circuit changes next has arrived here."""


@dataclass
class CollectiveRun:
    """Everything one node needs to run one collective invocation."""

    job_id: str
    seq: int
    rank: int
    nodes: tuple[str, ...]
    steps: tuple[StepSpec, ...]
    slots: tuple[SlotSpec, ...] = ()
    t0_local: float = 0.0
    network: str = "optical"
    receive_timeout_s: float = 2.0
    line_rate_bps: float = 0.0
    """The ideal network's line rate: its wire time is the schedule receives are due by."""
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def gated(self) -> bool:
        """True when sends wait for their slots (the optical network)."""
        return self.network == "optical"


class _Either:
    """Set when this run gives up, or when the agent cancels the collective."""

    def __init__(self, outer: threading.Event | None):
        self._outer = outer
        self._own = threading.Event()

    def set(self) -> None:
        self._own.set()

    def is_set(self) -> bool:
        return self._own.is_set() or (self._outer is not None and self._outer.is_set())


def run_collective(run: CollectiveRun, buffer: np.ndarray, link: ChunkLink, gate: SlotGate,
                   cancel: threading.Event | None = None,
                   handoffs: Handoffs | None = None, *, inplace: bool = False,
                   sender: Executor | None = None) -> np.ndarray:
    """Execute `run` over `link` and return the result.

    With `inplace` the result is written into `buffer` (contiguous and writable), else into a
    copy. Each step cuts its transfers into chunks; the step's sends run on `sender` (a
    one-thread pool) while this thread receives and reduces chunk by chunk, so sending,
    receiving and reducing overlap. Small steps send inline.
    """
    flat = np.ascontiguousarray(buffer).reshape(-1)
    buf = flat if inplace else flat.copy()
    me = run.nodes[run.rank]
    to_confirm: set[tuple[int, str]] = set()
    granted: set[int] = set()
    if run.gated and handoffs is not None:
        pairs = [(s.index, [(a, b, a in s.retuning) for a, b in s.pairs]) for s in run.slots]
        needs = slot_handoffs(pairs)
        granted = set(needs)
        to_confirm = {(j, src) for need in needs.values() for j, src, dst in need if dst == me}
    slot_of: dict[tuple[int, str, str], SlotSpec] = {}
    step_end: dict[int, float] = defaultdict(float)
    for slot in run.slots:
        for pair in slot.pairs:
            slot_of[(slot.step, *pair)] = slot
        step_end[slot.step] = max(step_end[slot.step], slot.end_s)
    started = time.time()
    if not run.gated:
        # the ideal network has no slots: a step is due when every port has carried the
        # bytes of the steps so far at the line rate
        step_end.clear()
        t = 0.0
        for k, port_bytes in enumerate(busiest_port_bytes(tuple(run.steps), buf.itemsize)):
            t += 8.0 * port_bytes / run.line_rate_bps if run.line_rate_bps > 0 else 0.0
            step_end[k] = t
        run = replace(run, t0_local=started)
    stop = _Either(cancel)
    worst = [0.0]
    own_sender = sender is None
    if sender is None:
        sender = ThreadPoolExecutor(1, thread_name_prefix=f"{me}-send")
    chunk = max(1, CHUNK_BYTES // buf.itemsize)
    order = tuple(tuple(sorted({d for s, d in zip(st.src, st.dst, strict=True) if s == run.rank},
                               key=lambda d, k=k: _slot_start(slot_of, k, me, run.nodes[d])))
                  for k, st in enumerate(run.steps))
    plan = chunk_plan(tuple(run.steps), run.rank, chunk, order)
    # small collectives run step by step with inline sends: one thread, no hand-over per
    # chunk; large ones pipeline their chunks across steps on the sender thread
    biggest = max((sum(op.n for op in plan.sends if op.step == k) for k in range(len(run.steps))),
                  default=0) * buf.itemsize
    try:
        if plan.pipelined and biggest > INLINE_SEND:
            _run_pipelined(run, buf, link, gate, cancel, handoffs, sender, stop, worst,
                           slot_of, step_end, granted, to_confirm, plan)
        else:
            _run_steps(run, buf, link, gate, cancel, handoffs, sender, stop, worst, slot_of,
                       step_end, granted, to_confirm)
    finally:
        if own_sender:
            sender.shutdown(wait=True)
    run.stats["duration_s"] = time.time() - started
    run.stats["gate_error_max_s"] = worst[0]
    return buf.reshape(buffer.shape)


class _Progress:
    """How many send and receive chunks are done, for the two threads of a pipelined run."""

    def __init__(self, stop: _Either):
        self.sent = 0
        self.received = 0
        self.stop = stop
        self._cond = threading.Condition()

    def wait(self, attr: str, count: int) -> bool:
        """Block until `attr` reaches `count`; False when the run is given up."""
        if getattr(self, attr) >= count:
            return True
        with self._cond:
            while getattr(self, attr) < count:
                if self.stop.is_set():
                    return False
                self._cond.wait(0.05)
        return True

    def bump(self, attr: str) -> None:
        with self._cond:
            setattr(self, attr, getattr(self, attr) + 1)
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


def _run_pipelined(run: CollectiveRun, buf: np.ndarray, link: ChunkLink, gate: SlotGate,
                   cancel: threading.Event | None, handoffs: Handoffs | None,
                   sender: Executor, stop: _Either, worst: list[float],
                   slot_of: dict[tuple[int, str, str], SlotSpec], step_end: dict[int, float],
                   granted: set[int], to_confirm: set[tuple[int, str]], plan: ChunkPlan) -> None:
    """Every step at once, chunk by chunk: a send chunk goes (in its slot) as soon as the
    receive chunks it depends on are reduced, so a step starts before the previous one has
    ended and the slot edge never waits for the last reduction."""
    me = run.nodes[run.rank]
    progress = _Progress(stop)
    item = buf.itemsize

    def send_all() -> None:
        try:
            for op in plan.sends:
                dst = run.nodes[op.peer]
                if op.first and run.gated:
                    slot = slot_of.get((op.step, me, dst))
                    if slot is None:
                        raise CollectiveError(f"{me}: the schedule has no slot for step "
                                              f"{op.step} {me}->{dst}; the plan and schedule "
                                              "disagree")
                    edge = run.t0_local + slot.data_start_s
                    if slot.index in granted and handoffs is not None:
                        handoffs.wait_circuits(run.seq, slot.index,
                                               max(edge, time.time()) + run.receive_timeout_s)
                    if not progress.wait("received", op.after):
                        return
                    worst[0] = max(worst[0], gate.wait_until(edge, stop))
                elif not progress.wait("received", op.after):
                    return
                link.send_chunk(run.job_id, dst, ChunkHead(run.seq, op.step, op.offset,
                                                           op.n * item, node_tag(dst)),
                                memoryview(buf[op.offset:op.offset + op.n]).cast("B"),
                                run.receive_timeout_s, stop, run.gated)
                progress.bump("sent")
        except BaseException:
            stop.set()
            progress.wake()
            raise

    pending = sender.submit(send_all)
    try:
        for op in plan.recvs:
            src = run.nodes[op.peer]
            if not progress.wait("sent", op.after):
                break
            slot_end = _due(run, op.step, step_end)
            target = buf[op.offset:op.offset + op.n]
            copy = run.steps[op.step].op != REDUCE
            head, payload = link.recv_chunk(run.job_id, src, run.seq, op.step,
                                            slot_end + run.receive_timeout_s, stop,
                                            memoryview(target).cast("B") if copy else None)
            if head.offset != op.offset or head.nbytes != op.n * item:
                raise CollectiveError(
                    f"{me}: chunk from {src} step {op.step} of collective {run.seq} carries "
                    f"elements {head.offset}+{head.nbytes // item} ({head.nbytes} B), expected "
                    f"{op.offset}+{op.n} of {buf.dtype}; the peers disagree on the plan or the "
                    "dtype")
            if op.last and to_confirm and handoffs is not None:
                # the flow's light has done its work once its last chunk is in: confirm
                # before reducing it, so the controller's retune starts a reduction earlier
                slot = slot_of.get((op.step, src, me))
                if slot is not None and (slot.index, src) in to_confirm:
                    handoffs.confirm(run.seq, slot.index, src)
            data = np.frombuffer(payload, dtype=buf.dtype)
            if not copy:
                np.add(target, data, out=target)
            elif not np.may_share_memory(data, target):  # else read into it already
                target[...] = data
            progress.bump("received")
    except BaseException:
        stop.set()
        progress.wake()
        pending.exception()
        raise
    pending.result()  # the sender's error, if it failed first
    if stop.is_set() and cancel is not None and cancel.is_set():
        raise CollectiveError(f"{me}: collective {run.seq} of job {run.job_id} was cancelled")


def _run_steps(run: CollectiveRun, buf: np.ndarray, link: ChunkLink, gate: SlotGate,
               cancel: threading.Event | None, handoffs: Handoffs | None, sender: Executor,
               stop: _Either, worst: list[float], slot_of: dict[tuple[int, str, str], SlotSpec],
               step_end: dict[int, float], granted: set[int],
               to_confirm: set[tuple[int, str]]) -> None:
    me = run.nodes[run.rank]
    chunk = max(1, CHUNK_BYTES // buf.itemsize)
    for k, step in enumerate(run.steps):
        sends: dict[int, list[tuple[int, int]]] = defaultdict(list)
        recvs: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for s, d, off, length in zip(step.src, step.dst, step.offset, step.length, strict=True):
            if s == run.rank:
                sends[d].append((off, length))
            if d == run.rank:
                recvs[s].append((off, length))
        source = buf
        if _overlap(sends, recvs):
            source = buf.copy()  # snapshot: this step receives into ranges it also sends
        order = sorted(sends, key=lambda d: _slot_start(slot_of, k, me, run.nodes[d]))

        def send_step(k: int = k, order: list[int] = order, source: np.ndarray = source,
                      sends: dict[int, list[tuple[int, int]]] = sends) -> None:
            for d in order:
                dst = run.nodes[d]
                if run.gated:
                    slot = slot_of.get((k, me, dst))
                    if slot is None:
                        raise CollectiveError(f"{me}: the schedule has no slot for step {k} "
                                              f"{me}->{dst}; the plan and schedule disagree")
                    edge = run.t0_local + slot.data_start_s
                    if slot.index in granted and handoffs is not None:
                        handoffs.wait_circuits(run.seq, slot.index,
                                               max(edge, time.time()) + run.receive_timeout_s)
                    worst[0] = max(worst[0], gate.wait_until(edge, stop))
                tag = node_tag(dst)
                for off, n in sends[d]:
                    for o in range(off, off + n, chunk):
                        m = min(chunk, off + n - o)
                        link.send_chunk(run.job_id, dst, ChunkHead(
                            run.seq, k, o, m * buf.itemsize, tag),
                            memoryview(source[o:o + m]).cast("B"), run.receive_timeout_s, stop,
                            run.gated)
                logger.debug("%s seq %d step %d: sent to %s", me, run.seq, k, dst)

        big = sum(n for segs in sends.values() for _, n in segs) * buf.itemsize > INLINE_SEND
        pending: Future[None] | None = None
        if big and recvs:
            pending = sender.submit(send_step)
        else:
            send_step()
        try:
            for s, segs in recvs.items():
                src = run.nodes[s]
                _receive(run, k, src, segs, buf, step.op, link, stop, chunk, step_end)
                if to_confirm and handoffs is not None:
                    slot = slot_of.get((k, src, me))
                    if slot is not None and (slot.index, src) in to_confirm:
                        handoffs.confirm(run.seq, slot.index, src)
        except BaseException:
            stop.set()
            if pending is not None:
                pending.exception()  # wait for the sender to give up
            raise
        if pending is not None:
            pending.result()


def _receive(run: CollectiveRun, k: int, src: str, segs: list[tuple[int, int]],
             buf: np.ndarray, op: str, link: ChunkLink, stop: _Either, chunk: int,
             step_end: dict[int, float]) -> None:
    """Receive one peer's segments of step k chunk by chunk and apply each to `buf`, each
    chunk due by `_due` plus the receive timeout (the schedule, not how far this node has
    got)."""
    me = run.nodes[run.rank]
    for off, n in segs:
        for o in range(off, off + n, chunk):
            m = min(chunk, off + n - o)
            deadline = _due(run, k, step_end) + run.receive_timeout_s
            head, payload = link.recv_chunk(run.job_id, src, run.seq, k, deadline, stop)
            if head.offset != o or head.nbytes != m * buf.itemsize:
                raise CollectiveError(
                    f"{me}: chunk from {src} step {k} of collective {run.seq} carries elements "
                    f"{head.offset}+{head.nbytes // buf.itemsize} ({head.nbytes} B), expected "
                    f"{o}+{m} of {buf.dtype}; the peers disagree on the plan or the dtype")
            data = np.frombuffer(payload, dtype=buf.dtype)
            target = buf[o:o + m]
            if op == REDUCE:
                np.add(target, data, out=target)
            else:
                target[...] = data
    logger.debug("%s seq %d step %d: received from %s", me, run.seq, k, src)


def _due(run: CollectiveRun, k: int, step_end: dict[int, float]) -> float:
    """When step k's receives are due: its last slot's end on the optical network; on the
    ideal network the later of now and its end on the wire (both then get the receive
    timeout on top)."""
    if k not in step_end:
        return time.time()
    due = run.t0_local + step_end[k]
    return due if run.gated else max(time.time(), due)


def _overlap(sends: dict[int, list[tuple[int, int]]],
             recvs: dict[int, list[tuple[int, int]]]) -> bool:
    """True when a range this node receives into overlaps one it sends in the same step."""
    out = sorted(seg for segs in sends.values() for seg in segs)
    return any(o < ro + rn and ro < o + n for segs in recvs.values() for ro, rn in segs
               for o, n in out)


def _slot_start(slot_of: dict[tuple[int, str, str], SlotSpec], step: int, src: str, dst: str
                ) -> float:
    slot = slot_of.get((step, src, dst))
    return slot.data_start_s if slot else 0.0


# ---- optinc: quantise, send once to the OptINC device, decode the broadcast mean ----------


def optinc_level_dtype(bits: int) -> np.dtype:
    """Levels on the wire: uint8 up to 8 bits, else uint16."""
    return np.dtype(np.uint8) if bits <= 8 else np.dtype("<u2")


def optinc_scale(maxabs: float, bits: int) -> float:
    """The per-tensor scale every node uses: the agreed max|x| / (2**(bits−1) − 1), so that
    ±max|x| map to the levels 1 and 2**bits − 1 around the zero level 2**(bits−1)."""
    return maxabs / ((1 << (bits - 1)) - 1)


def _work_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype.itemsize > 4 else np.dtype(np.float32)


def optinc_encode(values: np.ndarray, bits: int, scale: float) -> np.ndarray:
    """Offset-binary levels ``clip(round(x/scale) + 2**(bits−1), 0, 2**bits − 1)`` (float32
    arithmetic for float32/float16 inputs, float64 otherwise), as `optinc_level_dtype`."""
    work = _work_dtype(values.dtype)
    q = np.divide(values, work.type(scale), dtype=work)
    np.rint(q, out=q)
    q += 1 << (bits - 1)
    np.clip(q, 0, (1 << bits) - 1, out=q)
    return q.astype(optinc_level_dtype(bits))


def optinc_decode_sum(levels: np.ndarray, bits: int, scale: float, n_nodes: int,
                      dtype: np.dtype) -> np.ndarray:
    """N × the value of mean levels: ``(level − 2**(bits−1)) · scale · N`` in `dtype` (one
    table look-up per element; the table is computed in float32, float64 for float64)."""
    work = _work_dtype(np.dtype(dtype))
    table = np.arange(1 << bits, dtype=work)
    table -= 1 << (bits - 1)
    table *= work.type(scale * n_nodes)
    return table.astype(dtype, copy=False)[levels]


def optinc_expected(arrays: Sequence[np.ndarray], bits: int) -> np.ndarray:
    """What optinc returns at every node when the device's optics are exact: the scale agreed
    from max|x| over all nodes, each node's levels, their round-half-up mean, decoded × N."""
    from offline.optinc.model import exact_mean

    flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    dtype = flat[0].dtype
    maxabs = max((float(np.max(np.abs(a))) for a in flat if a.size), default=0.0)
    if maxabs == 0.0:
        return np.zeros(np.shape(arrays[0]), dtype=dtype)
    scale = optinc_scale(maxabs, bits)
    levels = np.stack([optinc_encode(a, bits, scale) for a in flat], axis=1)
    mean = exact_mean(levels)
    return optinc_decode_sum(mean, bits, scale, len(flat), dtype).reshape(np.shape(arrays[0]))


def run_optinc(run: CollectiveRun, buffer: np.ndarray, link: Link, gate: SlotGate,
               device: str, bits: int, cancel: threading.Event | None = None) -> np.ndarray:
    """Run one optinc all-reduce at this node; return N × the device's quantised mean.

    1. Scale (in the launch margin, before the upload slot): send max|x| to the device, which
       answers the maximum over the N nodes; a gradient with NaN/Inf is announced as bad
       instead, and the device refuses the collective at every node — no data is sent.
    2. Upload: the b-bit levels (scale in the header) to the device in the data window of
       slot 0; the device broadcasts the Q(mean) levels (slot 1), which are decoded × N.
    """
    x = np.ascontiguousarray(buffer).reshape(-1)
    me = run.nodes[run.rank]
    if x.dtype.kind != "f":
        raise CollectiveError(f"{me}: optinc all-reduces floating-point arrays, not {x.dtype}; "
                              "use ring for integers")
    started = time.time()
    base = {"job": run.job_id, "seq": run.seq, "src": me, "dst": device, "net": OPTINC,
            "rank": run.rank, "nodes": list(run.nodes)}
    maxabs = max(float(x.max()), -float(x.min())) if x.size else 0.0  # NaN if any is NaN
    head = {**base, "step": OPTINC_SCALE_STEP}
    if math.isfinite(maxabs):
        head["maxabs"] = maxabs
    else:
        at = int(np.flatnonzero(~np.isfinite(x))[0])
        head["bad"] = f"its gradient contains NaN or Inf (first at element {at}: {x[at]})"
    up = run.slots[0] if run.slots else None
    down = run.slots[1] if len(run.slots) > 1 else up
    link.send(head, b"")
    if run.gated and up is not None:
        deadline = run.t0_local + up.data_start_s + run.receive_timeout_s
    else:
        deadline = time.time() + run.receive_timeout_s
    reply = _take_optinc(link, run, OPTINC_SCALE_STEP, device, deadline, cancel)
    agreed = float(reply.header.get("maxabs", math.nan))
    if not (math.isfinite(agreed) and agreed >= 0):
        raise CollectiveError(f"{me}: {device} agreed no usable scale ({agreed})")
    if agreed == 0.0:  # every node holds zeros; all skip the upload alike
        run.stats["duration_s"] = time.time() - started
        return np.zeros_like(buffer)
    scale = optinc_scale(agreed, bits)
    levels = optinc_encode(x, bits, scale)
    worst_gate = 0.0
    if run.gated and up is not None:
        worst_gate = gate.wait_until(run.t0_local + up.data_start_s, cancel)
    link.send({**base, "step": OPTINC_LEVELS_STEP, "bits": bits, "elems": int(x.size),
               "scale": scale, "dtype": levels.dtype.str}, memoryview(levels.view(np.uint8)))
    if run.gated and down is not None:
        deadline = run.t0_local + down.end_s + run.receive_timeout_s
    else:
        deadline = time.time() + run.receive_timeout_s
    reply = _take_optinc(link, run, OPTINC_LEVELS_STEP, device, deadline, cancel)
    h = reply.header
    if (h.get("bits"), h.get("elems"), h.get("scale"), h.get("dtype")) != (
            bits, int(x.size), scale, levels.dtype.str):
        raise CollectiveError(f"{me}: {device} answered bits {h.get('bits')}, {h.get('elems')} "
                              f"elements, scale {h.get('scale')}, {h.get('dtype')}; expected "
                              f"{bits}, {x.size}, {scale}, {levels.dtype.str}")
    mean = np.frombuffer(reply.payload, dtype=levels.dtype)
    if mean.size != x.size:
        raise CollectiveError(f"{me}: {device} answered {mean.size} levels, expected {x.size}")
    out = optinc_decode_sum(mean, bits, scale, len(run.nodes), x.dtype)
    run.stats["duration_s"] = time.time() - started
    run.stats["gate_error_max_s"] = worst_gate
    return out.reshape(buffer.shape)


def _take_optinc(link: Link, run: CollectiveRun, step: int, device: str, deadline: float,
                 cancel: threading.Event | None) -> Frame:
    """The device's answer to one round, or CollectiveError (its refusal, lost data, cancel)."""
    me = run.nodes[run.rank]
    frame = link.inbox.take((run.job_id, run.seq, step, device), deadline, cancel)
    if frame is None:
        if cancel is not None and cancel.is_set():
            raise CollectiveError(f"{me}: collective {run.seq} of job {run.job_id} was cancelled")
        what = "scale" if step == OPTINC_SCALE_STEP else "averaged levels"
        raise CollectiveError(
            f"{me}: lost data: no {what} from OptINC device {device} for collective {run.seq} "
            f"(job {run.job_id}) by the end of its slot + {run.receive_timeout_s:.1f} s; a peer "
            "failed or the fabric has no such device (check `oddl status` and the emulator log)")
    if frame.header.get("error"):
        raise CollectiveError(str(frame.header["error"]))
    return frame
