"""The slot executor shell (`oddl.controller.slot_executor`): it reads the gated slots from the
encoded schedule, feeds confirmations into the core and carries out its decisions. Every
slot edge here lies in the past, so nothing sleeps."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from oddl.common.errors import SafetyLimitError
from oddl.controller.slot_executor import Confirmations, SlotExecutor, gated_slots
from oddl.protos import oddl_pb2 as pb


class _Devices:
    """Records retunes; answers with the errors it was given (or raises `exc`)."""

    def __init__(self, errors: list[str] | None = None, exc: Exception | None = None):
        self.calls: list[tuple[dict[str, int], float]] = []
        self.errors = errors or []
        self.exc = exc

    def retune(self, channels: dict[str, int], timeout: float = 1.0) -> list[str]:
        self.calls.append((dict(channels), timeout))
        if self.exc is not None:
            raise self.exc
        return self.errors


def _schedule() -> pb.Schedule:
    """Slot 0: n0 -> n1 on channel 1; slot 1: n0 retunes to n2 (waits for n0's flow to n1)."""
    s = pb.Schedule(job_id="job-1", collective="test", receive_timeout_s=0.5)
    s.slots.add(index=0, start_ns=0, data_start_ns=1_000_000, end_ns=5_000_000).circuits.add(
        src="n0", dst="n1", transmitter="tx0", channel=1)
    s1 = s.slots.add(index=1, start_ns=5_000_000, data_start_ns=15_000_000, end_ns=20_000_000,
                     changes_circuits=True)
    s1.circuits.add(src="n0", dst="n2", transmitter="tx0", channel=2, retune=True)
    s1.handoffs.add(slot=0, src="n0", dst="n1")
    return s


class _Reports:
    """What the executor reported: pushes, retunes per job, errors by kind."""

    def __init__(self) -> None:
        self.pushed: list[tuple[int, str]] = []
        self.retunes: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()

    def circuits_ready(self, job_id: str, seq: int, slot: int, error: str) -> None:
        assert (job_id, seq) == ("job-1", 7)
        self.pushed.append((slot, error))

    def retuned(self, job_id: str, transmitters: int) -> None:
        self.retunes[job_id] += transmitters

    def count_error(self, kind: str) -> None:
        self.errors[kind] += 1


def _run(devices: Any, t0_s: float, confirm: bool) -> tuple[list[tuple[int, str]], Counter[str]]:
    reports = _Reports()
    executor = SlotExecutor(devices, reports)
    if confirm:
        executor.confirmations.add("job-1", 7, 0, "n0")
    go = pb.CollectiveGo(job_id="job-1", seq=7, t0_ns=round(t0_s * 1e9), schedule=_schedule())
    assert executor.launch("job-1", 7, go, running=lambda: True)
    executor.join("job-1", timeout=10)
    assert not executor.retuning()
    assert reports.retunes == Counter({"job-1": len(devices.calls)})  # one transmitter each
    return reports.pushed, reports.errors


def test_gated_slots_come_from_the_encoded_schedule():
    (slot,) = gated_slots(_schedule(), 100.0)
    assert slot.index == 1 and slot.waits_for == {(0, "n0")} and dict(slot.retunes) == {"tx0": 2}
    assert slot.edge_s == 100.005 and slot.data_start_s == 100.015
    assert abs(slot.deadline_s - 100.515) < 1e-9 and slot.retune_timeout_s == 1.0


def test_a_confirmed_slot_is_retuned_then_granted():
    devices = _Devices()
    job_t0 = time.time() - 0.1  # the slot's edge has passed, its deadline has not
    pushed, errors = _run(devices, job_t0, confirm=True)
    assert devices.calls == [({"tx0": 2}, 1.0)]
    assert pushed == [(1, "")] and not errors


def test_a_missing_hand_off_fails_the_slot_at_its_deadline():
    devices = _Devices()
    pushed, errors = _run(devices, time.time() - 10, confirm=False)
    assert devices.calls == []
    assert pushed == [(1, "hand-off not confirmed (n0@slot0); the previous flow did not arrive")]
    assert errors == {"hand-off timeout": 1}


def test_a_refused_retune_fails_the_slot_with_the_reason():
    devices = _Devices(exc=SafetyLimitError("tx0: channel 2 is not allowed"))
    pushed, errors = _run(devices, time.time() - 0.1, confirm=True)
    assert pushed == [(1, "retune failed: tx0: channel 2 is not allowed")]
    assert errors == {"retune failed": 1}


def test_confirmations_are_kept_per_collective_until_forgotten():
    box = Confirmations()
    box.add("a", 1, 0, "n0")
    box.add("a", 2, 0, "n1")
    box.add("b", 1, 3, "n2")
    version, arrived = box.of("a", 1)
    assert arrived == {(0, "n0")} and version == 3
    box.wait(version - 1, 5.0)  # newer than the version: returns at once
    box.forget("a", 1)
    assert box.of("a", 1)[1] == set() and box.of("a", 2)[1] == {(0, "n1")}
