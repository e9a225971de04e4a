"""The ZeroMQ data links: frames of collectives between nodes (the TCP stream links are
`oddl.agents.links.streams`).

Two link kinds, one frame format ([b"D", header JSON, payload], never pickle):
- `FabricLink`: through the emulated optical fabric, which decides where the frame goes from
  the emulated light paths (the header's dst is only used to detect misrouting).
- `DirectLink`: straight to the peer's data address over the host network; in a lab the
  optical circuit *is* that link.
A receive thread per link files arriving frames into an `Inbox` keyed by
(job, seq, step, src); the collective executor takes them with a deadline.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

from oddl.agents.clock import wall as wallclock
from oddl.agents.links.stream_wire import ChunkHead, node_tag
from oddl.common.errors import CollectiveError, LostData

logger = logging.getLogger(__name__)

FrameKey = tuple[str, int, int, str]
"""(job id, collective seq, plan step, source node)."""


@dataclass(frozen=True)
class Frame:
    """One received frame: its header and payload bytes."""

    header: dict[str, Any]
    payload: bytes | memoryview


class Inbox:
    """Frames that arrived, waiting for the executor; thread-safe."""

    def __init__(self, node_id: str):
        self.node_id = node_id
        self._frames: dict[FrameKey, deque[Frame]] = {}
        self._cond = threading.Condition()
        self.misrouted = 0
        self.malformed = 0
        self.received_bytes = 0

    def put(self, header_raw: bytes, payload: bytes | memoryview) -> None:
        """File a frame; count and drop frames that are malformed or meant for another node."""
        try:
            header = json.loads(header_raw)
            key = (str(header["job"]), int(header["seq"]), int(header["step"]), str(header["src"]))
            dst = str(header["dst"])
        except (ValueError, KeyError, TypeError):
            self.malformed += 1
            logger.warning("%s: dropped a malformed frame", self.node_id)
            return
        if dst != self.node_id:
            self.misrouted += 1
            logger.warning("%s: frame %s meant for %s arrived here (misrouted circuit)",
                           self.node_id, key, dst)
            return
        with self._cond:
            self._frames.setdefault(key, deque()).append(Frame(header, payload))
            self.received_bytes += len(payload)
            self._cond.notify_all()

    def take(self, key: FrameKey, deadline: float, cancel: Any = None) -> Frame | None:
        """Remove and return the oldest frame for `key` (frames of one key keep their order),
        or None once wallclock.now() passes `deadline` or `cancel` is set."""
        with self._cond:
            while key not in self._frames:
                remaining = deadline - wallclock.now()
                if remaining <= 0 or (cancel is not None and cancel.is_set()):
                    return None
                self._cond.wait(min(remaining, 0.05))
            queue = self._frames[key]
            frame = queue.popleft()
            if not queue:
                del self._frames[key]
            return frame

    def take_chunk(self, job: str, src: str, seq: int, step: int, deadline: float,
                   cancel: Any = None) -> tuple[ChunkHead, memoryview]:
        """The next executor chunk from `src` for (seq, step) (a frame of `chunk_header`), or
        CollectiveError at `deadline` or on `cancel`."""
        frame = self.take((job, seq, step, src), deadline, cancel)
        if frame is None:
            if cancel is not None and cancel.is_set():
                raise CollectiveError(f"{self.node_id}: collective {seq} of job {job} was "
                                      "cancelled")
            raise LostData(
                f"{self.node_id}: lost data: nothing from {src} for step {step} of collective "
                f"{seq} (job {job}) by the end of its slot + the receive timeout; the emulated "
                "light path does not reach this node (check the transmitter channel and the "
                "WSS route, `oddl status`) or the peer failed")
        h = frame.header
        try:
            head = ChunkHead(seq, step, int(h["off"]), int(h["n"]), node_tag(self.node_id))
        except (KeyError, TypeError, ValueError) as exc:
            raise CollectiveError(f"{self.node_id}: a frame from {src} has no chunk offset "
                                  f"and size ({exc})") from exc
        payload = memoryview(frame.payload).cast("B")
        if len(payload) != head.nbytes:
            raise CollectiveError(f"{self.node_id}: a chunk from {src} says {head.nbytes} B "
                                  f"and carries {len(payload)} B")
        return head, payload

    def discard(self, job: str, seq_upto: int) -> None:
        """Forget frames of collectives up to `seq_upto` of `job` (late or duplicate arrivals)."""
        with self._cond:
            for key in [k for k in self._frames if k[0] == job and k[1] <= seq_upto]:
                del self._frames[key]


class Link(Protocol):
    """What the executor needs to move frames."""

    inbox: Inbox

    def send(self, header: dict[str, Any], payload: bytes | memoryview) -> None:
        """Send one frame (the header names job, seq, step, src, dst)."""

    def close(self) -> None:
        """Stop the receive thread and close the sockets."""


def _encode(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":")).encode()


def chunk_header(node_id: str, job: str, dst: str, head: ChunkHead,
                 optical: bool) -> dict[str, Any]:
    """The frame header of one executor chunk sent by `node_id`: each chunk is one frame, its
    header naming the element offset ("off") and byte count ("n")."""
    return {"job": job, "seq": head.seq, "step": head.step, "src": node_id, "dst": dst,
            "net": "optical" if optical else "ideal", "off": head.offset, "n": head.nbytes}


class _Receiver:
    """A thread that owns one receiving socket and files its frames into an inbox."""

    def __init__(self, sock: zmq.Socket, inbox: Inbox, router: bool, name: str,
                 check_sender: bool = False):
        self._sock = sock
        self._inbox = inbox
        self._router = router
        self._check_sender = check_sender
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                break
            if self._router:
                if self._check_sender:
                    from oddl.common.security.curve import sender_matches

                    if not sender_matches(frames[0].bytes, frames[-1]):
                        self._inbox.malformed += 1
                        continue
                frames = frames[1:]
            kind = frames[0].bytes if frames else b""
            if len(frames) == 3 and kind == b"D":
                self._inbox.put(frames[1].bytes, frames[2].buffer)
            elif kind in (b"H", b"S"):
                continue
            else:
                self._inbox.malformed += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(0)


class FabricLink:
    """Frames go through the emulated optical fabric (or its ideal electrical mode)."""

    def __init__(self, node_id: str, fabric_address: str, *, connect_timeout: float = 5.0,
                 curve: tuple[Any, bytes] | None = None):
        """`curve` = (this node's CurveKeys, the fabric's public key) in secure mode."""
        self.node_id = node_id
        self.inbox = Inbox(node_id)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        rx = ctx.socket(zmq.DEALER)
        rx.setsockopt(zmq.IDENTITY, node_id.encode())
        rx.setsockopt(zmq.LINGER, 0)
        rx.setsockopt(zmq.RCVHWM, 100000)
        if curve is not None:
            from oddl.common.security.curve import configure_curve_client

            configure_curve_client(rx, *curve)
        rx.connect(fabric_address)
        try:  # a refused CURVE handshake leaves no pipe: a blocking send would wait for ever
            rx.send_multipart([b"H"], flags=zmq.DONTWAIT)
        except zmq.Again:
            rx.close(0)
            raise ConnectionError(f"the fabric at {fabric_address} refused this node's "
                                  "connection; check its CURVE keys (oddl certs)") from None
        if not rx.poll(int(connect_timeout * 1000)):
            rx.close(0)
            keys = "" if curve is None else " and does it accept this node's CURVE key"
            raise ConnectionError(f"the fabric at {fabric_address} did not answer; is "
                                  f"`oddl emulate testbed` running{keys}?")
        rx.recv_multipart()
        self._tx = ctx.socket(zmq.DEALER)
        self._tx.setsockopt(zmq.IDENTITY, f"{node_id}/tx".encode())
        self._tx.setsockopt(zmq.LINGER, 0)
        self._tx.setsockopt(zmq.SNDHWM, 100000)
        if curve is not None:
            configure_curve_client(self._tx, *curve)
        self._tx.connect(fabric_address)
        self._rx = _Receiver(rx, self.inbox, router=False, name=f"{node_id}-fabric-rx")
        self.sent_bytes = 0
        self.sent_by_peer: Counter[str] = Counter()

    def send(self, header: dict[str, Any], payload: bytes | memoryview) -> None:
        self._tx.send_multipart([b"D", _encode(header), payload], copy=False)
        self.sent_bytes += len(payload)
        self.sent_by_peer[str(header["dst"])] += len(payload)

    def send_chunk(self, job: str, dst: str, head: ChunkHead, payload: memoryview,
                   deadline_s: float, cancel: Any = None, optical: bool = False) -> None:
        """Send one executor chunk as one frame, its payload copied into ZeroMQ's message (the
        bucket changes under a zero-copy send); ZeroMQ queues it, so `deadline_s` and
        `cancel` are not needed."""
        self.send(chunk_header(self.node_id, job, dst, head, optical), bytes(payload))

    def recv_chunk(self, job: str, src: str, seq: int, step: int, deadline: float,
                   cancel: Any = None, into: memoryview | None = None
                   ) -> tuple[ChunkHead, memoryview]:
        """The next chunk from `src` for (seq, step) (`Inbox.take_chunk`; `into` is a hint
        this link does not need)."""
        return self.inbox.take_chunk(job, src, seq, step, deadline, cancel)

    def close(self) -> None:
        self._rx.close()
        self._tx.close(0)


class DirectLink:
    """Frames go straight to each peer's data address over the host network (ZeroMQ with
    CURVE: the secure lab path; `oddl.agents.links.streams.StreamLink` is the fast plain one)."""

    def __init__(self, node_id: str, bind: str, *, security: Any = None):
        """`security` (oddl.common.security.files.SecurityFiles): CURVE on the data links, only the lab's
        node keys admitted, each peer's key checked."""
        self.node_id = node_id
        self.inbox = Inbox(node_id)
        self._security = security
        self._curve = None
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        rx = ctx.socket(zmq.ROUTER)
        rx.setsockopt(zmq.LINGER, 0)
        rx.setsockopt(zmq.RCVHWM, 100000)
        if security is not None:
            from oddl.common.security.curve import CurveServer

            self._curve = CurveServer(security.curve_keys(node_id),
                                      security.curve_clients(operators=False),
                                      name=f"{node_id}-direct")
            self._curve.configure(rx)
        host, _, port = bind.rpartition(":")
        if port == "0":
            self.address = f"tcp://{host}:{rx.bind_to_random_port(f'tcp://{host}')}"
        else:
            rx.bind(f"tcp://{bind}")
            self.address = f"tcp://{bind}"
        self._rx = _Receiver(rx, self.inbox, router=True, name=f"{node_id}-direct-rx",
                             check_sender=security is not None)
        self._peers: dict[str, zmq.Socket] = {}
        self._lock = threading.Lock()
        self.sent_bytes = 0
        self.sent_by_peer: Counter[str] = Counter()

    def set_peers(self, peers: Mapping[str, str]) -> None:
        """Connect to each peer's data address (idempotent)."""
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        with self._lock:
            for node, address in peers.items():
                if node == self.node_id or node in self._peers:
                    continue
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.IDENTITY, self.node_id.encode())
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SNDHWM, 100000)
                if self._security is not None:
                    from oddl.common.security.curve import configure_curve_client

                    configure_curve_client(s, self._security.curve_keys(self.node_id),
                                           self._security.curve_public(node))
                s.connect(address)
                self._peers[node] = s

    def send(self, header: dict[str, Any], payload: bytes | memoryview) -> None:
        dst = str(header["dst"])
        sock = self._peers.get(dst)
        if sock is None:
            raise ConnectionError(f"{self.node_id}: no data address for peer {dst}; it has not "
                                  "registered with the controller")
        sock.send_multipart([b"D", _encode(header), payload], copy=False)
        self.sent_bytes += len(payload)
        self.sent_by_peer[dst] += len(payload)

    def send_chunk(self, job: str, dst: str, head: ChunkHead, payload: memoryview,
                   deadline_s: float, cancel: Any = None, optical: bool = False) -> None:
        """Send one executor chunk as one frame, its payload copied into ZeroMQ's message (the
        bucket changes under a zero-copy send); ZeroMQ queues it, so `deadline_s` and
        `cancel` are not needed."""
        self.send(chunk_header(self.node_id, job, dst, head, optical), bytes(payload))

    def recv_chunk(self, job: str, src: str, seq: int, step: int, deadline: float,
                   cancel: Any = None, into: memoryview | None = None
                   ) -> tuple[ChunkHead, memoryview]:
        """The next chunk from `src` for (seq, step) (`Inbox.take_chunk`; `into` is a hint
        this link does not need)."""
        return self.inbox.take_chunk(job, src, seq, step, deadline, cancel)

    def close(self) -> None:
        self._rx.close()
        with self._lock:
            for s in self._peers.values():
                s.close(0)
            self._peers.clear()
        if self._curve is not None:
            self._curve.close()
