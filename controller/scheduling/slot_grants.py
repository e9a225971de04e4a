"""When the slots of a running collective may start: retunes, grants and failures.

A slot that changes circuits (a transmitter retunes, or a receiver hears a new transmitter)
may only start once the flows that used the old circuits have arrived: their receivers confirm
each arrival to the controller. `SlotGrants` decides, from the confirmations received so far
and the time `now` the caller passes in, what happens next for one collective:

- nothing before a slot's edge (its start on the controller clock);
- at or after the edge, once every hand-off the slot waits for is confirmed: the slot's
  retunes (the caller performs them and reports the outcome with `retuned`), then the grant
  (the caller tells the slot's senders that the circuits are ready);
- past the slot's deadline (its data start plus the agents' receive timeout) with a hand-off
  still missing, or when the job has ended: a failure naming the missing arrivals;
- a failed retune: a failure with the devices' reasons.

Slots are decided strictly in order: a later slot is neither retuned nor granted before an
earlier one is granted. The core holds no clock and performs no I/O; the controller's slot
executor (`oddl.controller.slot_executor`) waits until the instant it returns and carries out its
decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from oddl.common.errors import ScheduleError
from oddl.protos.schedule_wire import EVERY_SLOT

HANDOFF_TIMEOUT = "hand-off timeout"
"""`SlotFailure.kind` of a slot whose hand-offs were not confirmed in time."""
RETUNE_FAILED = "retune failed"
"""`SlotFailure.kind` of a slot whose transmitters did not retune."""
STANDING_REFUSED = "standing start refused"
"""`SlotFailure.kind` of a standing start the controller will not execute."""

Arrival = tuple[int, str]
"""(slot index of a flow, its source node): one hand-off its receiver confirms."""


@dataclass(frozen=True)
class GatedSlot:
    """A slot that waits for hand-offs (and may retune) before its senders may transmit.

    Times are instants on the caller's clock (seconds): `edge_s` is the slot's start,
    `deadline_s` the last instant its hand-offs may be confirmed (its data start plus the
    receive timeout). `retunes` maps each transmitter that retunes in the slot to its new
    channel; `retune_timeout_s` bounds the devices' retune.
    """

    index: int
    edge_s: float
    data_start_s: float
    deadline_s: float
    waits_for: frozenset[Arrival] = frozenset()
    retunes: Mapping[str, int] = field(default_factory=dict)
    retune_timeout_s: float = 1.0


@dataclass(frozen=True)
class RetuneOrder:
    """Retune these transmitters now (slot `slot`), then report with `SlotGrants.retuned`."""

    slot: int
    channels: Mapping[str, int]
    timeout_s: float


@dataclass(frozen=True)
class Grant:
    """A slot whose circuits are ready: its senders may transmit at its data start."""

    slot: int
    edge_s: float
    data_start_s: float
    confirmed_s: float
    """When the core first saw every hand-off of the slot confirmed (at or after the edge)."""


@dataclass(frozen=True)
class SlotFailure:
    """The collective fails at `slot` for `reason`; `kind` names the cause for counters."""

    slot: int
    kind: str
    reason: str


@dataclass(frozen=True)
class SlotDecision:
    """What to do now, in this order: push `grants`, perform `retune`, report `failure`;
    then, unless `done`, wait until `wake_at` (exactly, if `at_edge`; else at most until then,
    since a confirmation may arrive sooner) and ask again."""

    grants: tuple[Grant, ...] = ()
    retune: RetuneOrder | None = None
    failure: SlotFailure | None = None
    wake_at: float | None = None
    at_edge: bool = False

    @property
    def done(self) -> bool:
        """Nothing more to decide: every slot granted, or the collective failed."""
        return self.failure is not None or (self.retune is None and self.wake_at is None)


class SlotGrants:
    """The grant state of one collective's gated slots (see the module docstring)."""

    def __init__(self, slots: Iterable[GatedSlot]):
        self.slots: tuple[GatedSlot, ...] = tuple(sorted(slots, key=lambda s: s.index))
        self.expected: frozenset[Arrival] = frozenset(
            a for s in self.slots for a in s.waits_for)
        self.confirmed: set[Arrival] = set()
        self._next = 0
        self._confirmed_s: float | None = None
        self._ordered: RetuneOrder | None = None
        self._retune_errors: Sequence[str] | None = None
        self._failure: SlotFailure | None = None

    def confirm(self, slot: int, src: str) -> bool:
        """Record that the flow of `src` in `slot` arrived; False when it is not a hand-off
        of this collective or was confirmed before (either is harmless and ignored)."""
        arrival = (slot, src)
        if arrival not in self.expected or arrival in self.confirmed:
            return False
        self.confirmed.add(arrival)
        return True

    def retuned(self, slot: int, errors: Sequence[str] = ()) -> None:
        """Report the outcome of the retune ordered for `slot` (`errors` empty: it worked)."""
        if self._ordered is None or self._ordered.slot != slot:
            raise ScheduleError(f"no retune of slot {slot} is outstanding")
        self._retune_errors = tuple(errors)

    def decide(self, now: float, running: bool = True) -> SlotDecision:
        """The decisions at time `now`; `running` False once the job has ended."""
        grants: list[Grant] = []
        while self._failure is None and self._next < len(self.slots):
            slot = self.slots[self._next]
            if self._ordered is not None:
                if self._retune_errors is None:
                    return SlotDecision(tuple(grants), retune=self._ordered)
                if self._retune_errors:
                    self._failure = SlotFailure(slot.index, RETUNE_FAILED, "retune failed: "
                                                + "; ".join(self._retune_errors))
                    break
                grants.append(self._grant(slot))
                continue
            if now < slot.edge_s:
                return SlotDecision(tuple(grants), wake_at=slot.edge_s, at_edge=True)
            missing = slot.waits_for - self.confirmed
            if missing:
                if now < slot.deadline_s and running:
                    return SlotDecision(tuple(grants), wake_at=slot.deadline_s)
                self._failure = SlotFailure(slot.index, HANDOFF_TIMEOUT,
                                            f"hand-off not confirmed ({describe(missing)}); "
                                            "the previous flow did not arrive")
                break
            if self._confirmed_s is None:
                self._confirmed_s = now
            if slot.retunes:
                self._ordered = RetuneOrder(slot.index, dict(slot.retunes),
                                            slot.retune_timeout_s)
                return SlotDecision(tuple(grants), retune=self._ordered)
            grants.append(self._grant(slot))
        return SlotDecision(tuple(grants), failure=self._failure)

    def _grant(self, slot: GatedSlot) -> Grant:
        confirmed = self._confirmed_s if self._confirmed_s is not None else slot.edge_s
        self._next += 1
        self._confirmed_s = None
        self._ordered = None
        self._retune_errors = None
        return Grant(slot.index, slot.edge_s, slot.data_start_s, confirmed)


