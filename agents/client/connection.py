"""The client's connection to its agent: one ZeroMQ DEALER socket and its monitor.

It numbers requests and matches replies to them (a reply to an earlier request that timed
out is dropped), follows the connection's state (the agent going away ends a waiting request
at once), and learns the agent's generation with a hello after each (re)connection, stamping
requests with it (`oddl.agents.local_api.server`). `oddl.agents.client.agent_client.AgentClient` holds one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import zmq
from zmq.utils import monitor as zmq_monitor

from oddl.agents.local_api import wire as localapi
from oddl.common.errors import CollectiveError
from oddl.common.file_access import socket_advice

logger = logging.getLogger(__name__)

CONNECT_GRACE_S = 5.0
"""How long a request waits for the agent's socket to accept a connection (a restart)."""


class AgentSocket:
    """A client's socket to the agent at `address` (see the module docstring)."""

    def __init__(self, address: str, timeout_s: float):
        self.address = address
        self.timeout_s = timeout_s
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # the agent going away (killed, restarted) ends a waiting request at once, and a
        # request is not sent into a connection that is not there
        self.events: zmq.Socket[bytes] = self.sock.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.connected = False
        self.generation: str | None = None
        """The agent process this client talks to (learned by a hello after each connect)."""
        self.rid = 0
        self.sock.connect(address)

    def ensure_connected(self) -> None:
        """Before a request: apply the connection's events so far (a disconnect from before
        does not fail this request), waiting a little for an agent that is (re)starting;
        CollectiveError if none accepts a connection at the address."""
        self.connection_events(0)
        deadline = time.monotonic() + min(self.timeout_s, CONNECT_GRACE_S)
        while not self.connected:
            left = deadline - time.monotonic()
            if left <= 0:
                advice = (socket_advice(self.address.removeprefix("ipc://"))
                          if self.address.startswith("ipc://") else "")
                if advice:
                    raise CollectiveError(f"cannot reach the agent at {self.address}: {advice}")
                raise CollectiveError(f"no agent is listening at {self.address} (it stopped, "
                                      "or has not started yet); start it with `oddl agent "
                                      "serve` or check the address")
            self.connection_events(int(left * 1000) + 1)
        if self.generation is None:
            generation = self.query(b"hello").get("generation")
            self.generation = generation if isinstance(generation, str) else None

    def query(self, op: bytes, header: dict[str, Any] | None = None) -> dict[str, Any]:
        """Ask the agent a question (status, hello, world); its JSON answer."""
        self.rid += 1
        body = str(self.rid) if header is None else json.dumps({**header, "rid": self.rid})
        self.sock.send_multipart([op, body.encode()])
        frames = self.recv(self.rid)
        if frames[0] != b"ok":
            raise error(frames)
        return json.loads(frames[1])

    @contextmanager
    def waiting(self, timeout_s: float | None) -> Iterator[None]:
        """Within the block, a reply is waited for up to `timeout_s` (None: as usual)."""
        usual, self.timeout_s = self.timeout_s, timeout_s or self.timeout_s
        try:
            yield
        finally:
            self.timeout_s = usual

    def stamp(self, header: dict[str, Any]) -> None:
        """A fresh request id, and the generation of the agent the request is meant for."""
        self.rid += 1
        header["rid"] = self.rid
        if self.generation is not None:
            header["generation"] = self.generation

    def connection_events(self, wait_ms: int) -> bool:
        """Apply pending connect/disconnect events; True if the connection dropped."""
        dropped = False
        while self.events.poll(wait_ms):
            event = zmq_monitor.parse_monitor_message(self.events.recv_multipart())
            if event["event"] == zmq.EVENT_CONNECTED:
                self.connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.connected = False
                self.generation = None  # whoever answers next is learned anew
                dropped = True
            wait_ms = 0
        return dropped

    def recv(self, rid: int) -> list[bytes]:
        """The reply to request `rid`; replies to earlier requests that timed out are dropped.
        CollectiveError when the agent does not answer in time or goes away meanwhile."""
        deadline = time.monotonic() + self.timeout_s + 5.0
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.events, zmq.POLLIN)
        while True:
            left = deadline - time.monotonic()
            ready = dict(poller.poll(max(0, int(left * 1000)))) if left > 0 else {}
            if not ready:
                raise CollectiveError(f"the agent at {self.address} did not answer within "
                                      f"{self.timeout_s:.0f} s; is `oddl agent serve` running?")
            if self.sock in ready:  # a reply that made it before a disconnect still counts
                frames = self.sock.recv_multipart()
                if localapi.reply_rid(frames) in (rid, None):  # None: a request it could not parse
                    return frames
                logger.debug("dropped a late reply from %s (request %s, waiting for %d)",
                             self.address, localapi.reply_rid(frames), rid)
            if self.events in ready and self.connection_events(0):
                raise CollectiveError(
                    f"the agent at {self.address} closed the connection while this request "
                    "was in flight (it stopped or restarted); no result was returned — retry "
                    "once it is back")

    def close(self) -> None:
        """Close the socket and its monitor."""
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:  # the context is gone already (interpreter exit)
            pass
        self.events.close(0)
        self.sock.close(0)


def error(frames: list[bytes]) -> Exception:
    """The typed error an error reply stands for."""
    try:
        info = json.loads(frames[1])
        kind, message = info["kind"], info["message"]
    except (IndexError, ValueError, KeyError):
        return CollectiveError(f"unexpected reply from the agent: {frames[:1]!r}")
    return localapi.error_of_kind(kind, message)
