"""The wire form of the chunk streams and the socket moves they are made of.

Each chunk goes on the wire as a fixed binary header (`ChunkHead`, 56 bytes, magic b"ODC2")
followed by its payload. A stream starts with a hello: b"ODS1", u16 length, JSON {"job", "src"} (never
pickle). `Phy` is what the streams ask of an emulated physical layer (`oddl.agents.links.light_phy`).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Protocol

from oddl.agents.slot_gate import Cancel
from oddl.common.errors import CallsDiffer, CollectiveError

CHUNK_BYTES = 1 << 20
"""Largest payload of one chunk: big enough that Python's per-chunk cost is small against the
copy, small enough that sending, receiving and reducing overlap."""

SOCKET_BUFFER = 4 << 20
POLL_S = 0.05
READY_STEP = 0xFFFFFFF0
"""The step number of a ready message (`oddl.agents.collective.standing`): after every data step, so the
chunks of an older collective still count as older."""
DONE_STEP = 0xFFFFFFF1
"""The step number of a node's outcome message for a collective (`oddl.agents.collective.outcome`): after
its ready message and every data step."""
HELLO = b"ODS1"
MAGIC = b"ODC2"
"""Version 2 of the chunk header: version 1 (b"ODC1", 52 bytes) had no transmitter rows."""
_OLD_MAGICS = {b"ODC1": 1}
_HEAD = struct.Struct("<4sIIQQIIddHH")
NO_ROW = 0xFFFF
"""A row field of a chunk that was not on the emulated light (direct links)."""


def node_tag(node: str) -> int:
    """A 32-bit tag of a node id, carried in each chunk to detect misrouted light."""
    return zlib.crc32(node.encode())


@dataclass(frozen=True)
class ChunkHead:
    """One chunk's header: where its payload goes in the receiver's bucket, and its time on
    the emulated wire (zeros on direct links): the light table's transmitter row it left on
    (`tx`, a host port of its own on a circuit switch), the receiver row its light reached
    (`rx`), and the epoch of the light table entry it was sent on."""

    seq: int
    step: int
    offset: int
    nbytes: int
    dst_tag: int
    epoch: int = 0
    t_start: float = 0.0
    t_end: float = 0.0
    tx: int = NO_ROW
    rx: int = NO_ROW

    def pack(self) -> bytes:
        """The 56-byte wire form."""
        return _HEAD.pack(MAGIC, self.seq, self.step, self.offset, self.nbytes, self.dst_tag,
                          self.epoch, self.t_start, self.t_end, self.tx, self.rx)

    @staticmethod
    def unpack(raw: bytes | bytearray | memoryview) -> ChunkHead:
        """Parse a header; ValueError names what is wrong."""
        if len(raw) != _HEAD.size:
            raise ValueError(f"a chunk header of {len(raw)} B (it has {_HEAD.size})")
        magic, seq, step, offset, nbytes, tag, epoch, t0, t1, tx, rx = _HEAD.unpack(raw)
        if magic != MAGIC:
            old = _OLD_MAGICS.get(bytes(magic))
            if old is not None:
                raise ValueError(f"a chunk header of version {old} ({magic!r}) from an older "
                                 "oddl; run the same oddl version on every host")
            raise ValueError(f"bad chunk magic {magic!r}")
        return ChunkHead(seq, step, offset, nbytes, tag, epoch, t0, t1, tx, rx)


HEAD_BYTES = _HEAD.size


class PeerAhead(CollectiveError):
    """A peer already sent a chunk of a later collective than the one this node waits for:
    this node is behind (it missed collectives its peers counted, e.g. it restarted)."""

    def __init__(self, message: str, peer: str, seq: int, their_step: int = 0):
        super().__init__(message)
        self.peer = peer
        self.seq = seq
        self.their_step = their_step
        """The caller step of the peer's ready that showed it (0: not known)."""


def describe_step(step: int, seq: int) -> str:
    """How an error names a chunk: a data step, or the ready or outcome message of a
    collective."""
    if step == READY_STEP:
        return f"its ready message for collective {seq}"
    if step == DONE_STEP:
        return f"its outcome of collective {seq}"
    return f"step {step} of collective {seq}"


def missing_data(node_id: str, job: str, src: str, seq: int, step: int, lost: str,
                 direct: bool) -> str:
    """Why a chunk from `src` did not come in time, and what to check: on direct links
    (the circuit is the host link) or on emulated optics (`lost`: the last loss there)."""
    where = f" for {describe_step(step, seq)}" if seq >= 0 else ""
    if direct:
        return (f"{node_id}: lost data: nothing from {src}{where} (job {job}) in "
                f"time; host {src} did not send it (its agent or training process "
                "stopped or is behind: `oddl status`) or the link between the two hosts "
                "dropped it (check the link and the address of both nodes in the "
                "testbed file)")
    why = f" (last loss on the emulated wire: {lost})" if lost else ""
    return (f"{node_id}: lost data: nothing from {src}{where} (job {job}) in time"
            f"{why}; the emulated light path does not reach this node (check the "
            "transmitter channel and the WSS route, or the circuit switch's connections, "
            "`oddl status`) or the peer failed")


class PeerGaveUp(CollectiveError):
    """A peer announced that a collective failed at its end (`oddl.agents.collective.outcome`)."""


