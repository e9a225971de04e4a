"""The training process's side of the local agent API: `AgentClient(address).allreduce(a)`.

Requests and replies are multipart ZeroMQ messages (JSON header + raw array bytes), never
pickle. Errors come back typed: CollectiveError for a failed collective, OperationRefused for
a request the agent refuses.

The bucket itself does not cross the socket: the client writes it into a shared-memory file
(`oddl.agents.shm`) that the agent maps, and the agent reduces it there in place; the messages
carry only the header. An array from `shared_array()` is that memory already, so it is reduced
with no copy at all. When the agent cannot map the file (another host), the client falls back
to sending the bytes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq

from oddl.agents import localapi
from oddl.agents.shm import SharedBucket
from oddl.errors import CollectiveError, OperationRefused


class AgentClient:
    """Talks to the local agent; one client per training process (not thread-safe)."""

    def __init__(self, address: str, *, timeout_s: float = 120.0, shared_memory: bool = True):
        self.address = address
        self.timeout_s = timeout_s
        self.shared_memory = shared_memory
        self._bucket: SharedBucket | None = None
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)

    def shared_array(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> np.ndarray:
        """An array in this client's shared-memory bucket: `allreduce` reduces it in place
        with no copy. Valid until the next `shared_array` call that needs more room."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dt = np.dtype(dtype)
        return self._bucket_for(int(np.prod(shape, dtype=np.int64)) * dt.itemsize).array(
            shape, dt)

    def _bucket_for(self, nbytes: int) -> SharedBucket:
        if self._bucket is None or self._bucket.size < nbytes:
            if self._bucket is not None:
                self._bucket.close()
            self._bucket = SharedBucket(nbytes, group=localapi.shared_group(self.address))
        return self._bucket

    def allreduce(self, array: np.ndarray, *, job: str | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
        """Sum `array` across the job's nodes; returns a new array of the same shape and dtype,
        or the sum written into `out` (e.g. `out=array`, in place as gloo does: no new
        memory), or, for an array from `shared_array()`, that array with the sum in place."""
        a = np.ascontiguousarray(array)
        if out is not None and (out.shape != a.shape or out.dtype != a.dtype
                                or not out.flags.writeable):
            raise ValueError(f"out must be a writable {a.dtype}{list(a.shape)} array, not "
                             f"{out.dtype}{list(out.shape)}")
        header: dict[str, Any] = {"dtype": a.dtype.str, "shape": list(a.shape),
                                  "timeout_s": self.timeout_s}
        if job:
            header["job"] = job
        if self.shared_memory:
            try:
                return self._allreduce_shared(a, header, out)
            except _NoSharedMemory:
                self.shared_memory = False
        self._sock.send_multipart([b"allreduce", json.dumps(header).encode(), a.tobytes()],
                                  copy=False)
        frames = self._recv()
        if frames[0] == b"ok" and len(frames) == 3:
            meta = json.loads(frames[1])
            result = np.frombuffer(frames[2], dtype=np.dtype(meta["dtype"])).reshape(meta["shape"])
            if out is not None:
                np.copyto(out, result)
                return out
            return result.copy()
        raise self._error(frames)

    def _allreduce_shared(self, a: np.ndarray, header: dict[str, Any],
                          out: np.ndarray | None) -> np.ndarray:
        in_place = self._bucket is not None and self._bucket.owns(a)
        if in_place:
            view = a
        else:
            view = self._bucket_for(a.nbytes).array(a.shape, a.dtype)
            np.copyto(view, a)
        assert self._bucket is not None
        header["shm"] = str(self._bucket.path)
        self._sock.send_multipart([b"allreduce", json.dumps(header).encode(), b""])
        frames = self._recv()
        if frames[0] == b"ok" and len(frames) >= 2 and json.loads(frames[1]).get("shm"):
            if in_place:
                return view
            if out is not None:
                np.copyto(out, view)
                return out
            return view.copy()
        error = self._error(frames)
        if isinstance(error, OperationRefused) and "bucket file" in str(error):
            raise _NoSharedMemory(str(error))
        raise error

    def status(self) -> dict[str, Any]:
        """The agent's status snapshot."""
        self._sock.send_multipart([b"status"])
        frames = self._recv()
        if frames[0] == b"ok":
            return json.loads(frames[1])
        raise self._error(frames)

    def _recv(self) -> list[bytes]:
        if not self._sock.poll(int(self.timeout_s * 1000) + 5000):
            raise CollectiveError(f"the agent at {self.address} did not answer within "
                                  f"{self.timeout_s:.0f} s; is `oddl agent serve` running?")
        return self._sock.recv_multipart()

    @staticmethod
    def _error(frames: list[bytes]) -> Exception:
        try:
            info = json.loads(frames[1])
            kind, message = info["kind"], info["message"]
        except (IndexError, ValueError, KeyError):
            return CollectiveError(f"unexpected reply from the agent: {frames[:1]!r}")
        if kind == "collective":
            return CollectiveError(message)
        return OperationRefused(message)

    def close(self) -> None:
        """Release the socket and the shared-memory bucket."""
        self._sock.close(0)
        if self._bucket is not None:
            self._bucket.close()
            self._bucket = None

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _NoSharedMemory(Exception):
    """The agent cannot map this client's bucket (it runs on another host)."""


def allreduce_all(clients: Sequence[AgentClient], arrays: Sequence[np.ndarray], *,
                  inplace: bool = False) -> tuple[float, list[Any]]:
    """Call allreduce on every client at once (one thread each, released together); with
    `inplace` each sum is written into its input array, as gloo does.

    Returns the wall time from the common start to the last result, and per client its
    result or the exception it raised (for tests, benchmarks and demos driving all nodes).
    """
    outs: list[Any] = [None] * len(clients)
    start = threading.Barrier(len(clients) + 1)

    def call(r: int) -> None:
        start.wait()
        try:
            outs[r] = clients[r].allreduce(arrays[r], out=arrays[r] if inplace else None)
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
