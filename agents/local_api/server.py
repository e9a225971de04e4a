"""The agent's local API side: the socket the training process talks to.

One thread (`api_loop`) owns the ROUTER socket: it answers hello and status requests at once,
queues
all-reduce requests for the collectives thread (`work_loop`) and hands that thread's results
back to the clients. The collectives thread runs one all-reduce at a time and turns every
failure into an error reply of a kind the client maps to a typed error (`oddl.agents.client.agent_client`).

A third thread (`bucket_loop`) serves the bucket socket beside the local API, where clients
hand over their shared-memory buckets as descriptors (`oddl.agents.local_api.bucket_server`).

Every agent process is a new generation (a random id). A client learns it with a hello after
each (re)connection and stamps its requests with it; a request stamped with another
generation was made to an agent that has since restarted (ZeroMQ delivers a request queued
before the restart to the new process) and is refused unrun, so a restart can never hand one
call to two collectives or shift a client's calls against its peers'.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from oddl.agents.local_api import callers
from oddl.agents.local_api import wire as localapi
from oddl.agents.local_api.bucket_server import BucketRegistry, BucketServer
from oddl.common.call_marks import MARKS
from oddl.common.errors import (
    BucketUnavailable,
    CollectiveError,
    LostData,
    OddlError,
    OperationRefused,
    StepMismatch,
)

logger = logging.getLogger(__name__)

ServeCall = Callable[[dict[str, Any], bytes], np.ndarray]
"""Runs one call of a training process (header, payload: a collective, a send or a receive)
and returns its result."""

World = Callable[[dict[str, Any]], dict[str, Any]]
"""Answers a world request (header): the job, this node's rank and the job's size."""

OnFailure = Callable[[str, str], None]
"""Told of a failed request: its kind ("lost data", "step mismatch", "collective", "refused",
"internal")
and the message."""

Void = Callable[[str], bool]
"""Voids the call in flight (the reason): True if it was still waiting for its peers, so it
ends with that reason (`oddl.agents.collective.runner.CollectiveRunner.void`)."""

WATCH_S = 0.5
"""How often the local API looks whether the training process of the call in flight is gone."""


@dataclass
class _Request:
    ident: bytes
    header: dict[str, Any]
    payload: bytes
    shared: bool = False
    query: bool = False
    """A question about the job (`world`), not a collective."""
    caller: callers.Caller | None = None
    """The training process that made it, when this agent can watch it (decision 0033)."""
    voided: bool = False


class LocalServer:
    """The local API socket and the queue between it and the collectives thread."""

    def __init__(self, node_id: str, address: str, group: str | None, stop: threading.Event,
                 buckets: BucketRegistry | None = None):
        self.node_id = node_id
        self.stop = stop
        self.generation = uuid.uuid4().hex[:12]
        """This agent process's id: requests stamped with another one are refused unrun."""
        self.api_bytes = 0
        """Array bytes that came through the socket (shared-memory buckets: none)."""
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._api = ctx.socket(zmq.ROUTER)
        self._api.setsockopt(zmq.LINGER, 0)
        self.address = localapi.bind(self._api, address, node_id, group)
        try:
            self._bucket_socket = BucketServer(self.address, buckets or BucketRegistry(),
                                               node_id)
        except BaseException:
            self._api.close(0)
            localapi.unlink(self.address)
            raise
        self._results = ctx.socket(zmq.PULL)
        self._results_addr = f"inproc://agent-results-{uuid.uuid4().hex}"
        self._results.bind(self._results_addr)
        self._work: queue.Queue[_Request | None] = queue.Queue()
        self._receives: queue.Queue[_Request | None] = queue.Queue()
        """Point-to-point receives: served on a thread of their own, since a receive waits
        for its peer's send, which may come after this node's next collective or send."""
        self._serving: _Request | None = None
        """The collectives thread's request in flight (its caller is watched)."""
        self.voided = 0
        """Calls voided because their training process was gone."""

    def close(self) -> None:
        """Release the sockets (after the threads ended) and the socket file."""
        self._api.close(0)
        localapi.unlink(self.address)
        self._bucket_socket.close()
        self._results.close(0)

    def wake(self) -> None:
        """End the collectives and receives threads once their current requests are done."""
        self._work.put(None)
        self._receives.put(None)

    def bucket_loop(self) -> None:
        """Take the clients' bucket descriptors until `stop`."""
        self._bucket_socket.serve(self.stop)

    def api_loop(self, status: Callable[[], dict[str, Any]], void: Void | None = None) -> None:
        """Serve the socket until `stop`: replies out, requests in; every `WATCH_S`, void the
        call in flight if its training process is gone (`void`)."""
        poller = zmq.Poller()
        poller.register(self._api, zmq.POLLIN)
        poller.register(self._results, zmq.POLLIN)
        watched_at = time.monotonic()
        while not self.stop.is_set():
            ready = dict(poller.poll(100))
            if void is not None and time.monotonic() - watched_at >= WATCH_S:
                watched_at = time.monotonic()
                self._watch_caller(void)
            if self._results in ready:
                while True:
                    try:
                        self._api.send_multipart(self._results.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    if MARKS.on:
                        MARKS.mark("reply_sent")
                        MARKS.flush(f"agent-{self.node_id}")
            if self._api in ready:
                while True:
                    try:
                        frames = self._api.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_api(frames, status)

    def _on_api(self, frames: list[bytes], status: Callable[[], dict[str, Any]]) -> None:
        ident = frames[0]
        op = frames[1] if len(frames) > 1 else b""
        if op == b"status":
            rid = _rid(frames[2]) if len(frames) > 2 else None
            self._api.send_multipart([ident, b"ok", json.dumps({**status(), "rid": rid}).encode()])
        elif op == b"hello":
            rid = _rid(frames[2]) if len(frames) > 2 else None
            self._api.send_multipart([ident, b"ok", json.dumps(
                {"node": self.node_id, "generation": self.generation, "rid": rid}).encode()])
        elif op == b"world" and len(frames) == 3:
            header = self._header(ident, frames[2])
            if header is None:
                return
            self._work.put(_Request(ident, header, b"", query=True))  # the job table may lag
        elif op == b"allreduce" and len(frames) == 4:
            if MARKS.on:
                MARKS.begin()
                MARKS.mark("agent_in")
            header = self._header(ident, frames[2])
            if header is None:
                return
            stamped = header.get("generation")
            if stamped is not None and stamped != self.generation:
                self._api.send_multipart([ident, b"error", _err("restarted", (
                    f"{self.node_id}: this request was made to the agent before it restarted "
                    f"(generation {stamped!r}; this agent is {self.generation!r}); it was not "
                    "run: say hello and call again"), header.get("rid"))])
                return
            self.api_bytes += len(frames[3])
            work = self._receives if header.get("kind") in ("recv", "recv_any") else self._work
            work.put(_Request(ident, header, frames[3],
                              shared="shm" in header or "bucket" in header,
                              caller=callers.watched(header.get("caller"))))
        else:
            self._api.send_multipart([ident, b"error", _err(
                "bad-request", f"unknown request {op!r}; use oddl.agents.client.agent_client.AgentClient",
                None)])

    def _watch_caller(self, void: Void) -> None:
        """Void the call in flight when the training process that made it is gone: its reply
        has nobody to go to, and a call waiting for peers that will never make it (they were
        stopped too: torchrun restarts every rank) would keep this node's next caller behind
        it until its timeout (decision record 0033)."""
        req = self._serving
        if req is None or req.caller is None or req.voided or not callers.gone(req.caller):
            return
        req.voided = True
        reason = (f"the training process that made this call (pid {req.caller[0]}) is gone, "
                  "so the call was voided before its data moved (decision record 0033)")
        if void(reason):
            self.voided += 1
            logger.warning("%s: %s", self.node_id, reason)

    def in_flight(self) -> dict[str, Any] | None:
        """The collectives thread's request in flight (its kind, and the pid of the training
        process that made it when the agent watches that process), or None."""
        req = self._serving
        if req is None:
            return None
        return {"kind": "world" if req.query else req.header.get("kind", "all_reduce"),
                "pid": req.caller[0] if req.caller is not None else None}

    def work_loop(self, serve: ServeCall, on_failure: OnFailure,
                  world: World | None = None) -> None:
        """Run the queued collectives (and sends, and world questions) one at a time until
        `stop` (or `wake`)."""
        self._loop(self._work, serve, on_failure, world)

    def receive_loop(self, receive: ServeCall, on_failure: OnFailure) -> None:
        """Run the queued point-to-point receives one at a time until `stop` (or `wake`)."""
        self._loop(self._receives, receive, on_failure, None)

    def _loop(self, work: queue.Queue[_Request | None], serve: ServeCall,
              on_failure: OnFailure, world: World | None) -> None:
        push: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self._results_addr)
        try:
            while not self.stop.is_set():
                req = work.get()
                if req is None:
                    return
                MARKS.mark("agent_picked")
                if work is self._work:
                    self._serving = req
                try:
                    push.send_multipart(self._serve(req, serve, on_failure, world))
                finally:
                    self._serving = None
                MARKS.mark("reply_pushed")
        finally:
            push.close(0)

    def _serve(self, req: _Request, serve: ServeCall, on_failure: OnFailure,
               world: World | None = None) -> list[bytes]:
        """The reply frames to one request."""
        rid = req.header.get("rid")
        rid = rid if isinstance(rid, int) and not isinstance(rid, bool) else None
        if req.caller is not None and callers.gone(req.caller):
            return [req.ident, b"error", _err("refused", (
                f"{self.node_id}: the training process that made this call (pid "
                f"{req.caller[0]}) was gone before the call started: not run (decision "
                "record 0033)"), rid)]
        try:
            if req.query:
                if world is None:
                    raise OperationRefused(f"{self.node_id}: this agent answers no world "
                                           "requests")
                return [req.ident, b"ok", json.dumps({**world(req.header), "rid": rid}).encode()]
            return _ok(req, serve(req.header, req.payload), rid)
        except BucketUnavailable as exc:  # the client hands it over again, or sends bytes
            return [req.ident, b"error", _err(exc.kind, str(exc), rid)]
        except CollectiveError as exc:
            on_failure(_failure_kind(exc), str(exc))
            return [req.ident, b"error", _err(_reply_kind(exc), str(exc), rid,
                                              req.header.get("resolved"))]
        except OddlError as exc:
            on_failure("refused", str(exc))
            return [req.ident, b"error", _err(_reply_kind(exc), str(exc), rid,
                                              req.header.get("resolved"))]
        except Exception as exc:  # a defect: report it, keep serving the node
            logger.exception("%s: all-reduce failed unexpectedly", self.node_id)
            on_failure("internal", f"internal error: {exc!r}")
            return [req.ident, b"error", _err(
                "internal", f"{self.node_id}: internal error ({exc!r}); the agent keeps "
                "running — please report this with its log", rid)]

    def _header(self, ident: bytes, raw: bytes) -> dict[str, Any] | None:
        """A request's JSON header, or None once a bad-request error is sent back."""
        try:
            header = json.loads(raw)
            if not isinstance(header, dict):
                raise ValueError("header is not an object")
        except (ValueError, RecursionError) as exc:
            self._api.send_multipart([ident, b"error", _err("bad-request", str(exc), None)])
            return None
        return header


