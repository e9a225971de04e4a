"""The fast data plane: one TCP stream per (job, peer), chunks received into reused buffers.

A collective's transfers are cut into chunks (`CHUNK_BYTES`). Each chunk goes on the wire as a
fixed binary header (`ChunkHead`) followed by its payload, on a persistent TCP connection from
the sender to the receiver that belongs to one job. At the receiver a thread per stream reads
every chunk as soon as it arrives into a recycled buffer (no allocation, no page faults per
message) and queues it; the collective executor takes chunks in order and reduces each into
the bucket. One kernel copy in, one out, per hop. Because every stream is always drained, a
sender never waits for the receiver to turn to it: a node that hears several senders in one
step cannot deadlock them through full socket buffers.

Streams are ordered, so chunks are taken in the order they were sent. Chunks of an older
collective (left behind by a failed one) are skipped; a chunk from further ahead than the
receiver expects stays at the head of its queue until asked for.

Two modes:
- direct (the lab): the optical circuit *is* the host link; chunks go to the named peer.
- emulated optics (`phy` given): an emulated physical layer (`agents.lightphy`) decides
  where the light of this node's transmitter goes when the chunk is sent, paces the
  transmitter at the line rate, and at the receiver holds each chunk until the end of its
  serialisation and checks that the light path held for its whole duration; chunks go where
  the light goes, and are lost when the path changes under them.

Hello on connect: b"ODS1", u16 length, JSON {"job", "src"}. Never pickle.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from agents.streamauth import MAC_BYTES, NONCE_BYTES, AuthError, StreamAuth
from agents.streamauth import REPLY as AUTH_REPLY
from common.errors import CollectiveError

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
"""Largest payload of one chunk: big enough that Python's per-chunk cost is small against the
copy, small enough that sending, receiving and reducing overlap."""

SOCKET_BUFFER = 4 << 20
POLL_S = 0.05
HELLO = b"ODS1"
MAGIC = b"ODC1"
_HEAD = struct.Struct("<4sIIQQIIdd")


def node_tag(node: str) -> int:
    """A 32-bit tag of a node id, carried in each chunk to detect misrouted light."""
    return zlib.crc32(node.encode())


@dataclass(frozen=True)
class ChunkHead:
    """One chunk's header: where its payload goes in the receiver's bucket, and its time on
    the emulated wire (zeros on direct links)."""

    seq: int
    step: int
    offset: int
    nbytes: int
    dst_tag: int
    epoch: int = 0
    t_start: float = 0.0
    t_end: float = 0.0

    def pack(self) -> bytes:
        """The 52-byte wire form."""
        return _HEAD.pack(MAGIC, self.seq, self.step, self.offset, self.nbytes, self.dst_tag,
                          self.epoch, self.t_start, self.t_end)

    @staticmethod
    def unpack(raw: bytes | bytearray | memoryview) -> ChunkHead:
        """Parse a header; ValueError names what is wrong."""
        magic, seq, step, offset, nbytes, tag, epoch, t0, t1 = _HEAD.unpack(raw)
        if magic != MAGIC:
            raise ValueError(f"bad chunk magic {magic!r}")
        return ChunkHead(seq, step, offset, nbytes, tag, epoch, t0, t1)


HEAD_BYTES = _HEAD.size


class Phy(Protocol):
    """The emulated physical layer: where light goes, and when a chunk is on the wire."""

    def transmit(self, src: str, dst: str | None, nbytes: int,
                 cancel: threading.Event | None) -> tuple[str | None, str, int, float, float]:
        """Wait until the transmitter is free, then return (node the light reaches or None,
        reason when none, path epoch, serialisation start, serialisation end); `dst` given
        means the ideal electrical network, which delivers to it."""

    def receive(self, src: str, head: ChunkHead, arrived: float,
                cancel: threading.Event | None) -> str:
        """Hold the chunk until its delivery time; return "" or why it is lost. `arrived`:
        when its last byte was read (time.monotonic)."""

    def lost(self, src: str, reason: str, nbytes: int) -> None:
        """Count a chunk whose light reached no receiver."""


MAX_CHUNK = 64 << 20
"""A header announcing a bigger payload is garbage: the stream is dropped."""


class _Pool:
    """Recycled payload buffers, so a chunk costs no allocation (and no page faults)."""

    def __init__(self, keep: int = 64):
        self._free: list[bytearray] = []
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bytearray:
        with self._lock:  # the most recently used first: still in the caches
            for i in range(len(self._free) - 1, -1, -1):
                if len(self._free[i]) >= nbytes:
                    return self._free.pop(i)
        return bytearray(max(nbytes, CHUNK_BYTES))

    def give(self, buf: bytearray) -> None:
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buf)


class _Inbound:
    """One accepted stream and the thread that reads it: every chunk is read as soon as it
    arrives (so a sender never waits for this node to turn to it, which could deadlock a
    plan whose receiver hears several senders) and queued, in order, for the executor."""

    def __init__(self, sock: socket.socket, pool: _Pool, cond: threading.Condition,
                 name: str, on_malformed: Callable[[str], None]):
        self.sock = sock
        self.queue: deque[tuple[ChunkHead, bytearray, float]] = deque()
        self.alive = True
        self.lent: bytearray | None = None
        self._pool = pool
        self._cond = cond
        self._on_malformed = on_malformed
        self._thread = threading.Thread(target=self._read, name=name, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        head_buf = bytearray(HEAD_BYTES)
        try:
            while True:
                if not _recv_all(self.sock, memoryview(head_buf)):
                    return
                head = ChunkHead.unpack(head_buf)
                if head.nbytes > MAX_CHUNK:
                    raise ValueError(f"a chunk of {head.nbytes} B (at most {MAX_CHUNK})")
                buf = self._pool.take(head.nbytes)
                if not _recv_all(self.sock, memoryview(buf)[:head.nbytes]):
                    return
                with self._cond:
                    self.queue.append((head, buf, time.monotonic()))
                    self._cond.notify_all()
        except (ValueError, struct.error) as exc:
            self._on_malformed(str(exc))
        except OSError:
            pass
        finally:
            with self._cond:
                self.alive = False
                self._cond.notify_all()
            self.close()

    def recycle(self) -> None:
        """Return the buffer lent out by the last chunk taken."""
        if self.lent is not None:
            self._pool.give(self.lent)
            self.lent = None

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader blocked in recv
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass


def _parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    return host.strip("[]"), int(port)


class StreamLink:
    """Chunk streams over TCP between this node and its peers (see the module docstring)."""

    def __init__(self, node_id: str, bind: str, *, phy: Phy | None = None,
                 auth: StreamAuth | None = None):
        self.node_id = node_id
        self.auth = auth
        self.tag = node_tag(node_id)
        self.phy = phy
        host, port = _parse_address(bind)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(64)
        self._listener.settimeout(POLL_S)
        self.address = f"tcp://{host}:{self._listener.getsockname()[1]}"
        self._peers: dict[str, str] = {}
        self._out: dict[tuple[str, str], socket.socket] = {}
        self._in: dict[tuple[str, str], list[_Inbound]] = {}
        self._pool = _Pool()
        self._cond = threading.Condition()
        self._out_lock = threading.Lock()
        self._stop = threading.Event()
        self.sent_bytes = 0
        self.received_bytes = 0
        self.sent_by_peer: Counter[str] = Counter()
        self.misrouted = 0
        self.malformed = 0
        self.stale = 0
        self.refused_auth = 0
        self._thread = threading.Thread(target=self._accept_loop, name=f"{node_id}-streams",
                                        daemon=True)
        self._thread.start()

    # ---- peers and connections --------------------------------------------------------
    def set_peers(self, peers: Mapping[str, str]) -> None:
        """Learn (or update) each peer's stream address."""
        with self._out_lock:
            for node, address in peers.items():
                if node != self.node_id and address:
                    if self._peers.get(node) not in (None, address):
                        for key in [k for k in self._out if k[1] == node]:
                            self._out.pop(key).close()
                    self._peers[node] = address

    def _connect(self, job: str, dst: str) -> socket.socket:
        with self._out_lock:
            sock = self._out.get((job, dst))
            if sock is not None:
                return sock
            address = self._peers.get(dst)
        if address is None:
            raise CollectiveError(f"{self.node_id}: no data address for peer {dst}; it has not "
                                  "registered with the controller")
        try:
            sock = socket.create_connection(_parse_address(address), timeout=5.0)
        except OSError as exc:
            raise CollectiveError(f"{self.node_id}: cannot reach {dst} at {address} ({exc}); "
                                  "is its agent running?") from exc
        _tune(sock)
        try:
            self._hello(sock, job, dst)
        except (OSError, AuthError) as exc:
            sock.close()
            raise CollectiveError(f"{self.node_id}: {dst} at {address} refused the data "
                                  f"stream or failed to prove its identity ({exc}); check "
                                  "that every host has the same [security] certs") from exc
        sock.settimeout(POLL_S)
        with self._out_lock:
            old = self._out.pop((job, dst), None)
            if old is not None:
                old.close()
            self._out[(job, dst)] = sock
        return sock

    def _hello(self, sock: socket.socket, job: str, dst: str) -> None:
        """Announce the stream; in secure mode, prove who we are and check who answers."""
        msg: dict[str, str] = {"job": job, "src": self.node_id}
        if self.auth is None:
            raw = json.dumps(msg).encode()
            sock.sendall(HELLO + struct.pack("<H", len(raw)) + raw)
            return
        cn = self.auth.nonce()
        msg["nonce"] = cn.hex()
        raw = json.dumps(msg).encode()
        sock.sendall(HELLO + struct.pack("<H", len(raw)) + raw)
        reply = _recv_exact_blocking(sock, len(AUTH_REPLY) + NONCE_BYTES + MAC_BYTES)
        if reply[:len(AUTH_REPLY)] != AUTH_REPLY:
            raise AuthError("the peer does not run secure mode")
        sn = reply[len(AUTH_REPLY):len(AUTH_REPLY) + NONCE_BYTES]
        self.auth.check_server(dst, job, cn, sn, reply[-MAC_BYTES:])
        sock.sendall(self.auth.client_proof(dst, job, cn, sn))

    def _drop_out(self, job: str, dst: str, sock: socket.socket) -> None:
        with self._out_lock:
            if self._out.get((job, dst)) is sock:
                del self._out[(job, dst)]
        sock.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            # the hello is read on a thread of its own: a slow or silent client cannot hold
            # up the other connections
            threading.Thread(target=self._handshake, args=(sock,), daemon=True,
                             name=f"{self.node_id}-hello").start()

    def _handshake(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(5.0)
            head = _recv_exact_blocking(sock, 6)
            if head[:4] != HELLO:
                raise ValueError(f"bad hello {head[:4]!r}")
            (n,) = struct.unpack("<H", head[4:])
            hello = json.loads(_recv_exact_blocking(sock, n))
            key = (str(hello["job"]), str(hello["src"]))
            if self.auth is not None:
                self._prove(sock, hello, key)
        except AuthError as exc:
            self.refused_auth += 1
            logger.warning("%s: refused a data stream: %s", self.node_id, exc)
            sock.close()
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.malformed += 1
            logger.warning("%s: refused a data connection (%s)", self.node_id, exc)
            _drain_and_close(sock)
            return
        _tune(sock)
        sock.settimeout(None)
        with self._cond:
            if self._stop.is_set():
                sock.close()
                return
            # a sender that reconnects opens a new stream; what the old one delivered in
            # full comes first
            self._in.setdefault(key, []).append(_Inbound(
                sock, self._pool, self._cond, f"{self.node_id}-from-{key[1]}",
                lambda why, src=key[1]: self._malformed(src, why)))
            self._cond.notify_all()

    def _prove(self, sock: socket.socket, hello: dict, key: tuple[str, str]) -> None:
        """Server side of the secure hello: prove this node, check the client's proof."""
        assert self.auth is not None
        job, src = key
        if "nonce" not in hello:
            raise AuthError(f"a stream from {src!r} came without authentication; start its "
                            "agent with the lab's [security] certs")
        cn = bytes.fromhex(str(hello["nonce"]))
        if len(cn) != NONCE_BYTES:
            raise AuthError(f"a stream from {src!r} sent a malformed nonce")
        sn = self.auth.nonce()
        sock.sendall(AUTH_REPLY + sn + self.auth.server_proof(src, job, cn, sn))
        self.auth.check_client(src, job, cn, sn, _recv_exact_blocking(sock, MAC_BYTES))

    # ---- sending ----------------------------------------------------------------------
    def send_chunk(self, job: str, dst: str, head: ChunkHead, payload: memoryview,
                   deadline_s: float, cancel: threading.Event | None = None,
                   optical: bool = False) -> None:
        """Send one chunk to `dst` (with emulated optics on the optical network: where the
        light goes); blocks while the receiver is not reading, for at most `deadline_s`
        without progress."""
        to = dst
        if self.phy is not None:
            to, reason, epoch, t0, t1 = self.phy.transmit(self.node_id, dst if not optical
                                                          else None, len(payload), cancel)
            head = ChunkHead(head.seq, head.step, head.offset, head.nbytes, head.dst_tag,
                             epoch, t0, t1)
            if to is None:
                self.phy.lost(self.node_id, reason, len(payload))
                return
        raw = head.pack()
        for attempt in (1, 2):
            sock = self._connect(job, to)
            try:
                _send_all(sock, raw, deadline_s, cancel, self._stop)
                _send_all(sock, payload, deadline_s, cancel, self._stop)
                break
            except OSError as exc:  # reset, broken pipe, closed: reconnect, resend the chunk
                self._drop_out(job, to, sock)
                if attempt == 2:
                    raise CollectiveError(f"{self.node_id}: the data connection to {to} broke "
                                          f"({exc}); is its agent running?") from exc
            except CollectiveError:
                self._drop_out(job, to, sock)  # a partial chunk poisons the stream
                raise
        self.sent_bytes += len(payload)
        self.sent_by_peer[dst] += len(payload)

    # ---- receiving --------------------------------------------------------------------
    def recv_chunk(self, job: str, src: str, seq: int, step: int, deadline: float,
                   cancel: threading.Event | None = None, into: memoryview | None = None
                   ) -> tuple[ChunkHead, memoryview]:
        """The next chunk from `src` for (seq, step), its payload valid until the next call
        for this source; CollectiveError at `deadline` (time.time()) or on cancel, naming
        the last loss on the emulated wire if there was one. (`into` is a hint this link
        does not need: payloads land in recycled buffers.)"""
        del into
        lost = ""
        key = (job, src)
        while True:
            with self._cond:
                conns = self._in.get(key, [])
                if conns:
                    conns[0].recycle()
                while True:
                    conns = self._in.get(key, [])
                    while conns and not conns[0].queue and not conns[0].alive \
                            and len(conns) > 1:
                        conns.pop(0)  # a finished stream; its successor carries on
                    if conns and conns[0].queue:
                        break
                    remaining = deadline - time.time()
                    if remaining <= 0 or (cancel is not None and cancel.is_set()) \
                            or self._stop.is_set():
                        raise CollectiveError(self._missing(job, src, seq, step, lost, cancel))
                    self._cond.wait(min(remaining, POLL_S))
                conn = conns[0]
                head, buf, arrived = conn.queue[0]
                if (head.seq, head.step) > (seq, step):  # from further ahead: keep it
                    raise CollectiveError(self._missing(job, src, seq, step, lost))
                conn.queue.popleft()
                conn.lent = buf
            self.received_bytes += head.nbytes
            if (head.seq, head.step) < (seq, step):
                self.stale += 1
                continue
            if self.phy is not None:
                reason = self.phy.receive(src, head, arrived, cancel)
                if reason:
                    lost = reason
                    continue
            if head.dst_tag != self.tag:
                self.misrouted += 1
                lost = "a chunk for another node arrived here (misrouted light)"
                logger.warning("%s: a chunk from %s meant for another node arrived here "
                               "(misrouted circuit)", self.node_id, src)
                continue
            return head, memoryview(buf)[:head.nbytes]

    def _malformed(self, src: str, why: str) -> None:
        self.malformed += 1
        logger.warning("%s: malformed chunk from %s (%s); dropped the stream", self.node_id,
                       src, why)

    def _missing(self, job: str, src: str, seq: int, step: int, lost: str,
                 cancel: threading.Event | None = None) -> str:
        if cancel is not None and cancel.is_set():
            return f"{self.node_id}: collective {seq} of job {job} was cancelled"
        where = f" for step {step} of collective {seq}" if seq >= 0 else ""
        why = f" (last loss on the wire: {lost})" if lost else ""
        return (f"{self.node_id}: lost data: nothing from {src}{where} (job {job}) in time"
                f"{why}; the light path does not reach this node (check the transmitter "
                "channel and the WSS route, `oddl status`) or the peer failed")

    def forget_job(self, job: str) -> None:
        """Close the streams of a job that ended."""
        with self._cond:
            for key in [k for k in self._in if k[0] == job]:
                for conn in self._in.pop(key):
                    conn.close()
        with self._out_lock:
            for key in [k for k in self._out if k[0] == job]:
                self._out.pop(key).close()

    def close(self) -> None:
        """Stop accepting and close every stream."""
        self._stop.set()
        self._thread.join(timeout=2)
        self._listener.close()
        with self._cond:
            for conns in self._in.values():
                for conn in conns:
                    conn.close()
            self._in.clear()
        with self._out_lock:
            for sock in self._out.values():
                sock.close()
            self._out.clear()


def _drain_and_close(sock: socket.socket, limit: int = 1 << 20, seconds: float = 2.0) -> None:
    """Read what a refused client still sends (up to a limit), then close: closing with
    unread data would reset the connection under the client's feet."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(0.2)
        end = time.monotonic() + seconds
        got = 0
        while got < limit and time.monotonic() < end:
            try:
                part = sock.recv(65536)
            except TimeoutError:
                continue
            if not part:
                break
            got += len(part)
    except OSError:
        pass
    finally:
        sock.close()


def _recv_exact_blocking(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("peer closed the connection")
        data += part
    return bytes(data)


def _recv_all(sock: socket.socket, view: memoryview) -> bool:
    """Fill `view` from a blocking socket; False at a clean end of the stream before the
    first byte, ConnectionError at an end in the middle."""
    pos, n = 0, len(view)
    while pos < n:
        got = sock.recv_into(view[pos:], n - pos)
        if got == 0:
            if pos == 0:
                return False
            raise ConnectionError("the stream ended in the middle of a chunk")
        pos += got
    return True


def _send_all(sock: socket.socket, data: bytes | memoryview, stall_s: float,
              cancel: threading.Event | None, stop: threading.Event) -> None:
    """Send everything; CollectiveError after `stall_s` without progress or on cancel."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    pos, n = 0, len(view)
    last = time.monotonic()
    while pos < n:
        try:
            sent = sock.send(view[pos:])
        except TimeoutError:
            if cancel is not None and cancel.is_set():
                raise CollectiveError("cancelled while sending") from None
            if stop.is_set() or time.monotonic() - last > stall_s:
                raise CollectiveError(f"the receiver took nothing for {stall_s:.1f} s "
                                      "(stalled or failed peer)") from None
            continue
        pos += sent
        last = time.monotonic()
