"""The ready exchange of standing schedules (oddl.agents.collective.standing), without processes."""

from __future__ import annotations

import threading

import pytest

from oddl.agents.collective.standing import Ready, agree, exchange
from oddl.agents.links.stream_wire import READY_STEP, PeerAhead
from oddl.common.errors import CollectiveError, StepMismatch


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
    assert agree("job-1", 3, mine, theirs, 0.003) == (True, pytest.approx(10.503))
    # one node without it, or another bucket: all go to the barrier
    assert not agree("job-1", 3, mine, [Ready("n1", 100, "<f4", 10.5, False)], 0.003)[0]
    assert not agree("job-1", 3, mine, [Ready("n1", 200, "<f4", 10.5, True)], 0.003)[0]


def test_a_peer_that_never_says_ready_is_named_with_the_likely_cause():
    mine = Ready("n0", 100, "<f4", 10.0, True)
    with pytest.raises(CollectiveError) as err:
        exchange(_Link({}), "job-1", 3, mine, ["n2"], 1e18, None)
    text = str(err.value)
    assert "n2 did not say it is ready for collective 3 of job job-1" in text
    assert "has not made this call" in text and str(READY_STEP) not in text


def test_a_cancelled_exchange_keeps_the_cancellation():
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CollectiveError) as err:
        exchange(_Link({}), "job-1", 3, Ready("n0", 1, "<f4", 0.0, True), ["n2"], 1e18, cancel)
    assert "did not say it is ready" not in str(err.value)


def test_every_silent_peer_is_named_not_only_the_first():
    mine = Ready("n0", 100, "<f4", 10.0, True, step=7)
    with pytest.raises(CollectiveError) as err:
        exchange(_Link({"n2": Ready("n2", 100, "<f4", 10.0, True, step=7)}), "job-1", 3, mine,
                 ["n1", "n2", "n3"], 1e18, None)
    assert "n1, n3 did not say it is ready for collective 3 of job job-1 (step 7 here)" \
        in str(err.value)


def test_calls_with_different_steps_are_refused_naming_every_rank():
    mine = Ready("n0", 100, "<f4", 10.0, True, step=133)
    theirs = [Ready("n1", 100, "<f4", 10.0, True, step=133),
              Ready("n2", 100, "<f4", 10.0, False, step=51)]
    with pytest.raises(StepMismatch) as err:
        agree("job-1", 9, mine, theirs, 0.003)
    text = str(err.value)
    assert "collective 9 of job job-1 refused" in text
    assert "n0 at step 133, n1 at step 133, n2 at step 51" in text
    assert "step=" in text  # the fix: number the calls
    # a caller that gave no step (0) pairs with anything; equal steps pair
    assert agree("job-1", 9, mine, [Ready("n1", 100, "<f4", 10.0, True, step=0)], 0.0)[0]
    assert agree("job-1", 9, mine, [Ready("n1", 100, "<f4", 10.0, True, step=133)], 0.0)[0]


def test_a_ready_from_a_later_collective_is_handed_up_as_peer_ahead():
    class _Ahead(_Link):
        def recv_chunk(self, job, src, seq, step, deadline, cancel):
            raise PeerAhead("n0: n1 is ahead", src, seq + 2)

    with pytest.raises(PeerAhead) as err:
        exchange(_Ahead({}), "job-1", 3, Ready("n0", 1, "<f4", 0.0, True), ["n1"], 1e18, None)
    assert (err.value.peer, err.value.seq) == ("n1", 5)


def test_a_ready_message_survives_a_round_trip_with_its_step():
    ready = Ready("n1", 12, "<i8", 3.5, False, step=42)
    assert Ready.decode("n1", ready.encode()) == ready
    # an older agent's ready (no step) reads as step 0
    old = b'{"n": 12, "dtype": "<i8", "ready": 3.5, "standing": false}'
    assert Ready.decode("n1", old).step == 0


def test_a_ready_for_an_earlier_step_is_a_call_the_peer_gave_up():
    # n1's ready at this number is for its step 6158 while this call is step 6159: n1 gave
    # that call (and its number) up, so this node moves to the next number and says it again
    mine = Ready("n0", 100, "<f4", 10.0, True, step=6159)
    link = _Link({"n1": Ready("n1", 100, "<f4", 9.0, True, step=6158)})
    with pytest.raises(PeerAhead) as err:
        exchange(link, "job-1", 6158, mine, ["n1"], 1e18, None)
    assert (err.value.peer, err.value.seq, err.value.their_step) == ("n1", 6159, 6158)
    # a peer ahead in steps at this number is a mismatch, not a call given up
    link = _Link({"n1": Ready("n1", 100, "<f4", 9.0, True, step=6160)})
    theirs = exchange(link, "job-1", 6158, mine, ["n1"], 1e18, None)
    with pytest.raises(StepMismatch):
        agree("job-1", 6158, mine, theirs, 0.0)
