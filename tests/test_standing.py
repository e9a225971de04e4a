"""The ready exchange of standing schedules (agents.standing), without processes."""

from __future__ import annotations

import threading

import pytest

from agents.standing import READY_STEP, Ready, agree, exchange
from common.errors import CollectiveError


class _Link:
    """Peers that answered: their ready messages by node; a missing one never answers."""

    def __init__(self, answers: dict[str, Ready]):
        self.answers = answers
        self.sent: list[tuple[str, int]] = []

    def send_chunk(self, job, dst, head, payload, timeout, cancel, gated):
        self.sent.append((dst, head.step))

    def recv_chunk(self, job, src, seq, step, deadline, cancel):
        assert step == READY_STEP
        if src not in self.answers:
            raise CollectiveError(f"n0: lost data: nothing from {src} for step {step}")
        return None, memoryview(self.answers[src].encode())


def test_every_node_holding_the_schedule_starts_after_the_last_ready():
    mine = Ready("n0", 100, "<f4", 10.0, True)
    link = _Link({"n1": Ready("n1", 100, "<f4", 10.5, True)})
    theirs = exchange(link, "job-1", 3, mine, ["n1"], 1e18, None)
    assert link.sent == [("n1", READY_STEP)]
    assert agree(mine, theirs, 0.003) == (True, pytest.approx(10.503))
    # one node without it, or another bucket: all go to the barrier
    assert not agree(mine, [Ready("n1", 100, "<f4", 10.5, False)], 0.003)[0]
    assert not agree(mine, [Ready("n1", 200, "<f4", 10.5, True)], 0.003)[0]


def test_a_peer_that_never_says_ready_is_named_with_the_likely_cause():
    mine = Ready("n0", 100, "<f4", 10.0, True)
    with pytest.raises(CollectiveError) as err:
        exchange(_Link({}), "job-1", 3, mine, ["n2"], 1e18, None)
    text = str(err.value)
    assert "n2 did not say it is ready for collective 3 of job job-1" in text
    assert "has not called the collective" in text and str(READY_STEP) not in text.split(";")[0]


def test_a_cancelled_exchange_keeps_the_cancellation():
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CollectiveError) as err:
        exchange(_Link({}), "job-1", 3, Ready("n0", 1, "<f4", 0.0, True), ["n2"], 1e18, cancel)
    assert "did not say it is ready" not in str(err.value)
