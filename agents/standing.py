"""Repeated collectives without a round trip to the controller.

A collective whose schedule retunes nothing (a ring keeps its circuits for the whole job)
needs the controller only for its schedule and its start time. After the first collective of a
bucket size the agents keep that schedule ("standing"); for the next one each agent tells its
peers, over the data streams, that it is ready (its bucket's size and dtype, the time on the
controller's clock, and whether it holds the standing schedule). When every node holds it, all
start at the same t0 = the last node's ready time + a small margin, computed alike everywhere;
otherwise (a restarted agent, another size) they all enter the controller's barrier as before.
The controller stays the only authority over the devices: a standing schedule changes none.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agents import wallclock
from agents.stream_wire import ChunkHead, node_tag
from common.errors import CollectiveError

READY_STEP = 0xFFFFFFF0
"""The step number of the ready message: after every data step, so the chunks of an older
collective still count as older."""


@dataclass(frozen=True)
class Ready:
    """One node's word that it is ready for collective `seq`."""

    node: str
    elements: int
    dtype: str
    ready_s: float
    standing: bool

    def encode(self) -> bytes:
        return json.dumps({"n": self.elements, "dtype": self.dtype, "ready": self.ready_s,
                           "standing": self.standing}).encode()

    @staticmethod
    def decode(node: str, raw: bytes | memoryview) -> Ready:
        try:
            d = json.loads(bytes(raw))
            return Ready(node, int(d["n"]), str(d["dtype"]), float(d["ready"]),
                         bool(d["standing"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CollectiveError(f"a malformed ready message from {node} ({exc})") from exc


def exchange(link: Any, job: str, seq: int, mine: Ready, peers: Sequence[str],
             deadline: float, cancel: threading.Event | None) -> list[Ready]:
    """Send `mine` to every peer and return theirs (CollectiveError at `deadline`)."""
    body = mine.encode()
    for peer in peers:
        link.send_chunk(job, peer, ChunkHead(seq, READY_STEP, 0, len(body), node_tag(peer)),
                        memoryview(body), max(deadline - wallclock.now(), 0.1), cancel, False)
    out = []
    for peer in peers:
        try:
            _head, raw = link.recv_chunk(job, peer, seq, READY_STEP, deadline, cancel)
        except CollectiveError as exc:
            if cancel is not None and cancel.is_set():
                raise
            raise CollectiveError(
                f"{mine.node}: {peer} did not say it is ready for collective {seq} of job {job} "
                "in time: its training process has not called the collective (every node of "
                "the job must, in the same order) or its agent cannot be reached "
                f"(`oddl status`); {exc}") from exc
        out.append(Ready.decode(peer, raw))
    return out


def agree(mine: Ready, theirs: Sequence[Ready], margin_s: float) -> tuple[bool, float]:
    """(every node holds the standing schedule for the same bucket, the start time on the
    controller's clock). Different buckets go to the controller's barrier, which refuses
    them with the whole story."""
    everyone = (mine, *theirs)
    same = all((r.elements, r.dtype) == (mine.elements, mine.dtype) for r in theirs)
    return same and all(r.standing for r in everyone), \
        max(r.ready_s for r in everyone) + margin_s

