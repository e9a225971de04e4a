"""The training process's side of the local agent API: `AgentClient(address).allreduce(a)`.

Requests and replies are multipart ZeroMQ messages (JSON header + raw array bytes), never
pickle. Errors come back typed: CollectiveError for a failed collective, OperationRefused for
a request the agent refuses.

The bucket itself does not cross the socket: the client writes it into shared memory that
the agent maps — anonymous memory whose descriptor went to the agent over the bucket socket
beside the local API, or where that is impossible a self-cleaning named file
(`agents.bucket_link`) — and the agent reduces it there in place; the messages carry only the
header. An array from `shared_array()` is that memory already, so it is reduced with no copy
at all. When the agent cannot reach the bucket (it answers ``bucket-unreachable``), the
client falls back to sending the bytes.

Pairing calls across ranks: every all-reduce carries a step number, the client's count of its
calls on that job (or the caller's own, `step=`), and the agents refuse to pair calls whose
numbers differ (`StepMismatch`, on every rank). After each (re)connection the client learns
the agent's generation with a hello and stamps its requests with it, so a request queued
across an agent restart is refused unrun rather than run by the new agent.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq
from zmq.utils import monitor as zmq_monitor

from agents import localapi
from agents.adopted import AdoptedMemory
from agents.bucket_link import Bucket, ClientBuckets, Named
from common.errors import AgentRestarted, BucketUnavailable, CollectiveError, OperationRefused

logger = logging.getLogger(__name__)

CONNECT_GRACE_S = 5.0
"""How long a request waits for the agent's socket to accept a connection (a restart)."""


