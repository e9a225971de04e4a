"""Every rank ends a collective alike (oddl.agents.collective.outcome), over real streams on loopback."""

from __future__ import annotations

import threading
import time

import pytest

from oddl.agents.collective import outcome
from oddl.agents.links.stream_wire import PeerCallsDiffer, PeerGaveUp
from oddl.agents.links.streams import StreamLink
from oddl.common.errors import CallsDiffer, CollectiveError, LostData


@pytest.fixture
def pair():
    a, b = StreamLink("n0", "127.0.0.1:0"), StreamLink("n1", "127.0.0.1:0")
    a.set_peers({"n1": b.address})
    b.set_peers({"n0": a.address})
    yield a, b
    a.close()
    b.close()


def test_both_succeed_only_when_both_say_so(pair):
    a, b = pair
    errors: list[Exception] = []

    def side(link, me, peer):
        try:
            outcome.agree_outcome(link, me, "j", 4, [peer], time.time() + 20, None)
        except CollectiveError as exc:
            errors.append(exc)
    threads = [threading.Thread(target=side, args=(a, "n0", "n1")),
               threading.Thread(target=side, args=(b, "n1", "n0"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []


def test_a_success_becomes_a_failure_when_a_peer_failed(pair):
    a, b = pair
    outcome.tell_failure(b, "j", 4, ["n0"], "n1: lost data: nothing from n2 for step 3")
    with pytest.raises(PeerGaveUp) as err:
        outcome.agree_outcome(a, "n0", "j", 4, ["n1"], time.time() + 20, None)
    text = str(err.value)
    assert "collective 4 of job j failed at n1, so it fails on every rank" in text
    assert "nothing from n2 for step 3" in text


def test_a_peer_that_failed_stops_the_wait_for_its_data_at_once(pair):
    # n0 waits for n1's step-2 chunk; n1 failed before sending it and says so: n0 fails now
    # with n1's reason, not at the end of its receive deadline
    a, b = pair
    outcome.tell_failure(b, "j", 4, ["n0"], "n1: its link went down")
    t0 = time.monotonic()
    with pytest.raises(PeerGaveUp, match="failed at n1.*its link went down"):
        a.recv_chunk("j", "n1", 4, 2, time.time() + 60)
    assert time.monotonic() - t0 < 30


def test_a_silent_peer_is_named_at_the_deadline(pair):
    a, _ = pair
    with pytest.raises(CollectiveError, match="n1 did not say how collective 4 of job j ended"):
        outcome.agree_outcome(a, "n0", "j", 4, ["n1"], time.time() + 0.5, None)


def test_a_malformed_outcome_is_an_error_naming_the_peer():
    with pytest.raises(CollectiveError, match="malformed outcome message from n1"):
        outcome.decode("n1", b"{not json")
    assert outcome.decode("n1", outcome.encode(False, "x" * 5000))[1] == "x" * outcome.MAX_REASON


def test_the_outcome_message_carries_its_call_and_any_reason_in_binary():
    call = ("reduce_scatter", "max", -1)
    body = outcome.encode(False, "n2: lost\0data é", call)
    assert body.startswith(outcome.MAGIC) and b"{" not in body  # no JSON per call
    assert outcome.decode("n1", memoryview(body)) == (False, "n2: lost\0data é", call, False)
    assert outcome.decode("n1", outcome.encode(True)) == (True, "", None, False)
    differ = outcome.decode("n1", outcome.encode(False, "n2: calls differ", None, True))
    assert differ == (False, "n2: calls differ", None, True)
    for cut in (outcome.MAGIC, body[:9], outcome.MAGIC + b"\1\1\0\0\0\0\xff"):
        with pytest.raises(CollectiveError, match="malformed outcome message from n1"):
            outcome.decode("n1", cut)


def test_an_older_peers_json_outcome_is_still_read():
    old = b'{"ok": true, "reason": "", "call": ["all_reduce", "sum", 0]}'
    assert outcome.decode("n1", old) == (True, "", ("all_reduce", "sum", 0), False)
    assert outcome.decode("n1", b'{"ok": false, "reason": "r"}') == (False, "r", None, False)


def test_a_peer_whose_calls_differed_says_so_by_type(pair):
    """The peers of a node that failed because the ranks' calls differ fail with
    `CallsDiffer` too (a caller can name the fix on every rank, not on one)."""
    a, b = pair
    outcome.tell_failure(b, "j", 4, ["n0"], CallsDiffer("n1: chunk from n2 is 5 elements"))
    with pytest.raises(PeerCallsDiffer, match="failed at n1.*5 elements"):
        outcome.agree_outcome(a, "n0", "j", 4, ["n1"], time.time() + 20, None)
    outcome.tell_failure(b, "j", 5, ["n0"], LostData("n1: lost data"))
    with pytest.raises(PeerGaveUp) as err:
        a.recv_chunk("j", "n1", 5, 2, time.time() + 60)
    assert not isinstance(err.value, CallsDiffer)


def test_differing_calls_fail_with_calls_differ(pair):
    """The outcome round that finds the ranks ran different calls says so by type."""
    a, b = pair
    outcome.announce(b, "j", 4, ["n0"], True, "", time.time() + 20, ("all_reduce", "max", 0))
    with pytest.raises(CallsDiffer, match="different calls"):
        outcome.agree_outcome(a, "n0", "j", 4, ["n1"], time.time() + 20, None,
                              ("all_reduce", "sum", 0))


def test_a_failure_reaches_the_peers_that_can_be_reached():
    # the first peer's agent is gone (nothing listens at its address): the second still hears
    a, b = StreamLink("n0", "127.0.0.1:0"), StreamLink("n1", "127.0.0.1:0")
    gone = StreamLink("n2", "127.0.0.1:0")
    gone_address = gone.address
    gone.close()
    try:
        a.set_peers({"n1": b.address, "n2": gone_address})
        b.set_peers({"n0": a.address})
        outcome.tell_failure(a, "j", 4, ["n2", "n1"], "n0: lost data")
        with pytest.raises(PeerGaveUp, match="failed at n0"):
            outcome.agree_outcome(b, "n1", "j", 4, ["n0"], time.time() + 20, None)
    finally:
        a.close()
        b.close()


def test_a_node_waiting_for_one_peer_stops_when_another_fails():
    """n0 waits for n2's data; n1 fails the collective and says so: n0 fails at once with
    n1's reason instead of waiting out its deadline for data n2 may never send."""
    links = [StreamLink(f"n{i}", "127.0.0.1:0") for i in range(3)]
    try:
        for link in links:
            link.set_peers({o.node_id: o.address for o in links if o is not link})
        outcome.tell_failure(links[1], "j", 4, ["n0"], CallsDiffer("n1: blocks of 5, not 3"))
        with pytest.raises(PeerCallsDiffer, match="failed at n1.*blocks of 5"):
            links[0].recv_chunk("j", "n2", 4, 0, time.time() + 600)
        with pytest.raises(LostData, match="nothing from n2"):  # the next call is not failed
            links[0].recv_chunk("j", "n2", 5, 0, time.time() + 0.3)
    finally:
        for link in links:
            link.close()
