"""What both ends need to know about the wire form of a schedule (`pb.Schedule`)."""

from __future__ import annotations

import hashlib

from protos import oddl_pb2 as pb

EVERY_SLOT = 0xFFFFFFFF
"""`CircuitsReady.slot` for an answer about every slot of the collective (a refusal)."""


def schedule_sha256(schedule: pb.Schedule) -> bytes:
    """SHA-256 of the schedule's deterministic serialisation: equal digests, same schedule."""
    return hashlib.sha256(schedule.SerializeToString(deterministic=True)).digest()


def retunes(schedule: pb.Schedule) -> bool:
    """Whether any slot of the schedule retunes a transmitter."""
    return any(c.retune for slot in schedule.slots for c in slot.circuits)


def first_data_start(schedule: pb.Schedule) -> float:
    """Seconds from the schedule's start (`t0`) to its first slot's data window."""
    return min((slot.data_start_ns for slot in schedule.slots), default=0) / 1e9


def ends_where_it_starts(schedule: pb.Schedule) -> bool:
    """Whether running the schedule leaves every transmitter on the channel it starts on, so
    the same schedule can run again at once: each transmitter's first circuit needs no retune
    (it is already there) and its last circuit is on that same channel."""
    first: dict[str, tuple[int, bool]] = {}
    last: dict[str, int] = {}
    for slot in sorted(schedule.slots, key=lambda s: s.start_ns):
        for c in slot.circuits:
            if not c.transmitter:
                continue
            first.setdefault(c.transmitter, (c.channel, c.retune))
            last[c.transmitter] = c.channel
    return all(not retuned and last[tx] == ch for tx, (ch, retuned) in first.items())