class AgentClient:
    """Talks to the local agent; one client per training process (not thread-safe)."""

    def __init__(self, address: str, *, timeout_s: float = 120.0, shared_memory: bool = True):
        self.address = address
        self.timeout_s = timeout_s
        self.shared_memory = shared_memory
        self._buckets = ClientBuckets(address)
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # the agent going away (killed, restarted) ends a waiting request at once, and a
        # request is not sent into a connection that is not there
        self._events: zmq.Socket[bytes] = self._sock.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._connected = False
        self._generation: str | None = None
        """The agent process this client talks to (learned by a hello after each connect)."""
        self._steps: dict[str, int] = {}
        """Per job id, the step number of this client's last call on it."""
        self._last_job: str | None = None
        self._sent = False
        self._resolved: tuple[str, int] | None = None
        """The job and step the agent took the call in flight as (from its reply)."""
        self._sock.connect(address)
        self._rid = 0
        # a client nobody closes (`AgentClient(...).allreduce(a)`) lets go when collected
        self._finalizer = weakref.finalize(self, _release, self._sock, self._events,
                                           self._buckets)

    def shared_array(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> np.ndarray:
        """An array in this client's shared-memory bucket: `allreduce` reduces it in place
        with no copy. Valid until the next `shared_array` call that needs more room."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dt = np.dtype(dtype)
        return self._bucket_for(int(np.prod(shape, dtype=np.int64)) * dt.itemsize).array(
            shape, dt)

    def _bucket_for(self, nbytes: int) -> Bucket:
        return self._buckets.for_bytes(nbytes)

    def adopt(self, memory: AdoptedMemory) -> bool:
        """Hand shared memory this process has to the agent as an extra bucket (decision
        record 0017): `allreduce` of an array in it then runs in place, with no copy. False
        when the agent refuses it (or takes no descriptors): such arrays are copied."""
        return self.shared_memory and self._buckets.adopt(
            memory, min(self.timeout_s, CONNECT_GRACE_S))

    def allreduce(self, array: np.ndarray, *, job: str | None = None,
                  out: np.ndarray | None = None, step: int | None = None) -> np.ndarray:
        """Sum `array` across the job's nodes; returns a new array of the same shape and dtype,
        or the sum written into `out` (e.g. `out=array`, in place as gloo does: no new
        memory), or, for an array from `shared_array()`, that array with the sum in place.

        `step` numbers the call; every rank must hand in the same number for the same
        collective. By default the client counts its calls per job (1, 2, ...), so the n-th
        call of every rank on a job pairs with the n-th of the others. A loop that retries a
        failed call, or goes on past one, passes its own number (the training iteration):
        a retry keeps its number. Calls whose numbers differ fail on every rank with
        `StepMismatch`; a call refused unrun (`OperationRefused`) uses up no number."""
        a = np.ascontiguousarray(array)
        if out is not None and (out.shape != a.shape or out.dtype != a.dtype
                                or not out.flags.writeable):
            raise ValueError(f"out must be a writable {a.dtype}{list(a.shape)} array, not "
                             f"{out.dtype}{list(out.shape)}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)
                                 or step < 1):
            raise ValueError(f"step must be a positive integer, not {step!r}")
        header: dict[str, Any] = {"dtype": a.dtype.str, "shape": list(a.shape),
                                  "timeout_s": self.timeout_s, "steps": dict(self._steps)}
        if step is not None:
            header["step"] = step
        if job:
            header["job"] = job
        self._sent, self._resolved, refused = False, None, False
        try:
            try:
                return self._allreduce_once(a, header, out)
            except AgentRestarted:
                # the request reached the agent after it restarted and was not run: learn the
                # new generation and call once more
                self._generation = None
                return self._allreduce_once(a, header, out)
        except OperationRefused:
            refused = True  # refused unrun: the number is not used up
            raise
        finally:
            if self._sent and not refused:
                self._count(job, step)

    def _count(self, job: str | None, step: int | None) -> None:
        """Note the number a call that went to the agent was taken as: the agent says which
        job and step; a call lost in flight (the agent died) counts on the job it was for."""
        if self._resolved is not None:
            job_id, used = self._resolved
        else:
            lost_on = job or self._last_job
            if lost_on is None:
                return
            job_id = lost_on
            used = step if step is not None else self._steps.get(job_id, 0) + 1
        self._steps[job_id] = used
        self._last_job = job_id

    def _allreduce_once(self, a: np.ndarray, header: dict[str, Any], out: np.ndarray | None
                        ) -> np.ndarray:
        if self.shared_memory:
            try:
                return self._allreduce_shared(a, header, out)
            except _NoSharedMemory:
                self.shared_memory = False
        self._ensure_connected()
        self._stamp(header)
        self._sock.send_multipart([b"allreduce", json.dumps(header).encode(), a.tobytes()],
                                  copy=False)
        self._sent = True
        frames = self._recv(self._rid)
        if frames[0] == b"ok" and len(frames) == 3:
            meta = json.loads(frames[1])
            result = np.frombuffer(frames[2], dtype=np.dtype(meta["dtype"])).reshape(meta["shape"])
            if out is not None:
                np.copyto(out, result)
                return out
            return result.copy()
        raise self._error(frames)

    def _stamp(self, header: dict[str, Any]) -> None:
        """A fresh request id, and the generation of the agent the request is meant for."""
        self._rid += 1
        header["rid"] = self._rid
        if self._generation is not None:
            header["generation"] = self._generation

    def _allreduce_shared(self, a: np.ndarray, header: dict[str, Any],
                          out: np.ndarray | None) -> np.ndarray:
        bucket: Named | None = self._buckets.holding(a)  # its own bucket or adopted memory
        in_place = bucket is not None
        if in_place:
            view = a
        else:
            bucket = self._bucket_for(a.nbytes)
            view = bucket.array(a.shape, a.dtype)
            np.copyto(view, a)
        assert bucket is not None
        frames = self._request_on_bucket(bucket, header, in_place)
        if frames[0] == b"ok" and len(frames) >= 2 and json.loads(frames[1]).get("shm"):
            if in_place:
                return view
            if out is not None:
                np.copyto(out, view)
                return out
            return view.copy()
        raise self._error(frames)

    def _request_on_bucket(self, bucket: Named, header: dict[str, Any], in_place: bool
                           ) -> list[bytes]:
        """Send the request naming `bucket`; its reply frames. A restarted agent that does
        not know the bucket gets it handed over again (once); one that cannot reach it makes
        this client send bytes from now on (_NoSharedMemory)."""
        for attempt in (1, 2):
            self._ensure_connected()
            try:
                header.update(self._buckets.naming(bucket, min(self.timeout_s,
                                                                CONNECT_GRACE_S)))
            except BucketUnavailable as exc:
                if exc.kind == "bucket-unknown" and attempt == 1:
                    continue
                raise self._no_shared_memory(exc) from exc
            self._stamp(header)
            self._sock.send_multipart([b"allreduce", json.dumps(header).encode(), b""])
            self._sent = True
            try:
                frames = self._recv(self._rid)
            except CollectiveError:
                # the agent may still finish this collective and write into the bucket later:
                # never hand that memory out again
                if not in_place:
                    self._buckets.discard()
                raise
            error = self._error(frames) if frames[0] != b"ok" else None
            if not isinstance(error, BucketUnavailable):
                return frames
            if error.kind == "bucket-unknown" and attempt == 1:
                self._buckets.agent_forgot()
                continue
            raise self._no_shared_memory(error)
        raise AssertionError("unreachable")

    def _no_shared_memory(self, error: Exception) -> _NoSharedMemory:
        logger.warning("%s: the agent cannot reach this client's shared-memory bucket (%s); "
                       "sending the bytes over the local API from now on", self.address, error)
        return _NoSharedMemory(str(error))

    def status(self) -> dict[str, Any]:
        """The agent's status snapshot."""
        self._rid += 1
        self._ensure_connected()
        self._sock.send_multipart([b"status", str(self._rid).encode()])
        frames = self._recv(self._rid)
        if frames[0] == b"ok":
            return json.loads(frames[1])
        raise self._error(frames)

    def _ensure_connected(self) -> None:
        """Before a request: apply the connection's events so far (a disconnect from before
        does not fail this request), waiting a little for an agent that is (re)starting;
        CollectiveError if none accepts a connection at the address."""
        self._connection_events(0)
        deadline = time.monotonic() + min(self.timeout_s, CONNECT_GRACE_S)
        while not self._connected:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CollectiveError(f"no agent is listening at {self.address} (it stopped, "
                                      "or has not started yet); start it with `oddl agent "
                                      "serve` or check the address")
            self._connection_events(int(left * 1000) + 1)
        if self._generation is None:
            self._hello()

    def _hello(self) -> None:
        """Learn the generation of the agent at the other end of the connection."""
        self._rid += 1
        self._sock.send_multipart([b"hello", str(self._rid).encode()])
        frames = self._recv(self._rid)
        if frames[0] != b"ok":
            raise self._error(frames)
        generation = json.loads(frames[1]).get("generation")
        self._generation = generation if isinstance(generation, str) else None

    def _connection_events(self, wait_ms: int) -> bool:
        """Apply pending connect/disconnect events; True if the connection dropped."""
        dropped = False
        while self._events.poll(wait_ms):
            event = zmq_monitor.parse_monitor_message(self._events.recv_multipart())
            if event["event"] == zmq.EVENT_CONNECTED:
                self._connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._connected = False
                self._generation = None  # whoever answers next is learned anew
                dropped = True
            wait_ms = 0
        return dropped

    def _recv(self, rid: int) -> list[bytes]:
        """The reply to request `rid`; replies to earlier requests that timed out are dropped.
        CollectiveError when the agent does not answer in time or goes away meanwhile."""
        deadline = time.monotonic() + self.timeout_s + 5.0
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._events, zmq.POLLIN)
        while True:
            left = deadline - time.monotonic()
            ready = dict(poller.poll(max(0, int(left * 1000)))) if left > 0 else {}
            if not ready:
                raise CollectiveError(f"the agent at {self.address} did not answer within "
                                      f"{self.timeout_s:.0f} s; is `oddl agent serve` running?")
            if self._sock in ready:  # a reply that made it before a disconnect still counts
                frames = self._sock.recv_multipart()
                if _reply_rid(frames) in (rid, None):  # None: a request it could not parse
                    self._resolved = _reply_resolved(frames) or self._resolved
                    return frames
                logger.debug("dropped a late reply from %s (request %s, waiting for %d)",
                             self.address, _reply_rid(frames), rid)
            if self._events in ready and self._connection_events(0):
                raise CollectiveError(
                    f"the agent at {self.address} closed the connection while this request "
                    "was in flight (it stopped or restarted); no result was returned — retry "
                    "once it is back")

    @staticmethod
    def _error(frames: list[bytes]) -> Exception:
        try:
            info = json.loads(frames[1])
            kind, message = info["kind"], info["message"]
        except (IndexError, ValueError, KeyError):
            return CollectiveError(f"unexpected reply from the agent: {frames[:1]!r}")
        return localapi.error_of_kind(kind, message)

    def close(self) -> None:
        """Release the socket and the shared-memory bucket (also done when the client is
        garbage collected, and at interpreter exit)."""
        self._finalizer()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release(sock: zmq.Socket[bytes], events: zmq.Socket[bytes], buckets: ClientBuckets
             ) -> None:
    """Close a client's sockets and release its bucket (its agent lets go of it then)."""
    try:
        sock.disable_monitor()
    except zmq.ZMQError:  # the context is gone already (interpreter exit)
        pass
    events.close(0)
    sock.close(0)
    buckets.close()