def describe(missing: Iterable[Arrival]) -> str:
    """The missing arrivals as the failure names them: ``src@slotJ, ...`` in slot order."""
    return ", ".join(f"{src}@slot{j}" for j, src in sorted(missing))


def standing_refusal(held_sha256: bytes, ours_sha256: bytes | None, no_schedule: str = ""
                     ) -> SlotFailure | None:
    """Whether a standing start must be refused, for every slot (`EVERY_SLOT`): the agents
    run on a schedule (digest `held_sha256`) this controller would not execute. `ours_sha256`
    is the digest of the schedule the controller computes for the collective now, None when
    it has none (`no_schedule` says why)."""
    if ours_sha256 is None:
        why = f"no schedule ({no_schedule})"
    elif ours_sha256 == held_sha256:
        return None
    else:
        why = "the devices no longer match the standing schedule the agents hold"
    return SlotFailure(EVERY_SLOT, STANDING_REFUSED,
                       f"standing start refused: {why}; the next collective goes through the "
                       "controller's barrier")


def late_grant_advice(grant: Grant, granted_s: float, line_rate_gbps: float,
                      testbed: str) -> str:
    """What ran over when a slot's circuits were granted after its data start: the data of
    the slot before (its hand-off came so late that even a retune within the guard could not
    make it) or the retune itself (it took longer than the whole guard)."""
    guard = grant.data_start_s - grant.edge_s
    handoff = max(grant.confirmed_s - grant.edge_s, 0.0)
    retune = max(granted_s - grant.confirmed_s, 0.0)
    late = granted_s - grant.data_start_s
    if retune <= guard:
        return (f"slot {grant.slot}: circuits ready {late * 1e3:.2f} ms after the guard: the "
                f"previous slot's data was confirmed {handoff * 1e3:.2f} ms after its slot ended "
                f"(the retune then took {retune * 1e3:.2f} ms of a {guard * 1e3:.2f} ms guard). "
                "Data that takes longer than its slot points at [fabric] line_rate_gbps = "
                f"{line_rate_gbps:g} in {testbed}: set it to what the links carry (the agents "
                "measure it: `oddl status`); if they carry that rate, the confirmation itself "
                "was slow: raise [timing] command_ms")
    return (f"slot {grant.slot}: circuits ready {late * 1e3:.2f} ms after the guard: the retune "
            f"took {retune * 1e3:.2f} ms, more than the whole {guard * 1e3:.2f} ms guard (the "
            f"hand-off was confirmed {handoff * 1e3:.2f} ms after the edge); raise [timing] "
            f"command_ms or laser_tune_ms in {testbed}")