FAILURE_KINDS = ("lost data", "step mismatch", "collective")
"""Every kind `_failure_kind` returns: the agent exports each from zero, so a dashboard's
error rate has a series before the first failure."""


def _failure_kind(exc: CollectiveError) -> str:
    """How the agent counts a failed collective (`oddl_agent_errors_total{kind}`)."""
    if isinstance(exc, LostData):
        return "lost data"
    if isinstance(exc, StepMismatch):
        return "step mismatch"
    return "collective"


def _reply_kind(exc: OddlError) -> str:
    """The error kind a reply carries; `oddl.agents.client.agent_client` maps it back to the type."""
    for cls, kind in localapi.REPLY_KINDS:
        if isinstance(exc, cls):
            return kind
    return "refused" if isinstance(exc, OperationRefused) else "collective"


def _ok(req: _Request, out: np.ndarray, rid: int | None) -> list[bytes]:
    """The reply frames carrying a result (none when it is in the client's shared bucket)."""
    meta = {"dtype": out.dtype.str, "shape": list(out.shape), "rid": rid,
            "resolved": req.header.get("resolved")}
    if req.shared:  # the result is in the client's bucket already
        return [req.ident, b"ok", json.dumps({**meta, "shm": True}).encode(), b""]
    return [req.ident, b"ok", json.dumps(meta).encode(), out.tobytes()]


def _err(kind: str, message: str, rid: int | None, resolved: Any = None) -> bytes:
    """An error reply; `resolved`: the job and step the call was taken as, once known."""
    return json.dumps({"kind": kind, "message": message, "rid": rid,
                       "resolved": resolved}).encode()


def _rid(raw: bytes) -> int | None:
    """The request id a client sent with a status request (echoed in the reply)."""
    try:
        return int(raw)
    except ValueError:
        return None
