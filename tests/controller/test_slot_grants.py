"""The pure slot core (`oddl.controller.scheduling.slot_grants`), driven by a fake clock: no
threads, no sleeps; each test passes the time in and reads the decisions back."""

from __future__ import annotations

import pytest

from oddl.common.errors import ScheduleError
from oddl.controller.scheduling.slot_grants import (
    HANDOFF_TIMEOUT,
    RETUNE_FAILED,
    STANDING_REFUSED,
    GatedSlot,
    SlotGrants,
    standing_refusal,
)
from oddl.protos.schedule_wire import EVERY_SLOT


def _slot(index: int, edge: float, waits: frozenset[tuple[int, str]] | set[tuple[int, str]]
          = frozenset(), retunes: dict[str, int] | None = None, guard: float = 0.01,
          timeout: float = 0.5) -> GatedSlot:
    return GatedSlot(index=index, edge_s=edge, data_start_s=edge + guard,
                     deadline_s=edge + guard + timeout, waits_for=frozenset(waits),
                     retunes=retunes or {}, retune_timeout_s=1.0)


def test_nothing_happens_before_the_edge_then_the_slot_waits_for_its_hand_offs():
    core = SlotGrants([_slot(1, edge=10.0, waits={(0, "n1")})])
    d = core.decide(9.0)
    assert d.grants == () and d.retune is None and d.failure is None
    assert d.wake_at == 10.0 and d.at_edge and not d.done
    d = core.decide(10.0)
    assert d.grants == () and d.wake_at == pytest.approx(10.51) and not d.at_edge


def test_grant_after_all_confirmations():
    core = SlotGrants([_slot(1, edge=10.0, waits={(0, "n1"), (0, "n2")})])
    assert core.confirm(0, "n1")
    assert core.decide(10.0).grants == ()
    assert core.confirm(0, "n2")
    d = core.decide(10.002)
    assert [g.slot for g in d.grants] == [1]
    assert d.grants[0].confirmed_s == 10.002 and d.grants[0].edge_s == 10.0
    assert d.done and d.failure is None


def test_failure_at_the_deadline_names_the_missing_node():
    core = SlotGrants([_slot(3, edge=10.0, waits={(2, "n3"), (1, "n0")})])
    core.confirm(1, "n0")
    assert core.decide(10.5).failure is None  # before the deadline (10.51): keep waiting
    d = core.decide(10.51)
    assert d.done and d.grants == ()
    assert d.failure is not None and d.failure.slot == 3 and d.failure.kind == HANDOFF_TIMEOUT
    assert d.failure.reason == ("hand-off not confirmed (n3@slot2); the previous flow did not "
                                "arrive")
    assert core.decide(11.0).failure == d.failure  # it stays failed


def test_a_job_that_ended_fails_the_waiting_slot_at_once():
    core = SlotGrants([_slot(1, edge=10.0, waits={(0, "n1")})])
    d = core.decide(10.0, running=False)
    assert d.failure is not None and "n1@slot0" in d.failure.reason


def test_retunes_come_before_their_grant_and_in_slot_order():
    core = SlotGrants([_slot(2, edge=20.0, waits={(1, "n1")}, retunes={"tx1": 5}),
                       _slot(1, edge=10.0, retunes={"tx0": 3, "tx2": 4})])
    d = core.decide(10.0)
    assert d.retune is not None and d.retune.slot == 1 and dict(d.retune.channels) == {
        "tx0": 3, "tx2": 4}
    assert d.grants == () and not d.done
    assert core.decide(10.1).retune == d.retune  # still outstanding: the same order again
    core.confirm(1, "n1")  # early: slot 2's hand-off arrives while slot 1 retunes
    core.retuned(1)
    d = core.decide(10.2)
    assert [g.slot for g in d.grants] == [1] and d.retune is None
    assert d.wake_at == 20.0 and d.at_edge  # slot 2 does not retune before its edge
    d = core.decide(20.0)
    assert d.retune is not None and d.retune.slot == 2 and dict(d.retune.channels) == {"tx1": 5}
    core.retuned(2, [])
    d = core.decide(20.004)
    assert [g.slot for g in d.grants] == [2] and d.done
    assert d.grants[0].confirmed_s == 20.0  # confirmed at the edge, granted after the retune


def test_a_failed_retune_fails_the_slot_with_the_devices_reasons():
    core = SlotGrants([_slot(1, edge=1.0, retunes={"tx0": 3}), _slot(2, edge=2.0)])
    core.decide(1.0)
    core.retuned(1, ["tx0: not locked", "tx0: timeout"])
    d = core.decide(1.1)
    assert d.grants == () and d.done
    assert d.failure is not None and d.failure.slot == 1 and d.failure.kind == RETUNE_FAILED
    assert d.failure.reason == "retune failed: tx0: not locked; tx0: timeout"


def test_reporting_a_retune_that_was_not_ordered_is_an_error():
    core = SlotGrants([_slot(1, edge=1.0, retunes={"tx0": 3})])
    with pytest.raises(ScheduleError):
        core.retuned(1)
    core.decide(1.0)
    with pytest.raises(ScheduleError):
        core.retuned(2)


def test_slots_past_their_edge_and_confirmed_are_granted_together_in_order():
    core = SlotGrants([_slot(1, edge=1.0, waits={(0, "a")}), _slot(2, edge=2.0),
                       _slot(3, edge=3.0)])
    core.confirm(0, "a")
    d = core.decide(2.5)
    assert [g.slot for g in d.grants] == [1, 2] and d.wake_at == 3.0 and d.at_edge


def test_a_confirmation_early_twice_or_for_an_unknown_slot():
    core = SlotGrants([_slot(2, edge=10.0, waits={(1, "n1")})])
    assert core.confirm(1, "n1")  # early: long before the slot's edge
    assert not core.confirm(1, "n1")  # twice: ignored
    assert not core.confirm(7, "n1")  # a slot that waits for nothing of the kind
    assert not core.confirm(1, "n9")  # a source the slot does not wait for
    assert core.confirmed == {(1, "n1")}
    assert core.decide(5.0).wake_at == 10.0
    d = core.decide(10.0)
    assert [g.slot for g in d.grants] == [2]  # granted at the edge, no wait


def test_no_gated_slots_is_done_at_once():
    d = SlotGrants([]).decide(0.0)
    assert d.done and d.grants == () and d.failure is None


def test_the_standing_refusal():
    assert standing_refusal(b"same", b"same") is None
    moved = standing_refusal(b"held", b"ours")
    assert moved is not None and moved.slot == EVERY_SLOT and moved.kind == STANDING_REFUSED
    assert moved.reason == ("standing start refused: the devices no longer match the standing "
                            "schedule the agents hold; the next collective goes through the "
                            "controller's barrier")
    none = standing_refusal(b"held", None, "the plan does not fit")
    assert none is not None and none.reason.startswith(
        "standing start refused: no schedule (the plan does not fit); ")
