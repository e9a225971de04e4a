"""Point-to-point flows: the windows the controller grants a sender, and their numbers. Pure.

A flow (a training process's `send`) moves one buffer from one node's transmitter to one
node's receiver. It needs the circuit (the transmitter tuned to the receiver's channel) and
a window in which neither the transmitter nor the receiver carries another flow: two flows
into one receiver at once collide there, and a transmitter cannot retune while its previous
flow is on the air. `FlowBook` keeps, per transmitter and per receiver, the time its last
window ends, and numbers each (job, sender, receiver, tag) flow so that the numbers only grow,
even across a restart of the controller or of either agent (`next_number`).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_NUMBER = 0xFFFFFFFE
"""A flow number travels as the 32-bit sequence number of its chunks; READY_STEP and
DONE_STEP are step numbers, not sequence numbers, so every value below 2**32 - 1 is free."""
NUMBER_TICK_S = 1e-3
"""Flow numbers count milliseconds of the job's life (at least one more than the last)."""

Pair = tuple[str, str, str, int]
"""(job, sender node, receiver node, tag)."""


class FlowNumbersExhausted(ValueError):
    """A job has lived too long for its flow numbers (49 days of milliseconds)."""


def next_number(last: int, job_age_s: float) -> int:
    """The number of a pair's next flow: one more than its last, and at least the job's age
    in milliseconds, so that a controller restarted without its memory of `last` (0) still
    numbers above every flow it numbered before, unless the pair averaged more than one flow
    per millisecond (a receiver drops a flow whose number is not above the last it took from
    that sender as a leftover)."""
    number = max(last + 1, int(job_age_s / NUMBER_TICK_S) + 1)
    if number > MAX_NUMBER:
        raise FlowNumbersExhausted(
            f"flow number {number} is past {MAX_NUMBER}: the job has run point-to-point flows "
            f"for more than {MAX_NUMBER * NUMBER_TICK_S / 86400:.0f} days; submit it again")
    return number


@dataclass(frozen=True)
class Window:
    """When a granted flow may send: from `t0_s` for `hold_s` (its bytes at the line rate)."""

    number: int
    t0_s: float
    hold_s: float

    @property
    def end_s(self) -> float:
        return self.t0_s + self.hold_s


class FlowBook:
    """Busy-until times per transmitter and receiver, and the last number per pair."""

    def __init__(self) -> None:
        self._tx_free: dict[str, float] = {}
        self._rx_free: dict[str, float] = {}
        self._last: dict[Pair, int] = {}

    def transmitter_free_at(self, tx: str) -> float:
        """When `tx`'s last granted flow is off the air (0: never granted one)."""
        return self._tx_free.get(tx, 0.0)

    def book(self, pair: Pair, tx: str, rx: str, earliest_s: float, hold_s: float,
             margin_s: float, job_age_s: float) -> Window:
        """Grant `pair` a window of `hold_s` from `earliest_s` at the soonest, after the
        transmitter's and the receiver's previous windows (each followed by `margin_s`), and
        book both until its end."""
        t0 = max(earliest_s, self._tx_free.get(tx, 0.0), self._rx_free.get(rx, 0.0))
        number = next_number(self._last.get(pair, 0), job_age_s)
        self._last[pair] = number
        window = Window(number, t0, hold_s)
        self._tx_free[tx] = self._rx_free[rx] = window.end_s + margin_s
        return window

    def forget_job(self, job_id: str) -> None:
        """Drop the numbers of a job that ended."""
        self._last = {p: n for p, n in self._last.items() if p[0] != job_id}
