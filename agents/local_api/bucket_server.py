"""The agent's side of buckets passed as descriptors: the bucket socket.

Beside an ipc local API socket (`localapi.bucket_socket`: same folder, same mode and group,
so the kernel lets in exactly the users the local API lets in) the agent listens on a Unix
SOCK_SEQPACKET socket. A training process connects once and sends one message per bucket:
``{"op": "bucket"}`` with one memfd attached (SCM_RIGHTS). The agent maps it
(`oddl.common.memfd.map_bucket_fd` refuses anything but a sealed memory file), closes the
received descriptor, and answers ``{"token": T, "bytes": N}``; requests on the local API then
name the bucket by `T`. Each connection holds one such bucket (a new one replaces it).

``{"op": "bucket", "adopt": true}`` with one descriptor hands over memory the process already
had (a tensor's storage moved into shared memory, decision record 0017): kept beside the
connection's own bucket, up to `bucket_registry.MAX_ADOPTED` of them, and requests name it by
its token and a byte offset. From a client of the agent's own uid (SO_PEERCRED) it may be an
unsealed shared-memory file; from any other uid it must be sealed like a bucket.
``{"op": "release", "token": T}`` (no descriptor) unmaps an adopted bucket whose memory the
client freed.

When the connection closes — the client closed, was garbage collected, exited or was
killed — its buckets are unmapped at once (or, while a collective still runs on one, as soon
as that collective lets go). A malformed message gets ``{"kind": "refused", "message": ...}``
and changes nothing.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import selectors
import socket
import stat
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oddl.agents.local_api import wire as localapi
from oddl.agents.local_api.bucket_registry import BucketRegistry
from oddl.common import memfd
from oddl.common.errors import ConfigError, OperationRefused
from oddl.common.memfd import map_bucket_fd
from oddl.common.shm import BucketMaps

logger = logging.getLogger(__name__)

REGISTRATION = b'{"op": "bucket"}'
"""The message that carries a bucket's descriptor."""
ADOPTION = b'{"op": "bucket", "adopt": true}'
"""The message that carries the descriptor of memory the client adopts (decision 0017)."""
MAX_MESSAGE = 1024
"""Longest message the bucket socket reads (a registration is about 20 bytes)."""
_MAX_FDS = 4  # more than one is refused; the kernel discards any beyond this


@dataclass
class _Client:
    key: int
    sock: socket.socket
    pid: int
    uid: int


class BucketServer:
    """The bucket socket of one agent (none for a TCP local API); `serve` it on a thread."""

    def __init__(self, api_address: str, registry: BucketRegistry, node_id: str):
        self.registry = registry
        self.node_id = node_id
        # no memfd (not Linux): no bucket socket; clients use named files instead
        self.path = localapi.bucket_socket(api_address) if memfd.supported() else None
        self._listener: socket.socket | None = None
        self._clients: dict[int, _Client] = {}
        self._keys = itertools.count(1)
        self._selector = selectors.DefaultSelector()
        if self.path is not None:
            self._listener = _bind(self.path, Path(api_address[len("ipc://"):]))
            self._selector.register(self._listener, selectors.EVENT_READ)

    def serve(self, stop: threading.Event) -> None:
        """Accept clients and their buckets until `stop`."""
        if self._listener is None:
            return
        while not stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._receive(key.data)

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
        client = _Client(next(self._keys), sock, pid, uid)
        self._clients[client.key] = client
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _receive(self, client: _Client) -> None:
        try:
            data, fds, flags, _ = socket.recv_fds(client.sock, MAX_MESSAGE, _MAX_FDS)
        except BlockingIOError:
            return
        except OSError:
            self._drop(client)
            return
        try:
            if not data and not fds:  # the client closed (or sent nothing, which we take so)
                self._drop(client)
                return
            reply = self._register(client, data, fds, flags)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            client.sock.send(json.dumps(reply).encode())
        except OSError:  # it does not read its replies: let it go
            self._drop(client)

    def _register(self, client: _Client, data: bytes, fds: list[int], flags: int
                  ) -> dict[str, Any]:
        """The reply to one message: a token for its bucket, or the reason it is refused."""
        try:
            message = _parse_message(data, fds, flags)
            if message["op"] == "release":
                return {"released": self.registry.release(client.key, message["token"])}
            adopt = message.get("adopt") is True
            # an unsealed file could shrink under the agent's mapping (SIGBUS): only a
            # process that could kill the agent anyway may hand one over
            buf = map_bucket_fd(fds[0], sealed=not (adopt and client.uid == os.geteuid()))
        except OperationRefused as exc:
            logger.warning("%s: refused a bucket from pid %d (uid %d): %s", self.node_id,
                           client.pid, client.uid, exc)
            return {"kind": "refused", "message": f"{self.node_id}: {exc}"}
        token = (self.registry.adopt if adopt else self.registry.add)(client.key, client.pid,
                                                                       buf)
        logger.debug("%s: %s of %d B from pid %d", self.node_id,
                     "adopted memory" if adopt else "bucket", len(buf), client.pid)
        return {"token": token, "bytes": len(buf)}

    def _drop(self, client: _Client) -> None:
        self._clients.pop(client.key, None)
        self.registry.drop(client.key)
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
        logger.debug("%s: bucket client pid %d went away", self.node_id, client.pid)

    def close(self) -> None:
        """Close every connection and the socket, and remove its file."""
        for client in list(self._clients.values()):
            self._drop(client)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            if self.path is not None:
                self.path.unlink(missing_ok=True)
        self._selector.close()


