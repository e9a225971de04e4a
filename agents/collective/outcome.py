"""Every rank ends a collective alike: the outcome round.

A collective can fail at one node and succeed at another: a node that received all its chunks
returns the sum while a peer whose last chunk was lost, or whose link went down, fails. Its
training process then retries the step while the others go on, and the ranks stay a step
apart. So before a node hands a result back, it tells every peer its outcome (one small
message on the data streams, outside the slots) and waits for theirs: the collective succeeds
only where every node succeeded, and a node that failed tells the others at once, so a peer
still waiting for data, from it or from any other node, stops waiting and fails with the
reason (and the type where the ranks' calls differ, `CallsDiffer`). A node that dies before
saying anything is caught by the controller's verdict (its peers' collective is cancelled) or
by the deadline.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from oddl.agents.clock import wall as wallclock
from oddl.agents.links.stream_wire import (
    DONE_STEP,
    ChunkHead,
    PeerCallsDiffer,
    PeerGaveUp,
    node_tag,
)
from oddl.common.collective_kinds import describe
from oddl.common.errors import CallsDiffer, CollectiveError

MAX_REASON = 2000
"""Characters of a failure's reason that travel to the peers."""


Call = tuple[str, str, int]
"""(kind, op, root) of the call a node ran (`oddl.common.collective_kinds`)."""


_BINARY = struct.Struct("<4sBBi")
"""The outcome message: magic, succeeded, flags (`HAS_CALL`, `CALLS_DIFFER`), the call's
root; then kind, op and reason in UTF-8, separated by NULs (no JSON to build or parse per
call)."""
MAGIC = b"ODO1"
HAS_CALL = 1
"""Flag: the message names the call the node ran."""
CALLS_DIFFER = 2
"""Flag: the node failed because the ranks' calls differ (`CallsDiffer`). An older oddl
reads the flags as "a call follows", which it ignores in a failure."""


class Said(NamedTuple):
    """What a peer's outcome message says."""

    ok: bool
    reason: str
    call: Call | None
    """The call it ran, if it says (a success from oddl since the outcome named calls)."""
    calls_differ: bool = False
    """It failed because the ranks' calls differ."""


def encode(ok: bool, reason: str = "", call: Call | None = None,
           calls_differ: bool = False) -> bytes:
    """The outcome message's payload."""
    kind, op, root = call if call is not None else ("", "", 0)
    flags = HAS_CALL * (call is not None) | CALLS_DIFFER * calls_differ
    return _BINARY.pack(MAGIC, ok, flags, root) + \
        f"{kind}\0{op}\0{reason[:MAX_REASON]}".encode()


def decode(node: str, raw: bytes | memoryview) -> Said:
    """What a peer's outcome message says (an older oddl's JSON one too); CollectiveError if
    malformed."""
    try:
        if bytes(raw[:4]) != MAGIC:
            return _decode_json(raw)
        _magic, ok, flags, root = _BINARY.unpack_from(raw)
        kind, op, reason = bytes(raw[_BINARY.size:]).decode().split("\0", 2)
        return Said(bool(ok), reason, (kind, op, root) if flags & HAS_CALL else None,
                    bool(flags & CALLS_DIFFER))
    except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
        raise CollectiveError(f"a malformed outcome message from {node} ({exc}); run the "
                              "same oddl version on every host") from exc


def _decode_json(raw: bytes | memoryview) -> Said:
    """An outcome message in JSON, as oddl sent it before `MAGIC`."""
    d = json.loads(bytes(raw))
    call = d.get("call")
    return Said(bool(d["ok"]), str(d.get("reason", "")),
                None if call is None else (str(call[0]), str(call[1]), int(call[2])))


def gave_up(me: str, peer: str, job: str, seq: int, said: Said) -> PeerGaveUp:
    """The error of a node whose peer failed the collective (`PeerCallsDiffer` when it
    failed because the ranks' calls differ)."""
    kind = PeerCallsDiffer if said.calls_differ else PeerGaveUp
    return kind(f"{me}: collective {seq} of job {job} failed at {peer}, so it fails on "
                f"every rank: {said.reason}")


def failure_queued(me: str, job: str, seq: int,
                   queues: Iterable[tuple[str, Iterable[tuple[ChunkHead, Any, float]]]]
                   ) -> PeerGaveUp | None:
    """The failure of collective `seq` that a peer announced in one of its queued chunks
    ((peer, its stream's queue) pairs), if one did: the collective fails at every node, so
    a node waiting for another peer's data stops waiting at once."""
    for peer, queue in queues:
        for head, buf, _arrived in queue:
            if head.seq == seq and head.step == DONE_STEP:
                said = decode(peer, memoryview(buf)[:head.nbytes])
                if not said.ok:
                    return gave_up(me, peer, job, seq, said)
    return None


def announce(link: Any, job: str, seq: int, peers: Sequence[str], ok: bool, reason: str,
             deadline: float, call: Call | None = None, calls_differ: bool = False) -> None:
    """Tell every peer this node's outcome of collective `seq` (outside the slots)."""
    body = encode(ok, reason, call, calls_differ)
    for peer in peers:
        link.send_chunk(job, peer, ChunkHead(seq, DONE_STEP, 0, len(body), node_tag(peer)),
                        memoryview(body), max(deadline - wallclock.now(), 0.1), None, False)


def tell_failure(link: Any, job: str, seq: int, peers: Sequence[str],
                 failure: CollectiveError | str) -> None:
    """Best effort: tell each peer this node failed collective `seq`, and why; one that cannot
    be reached does not keep the others from hearing it (it learns it from its own failure
    or the controller's verdict)."""
    differ = isinstance(failure, CallsDiffer)
    for peer in peers:
        try:
            announce(link, job, seq, [peer], False, str(failure), wallclock.now() + 1.0,
                     calls_differ=differ)
        except (CollectiveError, OSError):
            continue


def agree_outcome(link: Any, me: str, job: str, seq: int, peers: Sequence[str],
                  deadline: float, cancel: threading.Event | None, call: Call | None = None
                  ) -> None:
    """Announce success (and the call this node ran) and wait for every peer's outcome;
    CollectiveError naming the first peer that failed, or that did not say in time, or
    every rank's call when they differ (the ideal network starts a call without comparing
    the ranks' calls first: a rank that reduced with another op ran, but its result differs)."""
    announce(link, job, seq, peers, True, "", deadline, call)
    calls: dict[str, Call] = {} if call is None else {me: call}
    for peer in peers:
        try:
            _head, raw = link.recv_chunk(job, peer, seq, DONE_STEP, deadline, cancel)
        except PeerGaveUp:
            raise
        except CollectiveError as exc:
            if cancel is not None and cancel.is_set():
                raise
            raise CollectiveError(
                f"{me}: {peer} did not say how collective {seq} of job {job} ended in time "
                "(its agent, host or link failed); the result is not handed back here, so "
                f"every rank sees this collective fail: {exc}") from exc
        said = decode(peer, raw)
        if not said.ok:
            raise gave_up(me, peer, job, seq, said)
        if said.call is not None and call is not None:
            calls[peer] = said.call
    if len(set(calls.values())) > 1:
        detail = ", ".join(f"{node}: {describe(*c)}" for node, c in sorted(calls.items()))
        raise CallsDiffer(
            f"{me}: collective {seq} of job {job} ran with different calls at the ranks "
            f"({detail}): their results differ, so it fails on every rank (the buffer holds "
            "what this rank's own call made of it). Every rank must make the same collective "
            "with the same op and root in the same order")
