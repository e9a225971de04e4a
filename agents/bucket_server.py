"""The agent's side of buckets passed as descriptors: the bucket socket and the maps.

Beside an ipc local API socket (`localapi.bucket_socket`: same folder, same mode and group,
so the kernel lets in exactly the users the local API lets in) the agent listens on a Unix
SOCK_SEQPACKET socket. A training process connects once and sends one message per bucket:
``{"op": "bucket"}`` with one memfd attached (SCM_RIGHTS). The agent maps it
(`common.memfd.map_bucket_fd` refuses anything but a sealed memory file), closes the
received descriptor, and answers ``{"token": T, "bytes": N}``; requests on the local API then
name the bucket by `T`. Each connection holds at most one bucket (a new one replaces it), and
when the connection closes — the client closed, was garbage collected, exited or was
killed — its bucket is unmapped at once (or, while a collective still runs on it, as soon as
that collective lets go). A malformed message gets ``{"kind": "refused", "message": ...}``
and changes nothing.
"""

from __future__ import annotations

import itertools
import json
import logging
import mmap
import os
import secrets
import selectors
import socket
import stat
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents import localapi
from common import memfd
from common.errors import BucketUnavailable, ConfigError, OperationRefused
from common.memfd import map_bucket_fd
from common.shm import BucketMaps

logger = logging.getLogger(__name__)

REGISTRATION = b'{"op": "bucket"}'
"""The message that carries a bucket's descriptor."""
MAX_MESSAGE = 1024
"""Longest message the bucket socket reads (a registration is about 20 bytes)."""
_MAX_FDS = 4  # more than one is refused; the kernel discards any beyond this


class BucketRegistry:
    """The clients' buckets by token; the bucket socket's thread adds and drops them, the
    collectives thread looks them up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: dict[str, mmap.mmap] = {}
        self._token_of: dict[int, str] = {}
        self._pid_of: dict[str, int] = {}

    def add(self, client: int, pid: int, buf: mmap.mmap) -> str:
        """Keep `buf` as client `client`'s bucket (replacing its previous one); its token."""
        token = secrets.token_hex(16)
        with self._lock:
            old = self._token_of.pop(client, None)
            self._token_of[client] = token
            self._maps[token] = buf
            self._pid_of[token] = pid
            old_buf = self._forget(old)
        _unmap(old_buf)
        return token

    def drop(self, client: int) -> None:
        """Client `client` went away: unmap its bucket."""
        with self._lock:
            buf = self._forget(self._token_of.pop(client, None))
        _unmap(buf)

    def _forget(self, token: str | None) -> mmap.mmap | None:
        if token is None:
            return None
        self._pid_of.pop(token, None)
        return self._maps.pop(token, None)

    def view(self, token: str, nbytes: int) -> memoryview:
        """A writable view of the first `nbytes` of the bucket `token`; BucketUnavailable
        (``bucket-unknown``) for a token this agent does not hold (it restarted, or the
        client's connection closed), OperationRefused for a bucket smaller than `nbytes`."""
        with self._lock:
            buf = self._maps.get(token)
            if buf is None:
                raise BucketUnavailable(
                    "this agent holds no bucket with that token (it restarted, or the "
                    "client's bucket connection closed); hand the descriptor over again",
                    kind="bucket-unknown")
            if len(buf) < nbytes:
                raise OperationRefused(f"the bucket holds {len(buf)} B, the request needs "
                                       f"{nbytes} B")
            return memoryview(buf)[:nbytes]  # made under the lock: never of a closed map

    def holders(self) -> dict[int, int]:
        """Bytes mapped per client process id (for status and tests)."""
        with self._lock:
            out: dict[int, int] = {}
            for token, buf in self._maps.items():
                pid = self._pid_of.get(token, 0)
                out[pid] = out.get(pid, 0) + len(buf)
            return out

    def close(self) -> None:
        """Unmap every bucket."""
        with self._lock:
            bufs = list(self._maps.values())
            self._maps.clear()
            self._token_of.clear()
            self._pid_of.clear()
        for buf in bufs:
            _unmap(buf)


def _unmap(buf: mmap.mmap | None) -> None:
    if buf is None:
        return
    try:
        buf.close()
    except BufferError:  # a collective still runs on it: it unmaps when that lets go
        logger.debug("a bucket is still in use; it is unmapped when released")


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
            _check_message(data, fds, flags)
            buf = map_bucket_fd(fds[0])
        except OperationRefused as exc:
            logger.warning("%s: refused a bucket from pid %d (uid %d): %s", self.node_id,
                           client.pid, client.uid, exc)
            return {"kind": "refused", "message": f"{self.node_id}: {exc}"}
        token = self.registry.add(client.key, client.pid, buf)
        logger.debug("%s: bucket of %d B from pid %d", self.node_id, len(buf), client.pid)
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


def _check_message(data: bytes, fds: list[int], flags: int) -> None:
    """Refuse (OperationRefused, naming what is wrong) anything but one registration
    carrying exactly one descriptor."""
    if flags & socket.MSG_TRUNC:
        raise OperationRefused(f"the message is longer than {MAX_MESSAGE} B; send "
                               f"{REGISTRATION.decode()} with one memfd")
    if flags & socket.MSG_CTRUNC or len(fds) != 1:
        raise OperationRefused(f"the message carries {len(fds)}"
                               f"{'+' if flags & socket.MSG_CTRUNC else ''} descriptors; "
                               "send exactly one memfd per bucket")
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        message = None
    if not isinstance(message, dict) or message.get("op") != "bucket":
        raise OperationRefused(f"the message {data[:60]!r} is not " + REGISTRATION.decode()
                               + "; use agents.client.AgentClient")


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
            view = (registry.view(req.bucket, req.nbytes) if req.bucket is not None
                    else files.open_bucket(str(req.shm), req.nbytes))
            return np.frombuffer(view, dtype=req.dtype).reshape(req.shape)
        return np.frombuffer(payload, dtype=req.dtype).reshape(req.shape)
    except ValueError as exc:
        raise OperationRefused(f"malformed allreduce request ({exc}); send dtype, shape and "
                               "the array bytes") from exc
