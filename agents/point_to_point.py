"""Point-to-point flows at the agents: a training process's `send` and `recv`.

A send is a flow from this node to one other node of the job, on its own circuit: the agent
asks the controller for it (`RequestFlow`: the controller tunes this node's transmitter to the
receiver's channel if it is elsewhere, and grants a window free at both ends), waits for the
window on the slot gate, and sends a small header (the flow's bytes and dtype) and the data
on a stream of their own per tag: a flow up to `INLINE_BYTES` in one chunk, so that it is on
the wire inside its window or not at all, a bigger one as chunks of the flow's number. A
sender that starts later than the margin after its window's start (where the next sender
into the same receiver may begin: their light would collide there) leaves the window
unused and asks for another, opening further ahead (`next_lead_s`): on a loaded host the
grant's reply alone can take longer than the margin, every time. It returns once the data
is on its way, as gloo's send does; the receiver does not take part in the grant.

A receive takes the next flow from the sender on that tag, in order, into the caller's
array: its header must name the array's bytes and dtype, or the receive fails naming both
(and the flow is drained, so the next one starts clean). Flow numbers only grow
(`oddl.controller.flow_book`): a receiver that restarted takes up the sender's next number
(`PeerAhead`), and a leftover of an abandoned flow (a lower number) is dropped.

A flow that moved this node's laser leaves every standing schedule of this node's jobs
assuming circuits that are gone: they are dropped, so the next collective of each meets at
the controller's barrier, which lays its circuits out again.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from oddl.agents.agent_jobs import AgentJob
from oddl.agents.clock import wall as wallclock
from oddl.agents.links.stream_wire import CHUNK_BYTES, READY_STEP, ChunkHead, PeerAhead, node_tag
from oddl.agents.links.streams import StreamLink
from oddl.agents.local_api.wire import AllreduceRequest
from oddl.agents.slot_gate import SlotGate
from oddl.common.errors import CollectiveError, OperationRefused
from oddl.protos import oddl_pb2 as pb

FLOW_STEP = 0
"""The step number of a flow's data chunks (its header travels as READY_STEP)."""
ANY_SOURCE_POLL_S = 0.5e-3
"""How often a receive from any source looks at every sender's stream again."""
INLINE_BYTES = 64 << 10
"""A flow up to this size travels as one chunk, its header and data together: it is on the
wire inside its window or not at all (a header and a data chunk sent apart could straddle
the next sender's window into the same receiver, and the two collide there)."""
WINDOW_TRIES = 10
"""How many windows a sender asks for before it gives a flow up as too late for each."""
MAX_LEAD_S = 0.5
"""The furthest ahead a sender asks a window to open (the controller takes up to 1 s)."""


def next_lead_s(lead_s: float, late_s: float | None, slack_s: float) -> float:
    """How far ahead of its grant the next window should open, after one that opened
    `lead_s` ahead: a window missed by `late_s` s (None: kept) asks for twice the lead and
    the lateness together, so a host late by a steady amount catches up in one or two
    windows; a window kept with `slack_s` s to wait gives half that slack back."""
    if late_s is not None:
        return min(MAX_LEAD_S, 2.0 * (lead_s + late_s))
    return max(0.0, lead_s - max(0.0, slack_s) / 2.0)


def flow_label(job_id: str, session: str, tag: int) -> str:
    """The stream a job's flows of one session and tag travel on (each in order). A session
    (the torch backend draws one per process group) keeps a flow its run left unreceived
    from pairing with a receive of the next run."""
    return f"{job_id}/p2p/{session}/{tag}"


Header = tuple[int, dict[str, Any], bytes | None]
"""A flow's number, its header, and its data when it travelled in the header's chunk."""


class FlowControl(Protocol):
    """What a sender needs of the controller link."""

    def request_flow(self, job_id: str, dst: str, message_bytes: int, tag: int,
                     timeout_s: float, lead_s: float) -> pb.FlowGrant:
        """The grant of a flow to `dst`, its window opening no sooner than `lead_s` on."""

    @property
    def clock(self) -> Any:
        """The controller-minus-agent clock estimate (`offset_s`)."""


