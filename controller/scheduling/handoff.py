"""Hand-offs between circuits: which deliveries must finish before a transmitter retunes.

A transmitter may only retune once the frame it carried last has reached its receiver; if it
retuned earlier, the tail of that frame would go dark or land at the wrong node. For every
slot that retunes a transmitter this lists the earlier flow of that transmitter, so the
controller can wait for the receiver's confirmation (normally long before the slot starts)
and the receiver knows which arrivals to confirm. One confirmation per reconfiguration, none
per ordinary flow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SlotPairs = tuple[int, Sequence[tuple[str, str, bool]]]
"""(slot index, [(src node, dst node, src retunes in this slot), ...])."""

Handoff = tuple[int, str, str]
"""(slot index of the earlier flow, its src node, its dst node)."""


def handoffs(slots: Iterable[SlotPairs]) -> dict[int, list[Handoff]]:
    """For each slot that retunes a transmitter, the last earlier flow of that transmitter."""
    last: dict[str, tuple[int, str]] = {}
    out: dict[int, list[Handoff]] = {}
    for index, pairs in slots:
        need = [(last[src][0], src, last[src][1]) for src, _dst, retune in pairs
                if retune and src in last]
        if need:
            out[index] = need
        for src, dst, _retune in pairs:
            last[src] = (index, dst)
    return out


def confirmations_for(node: str, slots: Iterable[SlotPairs]) -> set[tuple[int, str]]:
    """The arrivals (slot index, src) that `node` must confirm to the controller."""
    return {(j, src) for need in handoffs(slots).values() for j, src, dst in need if dst == node}
