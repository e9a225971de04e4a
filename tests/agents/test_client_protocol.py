"""The client's side of the local API, against a scripted agent (a ROUTER the test answers
by hand in the agent's wire format): late replies, an agent that dies, generations and the
step numbers that pair calls across ranks."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import zmq

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.local_api import wire as localapi
from oddl.agents.local_api.server import LocalServer
from oddl.common.errors import CallsDiffer, CollectiveError, OperationRefused


# ---- the client's side of the protocol ---------------------------------------------------
def _scripted_agent(private_runtime):
    """A ROUTER on an ipc path that the test answers by hand (the agent's wire format)."""
    s = zmq.Context.instance().socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    return s, localapi.bind(s, localapi.AUTO, "scripted")


def _request(agent) -> list[bytes]:
    """The next request to the scripted agent; hellos are answered on the way (generation g1)."""
    while True:
        frames = agent.recv_multipart()
        if frames[1] != b"hello":
            return frames
        agent.send_multipart([frames[0], b"ok", json.dumps(
            {"node": "scripted", "generation": "g1", "rid": int(frames[2])}).encode()])


def _connected(agent, client) -> None:
    """Let the client say hello (and one status round trip) before the test's script."""
    t = threading.Thread(target=client.status)
    t.start()
    ident, _, rid = _request(agent)
    agent.send_multipart([ident, b"ok", json.dumps({"rid": int(rid)}).encode()])
    t.join(30)


def test_a_late_reply_to_an_abandoned_request_is_not_taken_for_the_next(private_runtime):
    agent, address = _scripted_agent(private_runtime)
    client = AgentClient(address, timeout_s=30, shared_memory=False)
    try:
        _connected(agent, client)
        client.timeout_s = 0.2
        with pytest.raises(CollectiveError, match="did not answer"):
            client.allreduce(np.arange(4))           # request 1: no answer in time
        ident, _, h1, _ = _request(agent)
        client.timeout_s = 30
        result = {}
        t = threading.Thread(target=lambda: result.setdefault(
            "out", client.allreduce(np.arange(4))))
        t.start()
        _, _, h2, _ = _request(agent)
        rid1, rid2 = json.loads(h1)["rid"], json.loads(h2)["rid"]
        assert rid2 == rid1 + 1
        # the late answer to request 1 arrives first, then the answer to request 2
        meta = {"dtype": "<i8", "shape": [4]}
        agent.send_multipart([ident, b"ok", json.dumps({**meta, "rid": rid1}).encode(),
                              np.full(4, 666).tobytes()])
        agent.send_multipart([ident, b"ok", json.dumps({**meta, "rid": rid2}).encode(),
                              np.arange(4).tobytes()])
        t.join(30)
        assert list(result["out"]) == [0, 1, 2, 3]
    finally:
        client.close()
        agent.close(0)


def test_an_agent_that_dies_mid_request_fails_it_at_once(private_runtime):
    agent, address = _scripted_agent(private_runtime)
    client = AgentClient(address, timeout_s=60, shared_memory=False)
    try:
        err = {}

        def call():
            try:
                client.allreduce(np.arange(4))
            except CollectiveError as exc:
                err["exc"] = exc
        t = threading.Thread(target=call)
        t0 = time.monotonic()
        t.start()
        _request(agent)
        agent.close(0)  # the agent goes away with the request in flight
        t.join(30)
        assert "closed the connection" in str(err["exc"])
        assert time.monotonic() - t0 < 30  # not the 60 s timeout
    finally:
        client.close()


def test_a_request_after_the_agent_died_fails_fast_and_says_why(private_runtime):
    agent, address = _scripted_agent(private_runtime)
    client = AgentClient(address, timeout_s=60, shared_memory=False)
    try:
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("s", client.status()))
        t.start()
        ident, _, rid = _request(agent)
        agent.send_multipart([ident, b"ok", json.dumps({"rid": int(rid), "x": 1}).encode()])
        t.join(30)
        assert result["s"]["x"] == 1
        agent.close(0)  # dies between two requests
        t0 = time.monotonic()
        with pytest.raises(CollectiveError, match="closed the connection|no agent is listening"):
            client.status()
        assert time.monotonic() - t0 < 30  # the grace for a restart, not the 60 s timeout
    finally:
        client.close()


def _answer(agent, frames: list[bytes], kind: str = "ok", message: str = "",
            job: str = "j1") -> dict:
    """Answer one all-reduce request of the scripted agent as the agent does (it takes the
    call as the caller's step, or the next of its count on `job`); return the header with
    the step it was taken as."""
    ident, _, raw, payload = frames
    header = json.loads(raw)
    step = header.get("step") or header["steps"].get(job, 0) + 1
    resolved = None if kind == "restarted" else {"job": job, "step": step}
    if kind == "ok":
        agent.send_multipart([ident, b"ok", json.dumps(
            {"dtype": header["dtype"], "shape": header["shape"], "rid": header["rid"],
             "resolved": resolved}).encode(), payload])
    else:
        agent.send_multipart([ident, b"error", json.dumps(
            {"kind": kind, "message": message, "rid": header["rid"],
             "resolved": resolved}).encode()])
    return {**header, "taken_as": step}


