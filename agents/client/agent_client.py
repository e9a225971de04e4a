"""The training process's side of the local agent API: `AgentClient(address).allreduce(a)`.

Requests and replies are multipart ZeroMQ messages (JSON header + raw array bytes), never
pickle. Errors come back typed: CollectiveError for a failed collective, OperationRefused for
a request the agent refuses.

The bucket itself does not cross the socket: the client writes it into shared memory that
the agent maps — anonymous memory whose descriptor went to the agent over the bucket socket
beside the local API, or where that is impossible a self-cleaning named file
(`oddl.agents.client.buckets`) — and the agent reduces it there in place; the messages carry only the
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
import weakref
from typing import Any

import numpy as np

from oddl.agents.client import collectives as kinds
from oddl.agents.client.adopted import AdoptedMemory
from oddl.agents.client.buckets import Bucket, ClientBuckets, Named
from oddl.agents.client.connection import CONNECT_GRACE_S, AgentSocket
from oddl.agents.client.connection import error as error_of_reply
from oddl.agents.client.steps import StepCount
from oddl.agents.local_api import callers
from oddl.agents.local_api import wire as localapi
from oddl.common.call_marks import MARKS
from oddl.common.errors import AgentRestarted, BucketUnavailable, CollectiveError, OperationRefused

logger = logging.getLogger(__name__)


class AgentClient:
    """Talks to the local agent; one client per training process (not thread-safe)."""

    def __init__(self, address: str, *, timeout_s: float = 120.0, shared_memory: bool = True):
        self.address = address
        self.shared_memory = shared_memory
        self._buckets = ClientBuckets(address)
        self._conn = AgentSocket(address, timeout_s)
        self.steps = StepCount()
        """The step numbers its calls used per job (`oddl.agents.client.steps`)."""
        self._steps = self.steps.last  # read by oddl.torch.trace
        self._sent = False
        self._resolved: tuple[str, int] | None = None
        self._last_reply: list[bytes] = []
        """The job and step the agent took the call in flight as (from its reply)."""
        self._worlds: dict[str | None, tuple[int, int]] = {}
        """Per job argument, (rank, world) as the agent said (`world`)."""
        self._caller = callers.identity()
        """This process, as its requests name it: the agent voids the call in flight of a
        process that is gone (decision record 0033)."""
        # a client nobody closes (`AgentClient(...).allreduce(a)`) lets go when collected
        self._finalizer = weakref.finalize(self, _release, self._conn, self._buckets)

    @property
    def timeout_s(self) -> float:
        """How long a call waits for the agent (its collective's timeout)."""
        return self._conn.timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self._conn.timeout_s = value

    def shared_array(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> np.ndarray:
        """An array in this client's shared-memory bucket: `allreduce` reduces it in place
        with no copy. Valid until the next `shared_array` call that needs more room."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dt = np.dtype(dtype)
        return self._bucket_for(int(np.prod(shape, dtype=np.int64)) * dt.itemsize).array(
            shape, dt)

    def _bucket_for(self, nbytes: int) -> Bucket:
        return self._buckets.for_bytes(nbytes)

    def bucket_bytes(self) -> int:
        """How many bytes the client's own bucket holds now (0: none yet)."""
        return self._buckets.bucket.size if self._buckets.bucket is not None else 0

    def adopt(self, memory: AdoptedMemory) -> bool:
        """Hand shared memory this process has to the agent as an extra bucket (decision
        record 0017): `allreduce` of an array in it then runs in place, with no copy. False
        when the agent refuses it (or takes no descriptors): such arrays are copied."""
        return self.shared_memory and self._buckets.adopt(
            memory, min(self.timeout_s, CONNECT_GRACE_S))

    def allreduce(self, array: np.ndarray, *, op: str = "sum", job: str | None = None,
                  step: int | None = None, out: np.ndarray | None = None,
                  timeout_s: float | None = None) -> np.ndarray:
        """Reduce `array` elementwise across the job's nodes with `op` (sum, min, max, prod;
        band, bor, bxor for integers); returns a new array of the same shape and dtype, or
        the result written into `out` (e.g. `out=array`, in place as gloo does: no new
        memory), or, for an array from `shared_array()`, that array with the result in place.

        `step` numbers the call; every rank must hand in the same number for the same
        collective. By default the client counts its calls per job (1, 2, ...), so the n-th
        call of every rank on a job pairs with the n-th of the others. A loop that retries a
        failed call, or goes on past one, passes its own number (the training iteration):
        a retry keeps its number. Calls whose numbers (or ops) differ fail on every rank with
        `StepMismatch`; a call refused unrun (`OperationRefused`) uses up no number."""
        return self.call_collective(array, "all_reduce", op=op, job=job, step=step, out=out,
                                    timeout_s=timeout_s)

    def all_gather(self, array: np.ndarray, *, out: np.ndarray | None = None,
                   job: str | None = None, step: int | None = None,
                   timeout_s: float | None = None) -> np.ndarray:
        """Every rank's `array` in rank order: shape (world, *array.shape)."""
        return kinds.all_gather(self, array, out, kinds.options(job, step, timeout_s))

    def reduce_scatter(self, array: np.ndarray, *, op: str = "sum",
                       out: np.ndarray | None = None, job: str | None = None,
                       step: int | None = None, timeout_s: float | None = None) -> np.ndarray:
        """This rank's block of the reduction of every rank's (world, *s) `array`: (*s)."""
        return kinds.reduce_scatter(self, array, op, out, kinds.options(job, step, timeout_s))

    def broadcast(self, array: np.ndarray, *, root: int, job: str | None = None,
                  step: int | None = None, timeout_s: float | None = None) -> np.ndarray:
        """Rank `root`'s `array` on every rank, in place when `array` is writable."""
        return kinds.broadcast(self, array, root, kinds.options(job, step, timeout_s))

    def all_to_all(self, array: np.ndarray, *, out: np.ndarray | None = None,
                   job: str | None = None, step: int | None = None,
                   timeout_s: float | None = None) -> np.ndarray:
        """`array` (world, *s): block j goes to rank j; result[i] came from rank i."""
        return kinds.all_to_all(self, array, out, kinds.options(job, step, timeout_s))

    def gather(self, array: np.ndarray, *, root: int, out: np.ndarray | None = None,
               job: str | None = None, step: int | None = None,
               timeout_s: float | None = None) -> np.ndarray | None:
        """Every rank's `array` at `root` as (world, *array.shape); None on other ranks."""
        return kinds.gather(self, array, root, out, kinds.options(job, step, timeout_s))

    def scatter(self, array: np.ndarray | None, *, root: int, out: np.ndarray | None = None,
                job: str | None = None, step: int | None = None,
                timeout_s: float | None = None) -> np.ndarray:
        """Block `rank` of the root's (world, *s) `array`; other ranks pass None and `out`."""
        return kinds.scatter(self, array, root, out, kinds.options(job, step, timeout_s))

    def send(self, array: np.ndarray, dst: int, *, tag: int = 0, job: str | None = None,
             session: str = "", timeout_s: float | None = None) -> None:
        """Send `array` to rank `dst` of the job as a point-to-point flow on its own circuit
        (the controller tunes this node's transmitter to `dst`'s channel when it is
        elsewhere); returns once the data is on its way. Sends and receives pair in order
        per (sender, receiver, tag) within one `session` (a name both sides give, such as a
        run's id: a flow a run left unreceived never pairs with the next run's receive);
        they are no collective of the job (no step number)."""
        self.call_p2p(array, "send", dst, (tag, session), job, None, timeout_s)

    def recv(self, out: np.ndarray, src: int, *, tag: int = 0, job: str | None = None,
             session: str = "", timeout_s: float | None = None) -> np.ndarray:
        """Receive the next flow from rank `src` on `tag` into `out` (a writable array of the
        sender's shape and dtype); returns `out`."""
        return self.call_p2p(out, "recv", src, (tag, session), job, out, timeout_s)

    def recv_any(self, out: np.ndarray, *, tag: int = 0, job: str | None = None,
                 session: str = "", timeout_s: float | None = None) -> tuple[np.ndarray, int]:
        """Receive the first flow from any rank on `tag` into `out`; (`out`, its sender's
        rank)."""
        self.call_p2p(out, "recv_any", 0, (tag, session), job, out, timeout_s)
        source = localapi.reply_field(self._last_reply, "source")
        if not isinstance(source, int):
            raise CollectiveError(f"the agent at {self.address} did not say which rank sent "
                                  "the flow it received")
        return out, source

    def call_p2p(self, array: np.ndarray, kind: str, peer: int, channel: tuple[int, str],
                 job: str | None, out: np.ndarray | None, timeout_s: float | None
                 ) -> np.ndarray:
        """Have the agent run a send or a receive (`oddl.agents.point_to_point`); its result as
        `allreduce` returns one (the received array; for a send, nothing to read)."""
        if isinstance(peer, bool) or not isinstance(peer, int) or peer < 0:
            raise ValueError(f"the peer of a {kind} must be a rank number, not {peer!r}")
        if kind != "send" and not (array.flags.writeable and array.flags.c_contiguous):
            raise ValueError(f"{kind} needs a writable, contiguous out array")
        a = np.ascontiguousarray(array)
        header: dict[str, Any] = {"dtype": a.dtype.str, "shape": list(a.shape),
                                  "timeout_s": timeout_s or self.timeout_s, "kind": kind,
                                  "root": peer, "tag": channel[0], "session": channel[1]}
        self._origin(header, job)
        with self._conn.waiting(timeout_s):
            return self._request(a, header, out)

    def world(self, job: str | None = None) -> tuple[int, int]:
        """(this node's rank, the number of ranks) of the job a call naming `job` runs on."""
        if job not in self._worlds:
            info = self.ask_world(job)
            self._worlds[job] = (int(info["rank"]), len(info["nodes"]))
        return self._worlds[job]

    def ask_world(self, job: str | None = None, **more: Any) -> dict[str, Any]:
        """The agent's answer on `job`: id, rank, nodes, last step, and `more` (ADR 0040)."""
        self._conn.ensure_connected()
        return self._conn.query(b"world", {**({"job": job} if job else {}), **more})

    def steps_seen(self, job: str | None = None) -> tuple[str, int]:
        """(the job a call naming `job` runs on, the highest step number a call of that job
        had at this node's agent, from any process): a new process group's ranks number
        their calls after it (decision record 0033). Asked anew each time."""
        info = self.ask_world(job)
        return str(info["job"]), int(info.get("last_step", 0))

    def in_bucket(self, array: np.ndarray) -> bool:
        """Whether `array` lives in this client's shared-memory bucket."""
        return (bucket := self._buckets.bucket) is not None and bucket.owns(array)

    def holds(self, array: np.ndarray) -> bool:
        """Whether the agent reaches `array` where it is (the bucket, or memory this client
        handed it with `adopt`): a collective on it runs in place, with no copy."""
        return self._buckets.holding(array) is not None

    def call_collective(self, array: np.ndarray, kind: str, *, op: str = "sum", root: int = 0,
                        world: int | None = None, job: str | None = None,
                        step: int | None = None, out: np.ndarray | None = None,
                        timeout_s: float | None = None) -> np.ndarray:
        """Run collective `kind` on `array`, a work buffer laid out for `world` ranks
        (`oddl.agents.client.collectives`); the result as `allreduce` returns it."""
        call = {k: v for k, v in (("kind", kind), ("op", op), ("root", root), ("world", world))
                if v not in (None, "all_reduce", "sum", 0)}  # the defaults go unsaid
        try:
            with self._conn.waiting(timeout_s):
                return self._call(array, call, job, step, out)
        except OperationRefused:
            self._worlds.clear()  # maybe laid out for a job that changed: ask anew next time
            raise

    def _call(self, array: np.ndarray, call: dict[str, Any], job: str | None,
              step: int | None, out: np.ndarray | None) -> np.ndarray:
        a = np.ascontiguousarray(array)
        if out is not None and (out.shape != a.shape or out.dtype != a.dtype
                                or not out.flags.writeable):
            raise ValueError(f"out must be a writable {a.dtype}{list(a.shape)} array, not "
                             f"{out.dtype}{list(out.shape)}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)
                                 or step < 1):
            raise ValueError(f"step must be a positive integer, not {step!r}")
        header: dict[str, Any] = {"dtype": a.dtype.str, "shape": list(a.shape),
                                  "timeout_s": self.timeout_s, "steps": dict(self.steps.last),
                                  **call}
        if step is not None:
            header["step"] = step
        self._origin(header, job)
        self._sent, self._resolved, refused = False, None, False
        try:
            return self._request(a, header, out)
        except OperationRefused:
            refused = True  # refused unrun: the number is not used up
            raise
        finally:
            if self._sent and not refused:
                self.steps.note(self._resolved, job, step)

    def _origin(self, header: dict[str, Any], job: str | None) -> None:
        """Say in a request's header which job it is for and which process makes it (the
        agent voids the call of a process that is gone: decision record 0033)."""
        if job:
            header["job"] = job
        if self._caller is not None:
            header["caller"] = self._caller

    def _request(self, a: np.ndarray, header: dict[str, Any], out: np.ndarray | None
                 ) -> np.ndarray:
        """Make the request; once more when it reached an agent that had restarted and was
        refused unrun (the client learns the new generation first)."""
        try:
            return self._allreduce_once(a, header, out)
        except AgentRestarted:
            self._conn.generation = None
            return self._allreduce_once(a, header, out)

    def _allreduce_once(self, a: np.ndarray, header: dict[str, Any], out: np.ndarray | None
                        ) -> np.ndarray:
        if self.shared_memory:
            try:
                return self._allreduce_shared(a, header, out)
            except _NoSharedMemory:
                self.shared_memory = False
        self._conn.ensure_connected()
        self._conn.stamp(header)
        self._conn.sock.send_multipart([b"allreduce", json.dumps(header).encode(), a.tobytes()],
                                  copy=False)
        self._sent = True
        frames = self._reply()
        if frames[0] == b"ok" and len(frames) == 3:
            meta = json.loads(frames[1])
            result = np.frombuffer(frames[2], dtype=np.dtype(meta["dtype"])).reshape(meta["shape"])
            if out is not None:
                np.copyto(out, result)
                return out
            return result.copy()
        raise error_of_reply(frames)

    def _allreduce_shared(self, a: np.ndarray, header: dict[str, Any],
                          out: np.ndarray | None) -> np.ndarray:
        bucket: Named | None = self._buckets.holding(a)  # its own bucket or adopted memory
        in_place = bucket is not None
        if in_place:
            view = a
        else:
            bucket = self._bucket_for(a.nbytes)
            view = bucket.array(a.shape, a.dtype)
            if header.get("kind") != "recv":  # a receive only writes the bucket
                np.copyto(view, a)
        assert bucket is not None
        MARKS.mark("client_bucket")
        frames = self._request_on_bucket(bucket, header, in_place)
        if frames[0] == b"ok" and len(frames) >= 2 and json.loads(frames[1]).get("shm"):
            if in_place or header.get("kind") == "send":  # a send has nothing to read back
                return view
            if out is not None:
                np.copyto(out, view)
                return out
            return view.copy()
        raise error_of_reply(frames)

    def _request_on_bucket(self, bucket: Named, header: dict[str, Any], in_place: bool
                           ) -> list[bytes]:
        """Send the request naming `bucket`; its reply frames. A restarted agent that does
        not know the bucket gets it handed over again (once); one that cannot reach it makes
        this client send bytes from now on (_NoSharedMemory)."""
        for attempt in (1, 2):
            self._conn.ensure_connected()
            try:
                header.update(self._buckets.naming(bucket, min(self.timeout_s,
                                                                CONNECT_GRACE_S)))
            except BucketUnavailable as exc:
                if exc.kind == "bucket-unknown" and attempt == 1:
                    continue
                raise self._no_shared_memory(exc) from exc
            self._conn.stamp(header)
            MARKS.mark("client_send")
            self._conn.sock.send_multipart([b"allreduce", json.dumps(header).encode(), b""])
            self._sent = True
            try:
                frames = self._reply()
                MARKS.mark("client_reply")
            except CollectiveError:
                # the agent may still finish this collective and write into the bucket later:
                # never hand that memory out again
                if not in_place:
                    self._buckets.discard()
                raise
            error = error_of_reply(frames) if frames[0] != b"ok" else None
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
        self._conn.ensure_connected()
        return self._conn.query(b"status")

    def _reply(self) -> list[bytes]:
        """The reply to the request just sent; notes the job and step it was taken as."""
        frames = self._conn.recv(self._conn.rid)
        self._last_reply = frames
        self._resolved = localapi.reply_resolved(frames) or self._resolved
        return frames

    def close(self) -> None:
        """Release the socket and the shared-memory bucket (also done when the client is
        garbage collected, and at interpreter exit)."""
        self._finalizer()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release(conn: AgentSocket, buckets: ClientBuckets) -> None:
    """Close a client's socket and release its bucket (its agent lets go of it then)."""
    conn.close()
    buckets.close()


class _NoSharedMemory(Exception):
    """The agent cannot reach this client's bucket (another host, another mount of
    /dev/shm, a bucket socket this user may not open)."""