def _reply_rid(frames: list[bytes]) -> int | None:
    try:
        rid = json.loads(frames[1]).get("rid")
    except (IndexError, ValueError, AttributeError):
        return None
    return rid if isinstance(rid, int) else None


def _reply_resolved(frames: list[bytes]) -> tuple[str, int] | None:
    """The job and step a reply says the call was taken as (None when it says nothing)."""
    try:
        resolved = json.loads(frames[1]).get("resolved")
        job, step = resolved["job"], resolved["step"]
    except (IndexError, ValueError, AttributeError, TypeError, KeyError):
        return None
    if isinstance(job, str) and isinstance(step, int) and not isinstance(step, bool):
        return job, step
    return None


class _NoSharedMemory(Exception):
    """The agent cannot reach this client's bucket (another host, another mount of
    /dev/shm, a bucket socket this user may not open)."""


def allreduce_all(clients: Sequence[AgentClient], arrays: Sequence[np.ndarray], *,
                  inplace: bool = False, step: int | None = None) -> tuple[float, list[Any]]:
    """Call allreduce on every client at once (one thread each, released together); with
    `inplace` each sum is written into its input array, as gloo does; `step` numbers the
    call on every client (default: each client's own count).

    Returns the wall time from the common start to the last result, and per client its
    result or the exception it raised (for tests, benchmarks and demos driving all nodes).
    """
    outs: list[Any] = [None] * len(clients)
    start = threading.Barrier(len(clients) + 1)

    def call(r: int) -> None:
        start.wait()
        try:
            outs[r] = clients[r].allreduce(arrays[r], out=arrays[r] if inplace else None,
                                           step=step)
        except Exception as exc:  # handed back to the caller
            outs[r] = exc

    threads = [threading.Thread(target=call, args=(r,)) for r in range(len(clients))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, outs
