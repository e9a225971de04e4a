"""Repeated collectives without the controller's barrier (decision records 0007, 0010, 0022).

After the first collective of a bucket size the agents keep its schedule ("standing"), OptINC
excepted, when it leaves every transmitter on the channel it starts on (a ring retunes nothing;
halving-doubling retunes and comes back; WRHT and the parameter server do not, so they keep
the barrier). For the next collective each agent tells its peers, over the data streams, that
it is ready (its bucket's size and dtype, the time on the controller's clock, whether it holds
the standing schedule, and its caller's step number and call). Calls with different step
numbers are refused on every node (`oddl.common.pairing`). A node that finds a peer's ready for a
later collective is behind (it restarted, or gave up collectives its peers counted): it takes
the peer's sequence number and says it is ready again, so the nodes meet on the latest one.

When every node holds the schedule, all start at the same t0, computed alike everywhere
(`agree`): the last node's ready time, plus `[timing] standing_margin_ms` when the schedule
retunes (every sender must have stopped before a laser moves), with no margin when it retunes
nothing (0022: its circuits are up for the whole run, the data paces it). Otherwise (a
restarted agent, another size) they all enter the controller's barrier as before. The
controller stays the only authority over the devices: for a schedule that retunes, rank 0
announces the start (`StartStanding`) and the controller executes the retunes from its own
device state, or refuses when its schedule differs from the agents' (0010).
"""
from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oddl.agents.clock import wall as wallclock
from oddl.agents.links.stream_wire import READY_STEP, ChunkHead, PeerAhead, node_tag
from oddl.common.collective_kinds import ALL_REDUCE, call_mismatch
from oddl.common.errors import CollectiveError, StepMismatch, StepPassed
from oddl.common.pairing import step_mismatch, step_passed
from oddl.protos import oddl_pb2 as pb
from oddl.protos.schedule_wire import schedule_sha256


@dataclass(frozen=True)
class Ready:
    """One node's word that it is ready for collective `seq`."""

    node: str
    elements: int
    dtype: str
    ready_s: float
    standing: bool
    step: int = 0
    """The caller's step number (0: none given)."""
    call: tuple[str, str, int] = (ALL_REDUCE, "sum", 0)
    """The caller's (kind, op, root) (`oddl.common.collective_kinds`)."""

    def encode(self) -> bytes:
        return json.dumps({"n": self.elements, "dtype": self.dtype, "ready": self.ready_s,
                           "standing": self.standing, "step": self.step,
                           "call": list(self.call)}).encode()

    @staticmethod
    def decode(node: str, raw: bytes | memoryview) -> Ready:
        try:
            d = json.loads(bytes(raw))
            kind, op, root = d.get("call", (ALL_REDUCE, "sum", 0))
            return Ready(node, int(d["n"]), str(d["dtype"]), float(d["ready"]),
                         bool(d["standing"]), int(d.get("step", 0)),
                         (str(kind), str(op), int(root)))
        except (ValueError, KeyError, TypeError) as exc:
            raise CollectiveError(f"a malformed ready message from {node} ({exc})") from exc


def exchange(link: Any, job: str, seq: int, mine: Ready, peers: Sequence[str],
             deadline: float, cancel: threading.Event | None) -> list[Ready]:
    """Send `mine` to every peer and return theirs. PeerAhead when a peer is already at a later
    collective, or when its ready here is for an earlier step than this call's (a call it
    gave up); CollectiveError at `deadline` naming every peer that did not say it is ready."""
    body = mine.encode()
    for peer in peers:
        link.send_chunk(job, peer, ChunkHead(seq, READY_STEP, 0, len(body), node_tag(peer)),
                        memoryview(body), max(deadline - wallclock.now(), 0.1), cancel, False)
    out: list[Ready] = []
    silent: list[str] = []
    for peer in peers:
        try:
            _head, raw = link.recv_chunk(job, peer, seq, READY_STEP,
                                         deadline if not silent else wallclock.now(), cancel)
        except PeerAhead:
            raise
        except CollectiveError:
            if cancel is not None and cancel.is_set():
                raise
            silent.append(peer)
            continue
        ready = Ready.decode(peer, raw)
        if 0 < ready.step < mine.step:
            # the ready of a call the peer made before this one, at this number: it gave that
            # call up (and the number with it), so it is at the next one at least
            raise PeerAhead(f"{mine.node}: {peer}'s ready for collective {seq} of job {job} "
                            f"is for its step {ready.step}, before this call's step "
                            f"{mine.step}", peer, seq + 1, ready.step)
        out.append(ready)
    if silent:
        raise CollectiveError(
            f"{mine.node}: {', '.join(silent)} did not say it is ready for collective {seq} of "
            f"job {job} (step {mine.step or '?'} here) in time: its training process has not "
            "made this call (every rank must make every call of the job, in the same order) "
            "or its agent or host cannot be reached (`oddl status`)")
    return out


def agree(job: str, seq: int, mine: Ready, theirs: Sequence[Ready], margin_s: float
          ) -> tuple[bool, float]:
    """(every node holds the standing schedule for the same bucket, the start time on the
    controller's clock). StepPassed when another rank is past this call's step, StepMismatch
    when the callers' step numbers otherwise differ, or their calls (kind, op, root). Different
    buckets go to the controller's barrier, which refuses them with the whole story."""
    everyone = (mine, *theirs)
    steps = {r.node: r.step for r in everyone}
    passed = step_passed(job, seq, mine.node, steps)
    if passed:
        raise StepPassed(passed)
    mismatch = step_mismatch(job, seq, steps) or call_mismatch(
        job, seq, {r.node: r.call for r in everyone})
    if mismatch:
        raise StepMismatch(f"{mine.node}: {mismatch}")
    same = all((r.elements, r.dtype) == (mine.elements, mine.dtype) for r in theirs)
    return same and all(r.standing for r in everyone), \
        max(r.ready_s for r in everyone) + margin_s


def start_request(node: str, job: str, seq: int, t0: float, array: Any, schedule: pb.Schedule,
                  call: tuple[str, str, int]) -> pb.StartStandingRequest:
    """The agreed start of a standing collective that retunes, for the controller (sent
    without waiting: its first retune is a slot away, and a refusal or a lost message fails
    the collective where the agents wait for the retune). Every node computes the same
    start, so one (rank 0) says it: four copies would cost the controller CPU at the moment
    the agents need it for their first sends."""
    return pb.StartStandingRequest(node_id=node, job_id=job, seq=seq, t0_ns=round(t0 * 1e9),
                                   message_bytes=array.nbytes, itemsize=array.dtype.itemsize,
                                   schedule_sha256=schedule_sha256(schedule), kind=call[0],
                                   root=call[2])