class Flows:
    """Sends and receives of one agent."""

    def __init__(self, node_id: str, control: FlowControl, link: Any, gate: SlotGate,
                 margin_s: float = 0.0):
        self.node_id = node_id
        self.control = control
        self.link = link
        self.gate = gate
        self.margin_s = margin_s
        """What the controller leaves after each window before the next one into the same
        receiver (slot margin and clock skew): a sender starting later than this past its
        window's start may collide with the next sender, so it asks for a new window."""
        self.lead_s = 0.0
        """How far ahead of its grant this sender asks its next window to open
        (`next_lead_s`, learned from the windows it kept and missed)."""
        self._expected: dict[tuple[str, str], int] = {}
        """Per (stream, sender): the number after the last flow taken from it."""
        self._lock = threading.Lock()
        self.sent = self.received = self.retuned = self.missed_windows = 0

    def _check(self, job: AgentJob, peer_rank: int | None, what: str) -> str:
        """The peer's node (none for a receive from any rank); OperationRefused for a peer
        outside the job or this node, or data links that carry no flows."""
        if not isinstance(self.link, StreamLink):
            raise OperationRefused(
                f"{self.node_id}: {what} needs the agents' stream data path; this agent runs "
                "ZeroMQ data links (`[fabric] transport` relay or curve), which carry "
                "collectives only: use transport = \"streams\" for point-to-point")
        if peer_rank is None:
            return ""
        if not 0 <= peer_rank < len(job.nodes) or job.nodes[peer_rank] == self.node_id:
            raise OperationRefused(
                f"{self.node_id}: {what} rank {peer_rank}: the peer must be another rank of job "
                f"{job.id} (0..{len(job.nodes) - 1}, this node is rank {job.rank})")
        return job.nodes[peer_rank]

    def serve(self, req: AllreduceRequest, array: np.ndarray, job: AgentJob,
              jobs: Iterable[AgentJob], resolved: dict[str, Any]) -> np.ndarray:
        """Run a training process's send or receive; the received array (a send: none).
        A receive from any source puts the sender's rank into `resolved` (the reply's)."""
        if req.kind == "send":
            self.send(job, req.root, req.tag, req.session, array, req.timeout_s, jobs)
            return np.empty(0, array.dtype)
        out = array if array.flags.writeable else np.empty(req.shape, req.dtype)
        if req.kind == "recv_any":
            out, source = self.recv_any(job, req.tag, req.session, out, req.timeout_s)
            resolved["source"] = source  # told back to the client
            return out
        return self.recv(job, req.root, req.tag, req.session, out, req.timeout_s)

    # ---- sending ------------------------------------------------------------------------
    def send(self, job: AgentJob, dst_rank: int, tag: int, session: str, array: np.ndarray,
             timeout_s: float, jobs: Iterable[AgentJob]) -> None:
        """Send `array` to rank `dst_rank` of `job` on (`tag`, `session`) in a window the
        controller granted."""
        dst = self._check(job, dst_rank, "send to")
        if array.nbytes == 0:
            raise OperationRefused(f"{self.node_id}: a send of 0 bytes to {dst}; send data")
        label = flow_label(job.id, session, tag)
        meta = json.dumps({"bytes": array.nbytes, "dtype": array.dtype.str,
                           "shape": list(array.shape)}).encode()
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
        optical = job.network == "optical"
        number = self._window(job, dst, array.nbytes, tag, timeout_s, jobs, optical)
        deadline_s = max(timeout_s, 1.0)
        if len(data) <= INLINE_BYTES:  # one chunk: the header's length as its offset
            self.link.send_chunk(label, dst, ChunkHead(number, READY_STEP, len(meta),
                                                       len(meta) + len(data), node_tag(dst)),
                                 memoryview(meta + bytes(data)), deadline_s, None, optical)
        else:
            self.link.send_chunk(label, dst, ChunkHead(number, READY_STEP, 0, len(meta),
                                                       node_tag(dst)),
                                 memoryview(meta), deadline_s, None, optical)
            for offset in range(0, len(data), CHUNK_BYTES):
                part = data[offset:offset + CHUNK_BYTES]
                self.link.send_chunk(label, dst, ChunkHead(number, FLOW_STEP, offset,
                                                           len(part), node_tag(dst)),
                                     part, deadline_s, None, optical)
        self.sent += 1

    def _window(self, job: AgentJob, dst: str, nbytes: int, tag: int, timeout_s: float,
                jobs: Iterable[AgentJob], optical: bool) -> int:
        """The number of a granted flow whose window this node is in now: wait for its
        start; a window missed (this node started later than the margin after it, where the
        next sender into `dst` may begin) is left unused and another asked for."""
        for _ in range(WINDOW_TRIES):
            lead_s = self.lead_s
            grant = self.control.request_flow(job.id, dst, nbytes, tag, timeout_s, lead_s)
            if grant.retuned:  # this node's laser moved: no standing schedule of it holds
                for each in jobs:
                    each.standing.clear()
                self.retuned += 1
            t0_local = grant.t0_ns / 1e9 - self.control.clock.offset_s
            slack_s = t0_local - wallclock.now()
            if slack_s > 0:  # a window after another flow's, or ahead as asked: wait for it
                self.gate.wait_until(t0_local)
            late_s = wallclock.now() - t0_local
            kept = not optical or late_s <= self.margin_s
            self.lead_s = next_lead_s(lead_s, None if kept else late_s, slack_s)
            if kept:
                return int(grant.flow)
            self.missed_windows += 1  # its number is never sent: the receiver skips it
        raise CollectiveError(
            f"{self.node_id}: a flow to {dst} of job {job.id} missed {WINDOW_TRIES} windows in "
            f"a row (this node started each more than {self.margin_s * 1e3:.1f} ms late): "
            "nothing was sent. The host is too loaded to keep its windows; free CPU for the "
            "agent, or raise [timing] slot_margin_us")

    # ---- receiving ----------------------------------------------------------------------
    def recv(self, job: AgentJob, src_rank: int, tag: int, session: str, out: np.ndarray,
             timeout_s: float) -> np.ndarray:
        """The next flow from rank `src_rank` of `job` on (`tag`, `session`), into `out`."""
        src = self._check(job, src_rank, "receive from")
        label = flow_label(job.id, session, tag)
        deadline = wallclock.now() + timeout_s
        header = self._header(label, src, deadline)
        if header is None:
            raise CollectiveError(
                f"{self.node_id}: nothing from {src} on tag {tag} of job {job.id} in time: its "
                "training process has not sent it (every receive needs the peer's send, in "
                "order per tag) or its agent cannot be reached (`oddl status`)")
        return self._take(job, src, tag, label, header, out, deadline)

    def recv_any(self, job: AgentJob, tag: int, session: str, out: np.ndarray,
                 timeout_s: float) -> tuple[np.ndarray, int]:
        """The first flow from any rank of `job` on (`tag`, `session`), into `out`; with the
        rank it came from."""
        self._check(job, None, "a receive from any rank")
        label = flow_label(job.id, session, tag)
        deadline = wallclock.now() + timeout_s
        peers = [n for n in job.nodes if n != self.node_id]
        while True:
            for src in peers:
                header = self._header(label, src, wallclock.now())  # only what is here now
                if header is not None:
                    return (self._take(job, src, tag, label, header, out, deadline),
                            job.nodes.index(src))
            if wallclock.now() > deadline:
                raise CollectiveError(
                    f"{self.node_id}: nothing from any rank ({', '.join(peers)}) on tag {tag} "
                    f"of job {job.id} in {timeout_s:g} s: no training process sent to this "
                    "rank, or the flow was lost on the way (a sender's log names where its "
                    "light went)")
            time.sleep(ANY_SOURCE_POLL_S)

    def _take(self, job: AgentJob, src: str, tag: int, label: str,
              header: Header, out: np.ndarray, deadline: float) -> np.ndarray:
        """The data of the flow whose header was taken, into `out` (or a failure naming both
        sizes, the flow drained)."""
        number, meta, inline = header
        with self._lock:
            self._expected[(label, src)] = number + 1
        if meta.get("bytes") != out.nbytes or meta.get("dtype") != out.dtype.str:
            if inline is None:
                self._drain(label, src, number, int(meta.get("bytes", 0)), deadline)
            raise CollectiveError(
                f"{self.node_id}: rank {job.nodes.index(src)} ({src}) sent {meta.get('bytes')} "
                f"B of {meta.get('dtype')} on tag {tag} of job {job.id}, and this receive takes "
                f"{out.nbytes} B of {out.dtype.str}: a send and its receive must name the same "
                "shape and dtype (they pair in order per sender and tag)")
        target = out.reshape(-1).view(np.uint8).data
        if inline is not None:  # the data came with the header, in one chunk
            if len(inline) != out.nbytes:
                raise CollectiveError(f"{self.node_id}: the flow from {src} carries "
                                      f"{len(inline)} B, its header says {out.nbytes}")
            target[:] = inline
            self.received += 1
            return out
        got = 0
        while got < out.nbytes:
            head, payload = self.link.recv_chunk(label, src, number, FLOW_STEP, deadline)
            if head.offset + head.nbytes > out.nbytes:
                raise CollectiveError(f"{self.node_id}: a chunk of the flow from {src} lies "
                                      f"past its {out.nbytes} B ({head.offset}+{head.nbytes})")
            target[head.offset:head.offset + head.nbytes] = payload
            got += head.nbytes
        self.received += 1
        return out

    def _header(self, label: str, src: str, deadline: float) -> Header | None:
        """(number, header, the data when it came in the same chunk) of the next flow from
        `src` on `label` by `deadline` (None when none came): the first at or above the
        number this agent expects next (a later one when the sender is ahead of what this
        agent has seen, e.g. after a restart)."""
        with self._lock:
            expected = self._expected.get((label, src), 1)
        while True:
            try:
                head, raw = self.link.recv_chunk(label, src, expected, READY_STEP, deadline)
            except PeerAhead as ahead:
                expected = ahead.seq
                continue
            except CollectiveError:
                return None
            # a header of its own, or (offset > 0) the header's length and the data after it
            cut = head.offset if 0 < head.offset <= len(raw) else len(raw)
            try:
                meta = json.loads(bytes(raw[:cut]))
                if not isinstance(meta, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                raise CollectiveError(f"{self.node_id}: a malformed flow header from {src} "
                                      f"({exc})") from exc
            return head.seq, meta, bytes(raw[cut:]) if head.offset else None

    def _drain(self, label: str, src: str, number: int, nbytes: int, deadline: float) -> None:
        """Read and drop the data of flow `number` (its receive failed)."""
        got = 0
        while got < nbytes:
            head, _payload = self.link.recv_chunk(label, src, number, FLOW_STEP, deadline)
            got += head.nbytes