def _parse_message(data: bytes, fds: list[int], flags: int) -> dict[str, Any]:
    """The message, or OperationRefused naming what is wrong: a bucket (own or adopted)
    carries exactly one descriptor, a release none."""
    if flags & socket.MSG_TRUNC:
        raise OperationRefused(f"the message is longer than {MAX_MESSAGE} B; send "
                               f"{REGISTRATION.decode()} with one memfd")
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        message = None
    if isinstance(message, dict) and message.get("op") == "release":
        if fds or not isinstance(message.get("token"), str):
            raise OperationRefused('a release is {"op": "release", "token": T} with no '
                                   "descriptor")
        return message
    if flags & socket.MSG_CTRUNC or len(fds) != 1:
        raise OperationRefused(f"the message carries {len(fds)}"
                               f"{'+' if flags & socket.MSG_CTRUNC else ''} descriptors; "
                               "send exactly one memfd per bucket")
    if not isinstance(message, dict) or message.get("op") != "bucket":
        raise OperationRefused(f"the message {data[:60]!r} is not " + REGISTRATION.decode()
                               + "; use oddl.agents.client.agent_client.AgentClient")
    return message


def _bind(path: Path, api_path: Path) -> socket.socket:
    """Listen at `path` with the local API socket's mode and group (its folder was checked
    when the local API bound)."""
    if path.exists() or path.is_symlink():
        if localapi.listening(path, socket.SOCK_SEQPACKET):
            raise ConfigError(f"bucket socket {path} is in use by another process; stop that "
                              "agent or pick another local API path")
        path.unlink()  # left by an agent that was killed; the folder is the agent's own
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    api = api_path.stat()
    os.chown(path, -1, api.st_gid)
    os.chmod(path, stat.S_IMODE(api.st_mode))
    sock.listen(64)
    sock.setblocking(False)
    return sock


def request_array(req: localapi.AllreduceRequest, payload: bytes, registry: BucketRegistry,
                  files: BucketMaps) -> np.ndarray:
    """A request's array: in the client's shared-memory bucket (a descriptor's `registry`, or
    a named file's `files`), run in place, or in the payload. OperationRefused if its bytes do
    not make the array the header says."""
    try:
        if req.bucket is not None or req.shm is not None:
            view = (registry.view(req.bucket, req.nbytes, req.offset) if req.bucket is not None
                    else files.open_bucket(str(req.shm), req.nbytes))
            return np.frombuffer(view, dtype=req.dtype).reshape(req.shape)
        return np.frombuffer(payload, dtype=req.dtype).reshape(req.shape)
    except ValueError as exc:
        raise OperationRefused(f"malformed allreduce request ({exc}); send dtype, shape and "
                               "the array bytes") from exc