def _call_in_thread(client, **kwargs) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def call():
        try:
            out["result"] = client.allreduce(np.arange(4), **kwargs)
        except Exception as exc:  # handed to the test
            out["error"] = exc
    t = threading.Thread(target=call)
    t.start()
    return t, out


def test_requests_carry_the_agents_generation_and_a_step_per_call(private_runtime):
    agent, address = _scripted_agent(private_runtime)
    client = AgentClient(address, timeout_s=30, shared_memory=False)
    try:
        steps = []
        for _ in range(2):
            t, out = _call_in_thread(client)
            header = _answer(agent, _request(agent))
            t.join(30)
            assert list(out["result"]) == [0, 1, 2, 3]
            assert header["generation"] == "g1"
            steps.append(header["taken_as"])
        assert steps == [1, 2]
        # a call refused unrun uses up no step; a failed one does
        t, out = _call_in_thread(client)
        assert _answer(agent, _request(agent), "refused", "no job")["taken_as"] == 3
        t.join(30)
        assert isinstance(out["error"], OperationRefused)
        t, out = _call_in_thread(client)
        assert _answer(agent, _request(agent), "collective", "lost")["taken_as"] == 3
        t.join(30)
        assert isinstance(out["error"], CollectiveError)
        # calls on another job count on their own; a caller's own number goes as given
        t, out = _call_in_thread(client)
        assert _answer(agent, _request(agent), job="j2")["taken_as"] == 1
        t.join(30)
        t, out = _call_in_thread(client, step=77)
        assert _answer(agent, _request(agent))["step"] == 77
        t.join(30)
        t, out = _call_in_thread(client)
        header = _answer(agent, _request(agent))
        t.join(30)
        assert header["steps"] == {"j1": 77, "j2": 1} and header["taken_as"] == 78
        with pytest.raises(ValueError, match="step must be a positive integer"):
            client.allreduce(np.arange(4), step=0)
    finally:
        client.close()
        agent.close(0)


def test_a_request_that_reached_a_restarted_agent_is_sent_again_after_a_hello(private_runtime):
    # the agent restarted between the client's hello and its request: the new agent refuses
    # the request unrun (kind "restarted"); the client learns the new generation and sends
    # the same call, with the same step, once more
    agent, address = _scripted_agent(private_runtime)
    client = AgentClient(address, timeout_s=30, shared_memory=False)
    try:
        _connected(agent, client)
        t, out = _call_in_thread(client)
        first = _answer(agent, _request(agent), "restarted", "made before the restart")
        frames = agent.recv_multipart()
        assert frames[1] == b"hello"
        agent.send_multipart([frames[0], b"ok", json.dumps(
            {"node": "scripted", "generation": "g2", "rid": int(frames[2])}).encode()])
        second = _answer(agent, agent.recv_multipart())
        t.join(30)
        assert list(out["result"]) == [0, 1, 2, 3]
        assert (first["generation"], second["generation"]) == ("g1", "g2")
        assert first["taken_as"] == second["taken_as"] == 1
    finally:
        client.close()
        agent.close(0)


def test_the_agent_refuses_a_request_stamped_with_another_generation(private_runtime):
    stop = threading.Event()
    server = LocalServer("n9", localapi.AUTO, None, stop)
    api = threading.Thread(target=server.api_loop, args=(lambda: {"node": "n9"},))
    api.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    try:
        sock.send_multipart([b"hello", b"5"])
        hello = json.loads(sock.recv_multipart()[1])
        assert hello == {"node": "n9", "generation": server.generation, "rid": 5}
        header = {"dtype": "<i8", "shape": [4], "rid": 6, "generation": "not-" + hello["generation"]}
        sock.send_multipart([b"allreduce", json.dumps(header).encode(), b""])
        kind, info = sock.recv_multipart()
        info = json.loads(info)
        assert kind == b"error" and info["kind"] == "restarted" and info["rid"] == 6
        assert "before it restarted" in info["message"] and "not run" in info["message"]
        assert server._work.empty()  # nothing was queued for the collectives thread
    finally:
        stop.set()
        api.join(10)
        sock.close(0)
        server.close()


def test_every_typed_failure_reaches_the_client_as_its_type():
    """The agent sends a failure by kind (`REPLY_KINDS`); the client raises its type again,
    so a caller can tell ranks whose calls differ from lost data without reading the text."""
    from oddl.agents.local_api.server import _reply_kind

    for cls, _kind in localapi.REPLY_KINDS:
        back = localapi.error_of_kind(_reply_kind(cls("why")), "why")
        assert type(back) is cls and str(back) == "why"
    assert type(localapi.error_of_kind(_reply_kind(CallsDiffer("x")), "x")) is CallsDiffer
    assert type(localapi.error_of_kind(_reply_kind(CollectiveError("x")), "x")) is CollectiveError
