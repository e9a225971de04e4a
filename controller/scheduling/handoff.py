"""Hand-offs between circuits: which deliveries must finish before a circuit changes.

Two things change between slots on a TT-FR fabric: a transmitter retunes to a new receiver,
or a receiver starts hearing a new transmitter (on its own channel). Either is only safe once
the frame that used the old circuit has arrived: a transmitter that retuned early would cut
its last frame off, and a new sender on a receiver's channel would collide with a late frame
of the old one. For every slot that changes a circuit this lists the earlier flows that must
have been received first; the receiver of each confirms its arrival to the controller, which
then (retunes and) grants the slot. One confirmation per circuit change, none per flow on a
circuit that stays (a ring never needs one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SlotPairs = tuple[int, Sequence[tuple[str, str, bool]]]
"""(slot index, [(src node, dst node, src retunes in this slot), ...])."""

Handoff = tuple[int, str, str]
"""(slot index of the earlier flow, its src node, its dst node)."""


def handoffs(slots: Iterable[SlotPairs]) -> dict[int, list[Handoff]]:
    """For each slot that changes a circuit, the earlier flows that must have arrived.

    A slot is listed (possibly with no flows to wait for) when a transmitter retunes in it or
    a receiver hears a different transmitter than in its previous slot.
    """
    last_tx: dict[str, tuple[int, str]] = {}
    last_rx: dict[str, tuple[int, str]] = {}
    out: dict[int, list[Handoff]] = {}
    for index, pairs in slots:
        need: list[Handoff] = []
        changes = False
        for src, dst, retune in pairs:
            if retune:
                changes = True
                if src in last_tx:
                    need.append((last_tx[src][0], src, last_tx[src][1]))
            heard = last_rx.get(dst)
            if heard is not None and heard[1] != src:
                changes = True
                need.append((heard[0], heard[1], dst))
        if changes:
            out[index] = sorted(set(need))
        for src, dst, _retune in pairs:
            last_tx[src] = (index, dst)
            last_rx[dst] = (index, src)
    return out


def confirmations_for(node: str, slots: Iterable[SlotPairs]) -> set[tuple[int, str]]:
    """The arrivals (slot index, src) that `node` must confirm to the controller."""
    return {(j, src) for need in handoffs(slots).values() for j, src, dst in need if dst == node}