class PeerCallsDiffer(PeerGaveUp, CallsDiffer):
    """A peer announced that a collective failed at its end because the ranks' calls differ."""


@dataclass(frozen=True)
class Sent:
    """Where a chunk went on the emulated wire (`Phy.transmit`)."""

    to: str | None
    """The node the light reached (on the ideal network: the named one), None when none."""
    reason: str
    """Why the chunk reached no node ("" when it did)."""
    epoch: int
    """The light table entry it left on (`light_phy.IDEAL_EPOCH` on the ideal network)."""
    t_start: float
    t_end: float
    """Its serialisation on the transmitter (time.monotonic)."""
    tx: int = NO_ROW
    """The light table row of the transmitter (a host's port) it left on."""
    rx: int = NO_ROW
    """The light table row of the receiver (a host's port) its light reached."""

    def stamp(self, head: ChunkHead) -> ChunkHead:
        """`head` with this transmission's time, epoch and rows."""
        return ChunkHead(head.seq, head.step, head.offset, head.nbytes, head.dst_tag,
                         self.epoch, self.t_start, self.t_end, self.tx, self.rx)


class Phy(Protocol):
    """The emulated physical layer: where light goes, and when a chunk is on the wire."""

    def transmit(self, src: str, dst: str, nbytes: int, cancel: Cancel | None,
                 on_light: bool = True) -> Sent:
        """Wait until the transmitter is free, then send: `on_light`, where the light goes
        (on a host with ports, through the port whose light reaches `dst`); else on the ideal
        electrical network, which delivers to `dst`."""

    def receive(self, src: str, head: ChunkHead, arrived: float,
                cancel: Cancel | None) -> str:
        """Hold the chunk until its delivery time; return "" or why it is lost. `arrived`:
        when its last byte was read (time.monotonic)."""

    def lost(self, src: str, reason: str, nbytes: int) -> None:
        """Count a chunk whose light reached no receiver."""

    def misdirected(self, dst: str, reached: str, nbytes: int) -> None:
        """Count a chunk meant for `dst` whose light reached `reached` instead."""


MAX_CHUNK = 64 << 20
"""A header announcing a bigger payload is garbage: the stream is dropped."""


DEAD_PEER_S = 15
"""A stream whose peer has not acknowledged data (or keepalive probes) for this long is dead:
a host that vanished (rebooted, its link cut for good) sends no reset, and without a bound
the kernel would keep retransmitting into it for many minutes (tcp(7): TCP_USER_TIMEOUT,
TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT)."""


def tune(sock: socket.socket) -> None:
    """No Nagle delay, big socket buffers (where the system permits), and a dead peer found
    within `DEAD_PEER_S` (Linux)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PEER_S * 1000)
    except (OSError, AttributeError):  # not Linux: the system's defaults
        pass


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of "tcp://HOST:PORT" or "HOST:PORT" (IPv6 in brackets)."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    return host.strip("[]"), int(port)


def drain_and_close(sock: socket.socket, limit: int = 1 << 20, seconds: float = 2.0) -> None:
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


def recv_exact_blocking(sock: socket.socket, n: int) -> bytes:
    """Exactly `n` bytes from a blocking socket; ConnectionError when it closes first."""
    data = bytearray()
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("peer closed the connection")
        data += part
    return bytes(data)


def recv_all(sock: socket.socket, view: memoryview) -> bool:
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


def send_all(sock: socket.socket, data: bytes | memoryview, stall_s: float,
              cancel: Cancel | None, stop: threading.Event) -> None:
    """Send everything; CollectiveError after `stall_s` without progress or on cancel."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    pos, n = 0, len(view)
    last = time.monotonic()
    while pos < n:
        try:
            sent = sock.send(view[pos:])
        except TimeoutError:
            _stalled(last, stall_s, cancel, stop)
            continue
        pos += sent
        last = time.monotonic()


def send_head_and_payload(sock: socket.socket, head: bytes, payload: memoryview,
                          stall_s: float, cancel: Cancel | None, stop: threading.Event) -> None:
    """Send a chunk's header and payload in one system call where the socket takes both (one
    wake-up of the receiver's reader instead of two); what it did not take goes on with
    `send_all`. CollectiveError as `send_all`'s."""
    view = payload.cast("B") if payload.format != "B" or payload.ndim != 1 else payload
    last = time.monotonic()
    while True:
        try:
            sent = sock.sendmsg((head, view))
            break
        except TimeoutError:
            _stalled(last, stall_s, cancel, stop)
    if sent < len(head):
        send_all(sock, head[sent:], stall_s, cancel, stop)
        sent = len(head)
    if sent - len(head) < len(view):
        send_all(sock, view[sent - len(head):], stall_s, cancel, stop)


def _stalled(last: float, stall_s: float, cancel: Cancel | None,
             stop: threading.Event) -> None:
    """Raise if a send that made no progress since `last` should give up (cancelled,
    stopping, or `stall_s` without progress)."""
    if cancel is not None and cancel.is_set():
        raise CollectiveError("cancelled while sending") from None
    if stop.is_set() or time.monotonic() - last > stall_s:
        raise CollectiveError(f"the receiver took nothing for {stall_s:.1f} s "
                              "(stalled or failed peer)") from None
