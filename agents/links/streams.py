"""The fast data plane: one TCP stream per (job, peer), chunks received into reused buffers.

A collective's transfers are cut into chunks (`oddl.agents.links.stream_wire.CHUNK_BYTES`). Each chunk
goes on the wire as a fixed binary header (`ChunkHead`) followed by its payload, on a
persistent TCP connection from the sender to the receiver that belongs to one job. At the
receiver a thread per stream reads every chunk as soon as it arrives into a recycled buffer (no
allocation, no page faults per message), or straight into the bucket where the executor posted
it (`post_landing`, decision record 0039), and queues it; the collective executor takes chunks
in order and reduces each into the bucket. One kernel copy in, one out, per hop. Because every
stream is always drained, a sender never waits for the receiver to turn to it: a node that
hears several senders in one step cannot deadlock them through full socket buffers.

Streams are ordered, so chunks are taken in the order they were sent. Chunks of an older
collective (left behind by a failed one) are skipped; a chunk from further ahead than the
receiver expects stays at the head of its queue until asked for.

Two modes:
- direct (the lab): the optical circuit *is* the host link; chunks go to the named peer.
- emulated optics (`phy` given): an emulated physical layer (`oddl.agents.links.light_phy`) decides
  where the light of this node's transmitter goes when the chunk is sent, paces the
  transmitter at the line rate, and at the receiver holds each chunk until the end of its
  serialisation and checks that the light path held for its whole duration; chunks go where
  the light goes, and are lost when the path changes under them.

The wire form and socket moves are in `oddl.agents.links.stream_wire`, the reading side in
`oddl.agents.links.stream_inbound`.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
from collections import Counter
from collections.abc import Mapping
from functools import partial

from oddl.agents.clock import wall as wallclock
from oddl.agents.collective import outcome
from oddl.agents.links.line_rate import LineRateMeter
from oddl.agents.links.stream_auth import AuthError, PairAuth
from oddl.agents.links.stream_hello import announce, prove_to_client
from oddl.agents.links.stream_inbound import BufferPool, Inbound, Landing, Landings, superseded
from oddl.agents.links.stream_wire import (
    DONE_STEP,
    HELLO,
    POLL_S,
    READY_STEP,
    ChunkHead,
    PeerAhead,
    Phy,
    describe_step,
    drain_and_close,
    missing_data,
    node_tag,
    parse_address,
    recv_exact_blocking,
    send_head_and_payload,
    tune,
)
from oddl.agents.slot_gate import Cancel
from oddl.common.errors import CollectiveError, LostData

logger = logging.getLogger(__name__)

__all__ = ["StreamLink"]


class StreamLink:
    """Chunk streams over TCP between this node and its peers (see the module docstring)."""

    def __init__(self, node_id: str, bind: str, *, phy: Phy | None = None,
                 auth: PairAuth | None = None):
        self.node_id = node_id
        self.auth = auth
        self.tag = node_tag(node_id)
        self.phy = phy
        host, port = parse_address(bind)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(64)
        self._listener.settimeout(POLL_S)
        self.address = f"tcp://{host}:{self._listener.getsockname()[1]}"
        self._peers: dict[str, str] = {}
        self._out: dict[tuple[str, str], socket.socket] = {}
        self._in: dict[tuple[str, str], list[Inbound]] = {}
        self._pool = BufferPool()
        self._landings = Landings()
        self.rate = LineRateMeter()
        """What the received chunks say the links carry (oddl.agents.links.line_rate)."""
        self._cond = threading.Condition()
        self._out_lock = threading.Lock()
        self._stop = threading.Event()
        self.sent_bytes = 0
        self.received_bytes = 0
        self.sent_by_peer: Counter[str] = Counter()
        self.misrouted = self.malformed = self.stale = self.refused_auth = 0
        self.landed_chunks = 0
        """Chunks read straight into their place in the destination (`post_landing`)."""
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

    def connect(self, job: str) -> None:
        """Open `job`'s streams to every known peer now, so that its first chunks pay no
        connection (CollectiveError naming the peer that cannot be reached)."""
        with self._out_lock:
            peers = list(self._peers)
        for dst in peers:
            self._connect(job, dst)

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
            sock = socket.create_connection(parse_address(address), timeout=5.0)
        except OSError as exc:
            raise CollectiveError(f"{self.node_id}: cannot reach {dst} at {address} ({exc}); "
                                  "is its agent running?") from exc
        tune(sock)
        try:
            announce(sock, self.auth, self.node_id, job, dst)
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
            head = recv_exact_blocking(sock, 6)
            if head[:4] != HELLO:
                raise ValueError(f"bad hello {head[:4]!r}")
            (n,) = struct.unpack("<H", head[4:])
            hello = json.loads(recv_exact_blocking(sock, n))
            key = (str(hello["job"]), str(hello["src"]))
            if self.auth is not None:
                prove_to_client(sock, self.auth, hello, key)
        except AuthError as exc:
            self.refused_auth += 1
            logger.warning("%s: refused a data stream: %s", self.node_id, exc)
            sock.close()
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.malformed += 1
            logger.warning("%s: refused a data connection (%s)", self.node_id, exc)
            drain_and_close(sock)
            return
        tune(sock)
        sock.settimeout(None)
        with self._cond:
            if self._stop.is_set():
                sock.close()
                return
            # a sender that reconnects opens a new stream; what the old one delivered in
            # full comes first
            self._in.setdefault(key, []).append(Inbound(
                sock, self._pool, self._cond, f"{self.node_id}-from-{key[1]}",
                partial(self._malformed, key[1]), self.rate.add,
                None if self.phy is not None else partial(self._landings.take, key)))
            self._cond.notify_all()

    # ---- sending ----------------------------------------------------------------------
    def send_chunk(self, job: str, dst: str, head: ChunkHead, payload: memoryview,
                   deadline_s: float, cancel: Cancel | None = None,
                   optical: bool = False) -> None:
        """Send one chunk to `dst` (with emulated optics and `optical`: on the light, where
        it goes; a host with ports on a circuit switch sends on the port whose light reaches
        `dst`); blocks while the receiver is not reading, for at most `deadline_s` without
        progress."""
        to = dst
        if self.phy is not None:
            sent = self.phy.transmit(self.node_id, dst, len(payload), cancel, on_light=optical)
            head = sent.stamp(head)
            if sent.to is None:
                self.phy.lost(self.node_id, sent.reason, len(payload))
                return
            if sent.to != dst:  # the receiver drops it as misrouted; say so where it left too
                self.phy.misdirected(dst, sent.to, len(payload))
            to = sent.to
        raw = head.pack()
        for attempt in (1, 2):
            sock = self._connect(job, to)
            try:
                send_head_and_payload(sock, raw, payload, deadline_s, cancel, self._stop)
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
                   cancel: Cancel | None = None, into: memoryview | None = None
                   ) -> tuple[ChunkHead, memoryview]:
        """The next chunk from `src` for (seq, step), its payload valid until the next call
        for this source; CollectiveError at `deadline` (wallclock.now()) or on cancel, naming
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
                conn = self._await_chunk(job, src, seq, step, deadline, cancel, lost)
                head, buf, arrived = conn.queue[0]
                if head.seq > seq and step == READY_STEP:  # this node is behind; keep it
                    raise PeerAhead(
                        f"{self.node_id}: {src} is already at collective {head.seq} of job "
                        f"{job} while this node waits for {describe_step(step, seq)}; this "
                        "node missed collectives its peers counted", src, head.seq)
                if head.seq == seq and head.step == DONE_STEP != step:
                    # the peer ended this collective without sending what this node waits
                    # for: it failed (its reason), or its chunk was lost on the way
                    said = outcome.decode(src, memoryview(buf)[:head.nbytes])
                    if not said.ok:
                        raise outcome.gave_up(self.node_id, src, job, seq, said)
                if (head.seq, head.step) > (seq, step):  # from further ahead: keep it
                    raise LostData(missing_data(self.node_id, job, src, seq, step, lost, self.phy is None))
                conn.queue.popleft()
                conn.lent = buf if isinstance(buf, bytearray) else None
                self.landed_chunks += conn.lent is None
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

    def _await_chunk(self, job: str, src: str, seq: int, step: int, deadline: float,
                     cancel: Cancel | None, lost: str) -> Inbound:
        """The stream from `src` once a chunk is queued on it (under the lock);
        CollectiveError when another peer failed collective `seq` (`src`'s data may never
        come), at the deadline or on cancel."""
        while True:
            conns = self._in.get((job, src), [])
            while len(conns) > 1 and superseded(conns[0]):
                conns.pop(0).close()  # a finished stream; its successor carries on
            if conns and conns[0].queue:
                return conns[0]
            if failed := outcome.failure_queued(self.node_id, job, seq, (
                    (p, c.queue) for (j, p), cs in self._in.items()
                    if j == job and p != src for c in cs)):
                raise failed
            remaining = deadline - wallclock.now()
            if remaining <= 0 or (cancel is not None and cancel.is_set()) \
                    or self._stop.is_set():
                raise self._missing_error(job, src, seq, step, lost, cancel)
            self._cond.wait(min(remaining, POLL_S))

    def post_landing(self, job: str, src: str, chunk: Landing, into: memoryview) -> bool:
        """Let the chunk (seq, step, sender's offset) from `src` be read straight into
        `into` when it arrives (decision record 0039); False on emulated optics, where a
        chunk is checked against the light only once it is in."""
        if self.phy is not None:
            return False
        with self._cond:
            self._landings.post(job, src, chunk, into)
        return True

    def end_landings(self, job: str, seq: int) -> None:
        """Withdraw what collective `seq` posted. A stream still writing one of its chunks
        into the destination (the run failed before taking it) is closed and its reader
        awaited, so nothing lands after the run has returned; its sender opens a new one."""
        with self._cond:
            self._landings.withdraw(job, seq)
            busy = [conn for key, conns in self._in.items() if key[0] == job
                    for conn in conns if conn.landing_seq == seq]
        for conn in busy:
            conn.close()
            if not conn.join(5.0):
                logger.error("%s: a stream's reader did not stop after its collective %d "
                             "ended", self.node_id, seq)

    def reset_peer(self, dst: str) -> None:
        """Drop every stream to `dst`: it came back after being declared down (restarted,
        rebooted, or its link was cut), and a stream to its old self may be a dead end that
        no reset ever closed. The next chunk to it opens a new stream."""
        with self._out_lock:
            for key in [k for k in self._out if k[1] == dst]:
                self._out.pop(key).close()

    def _malformed(self, src: str, why: str) -> None:
        self.malformed += 1
        logger.warning("%s: malformed chunk from %s (%s); dropped the stream", self.node_id,
                       src, why)

    def _missing_error(self, job: str, src: str, seq: int, step: int, lost: str,
                       cancel: Cancel | None) -> CollectiveError:
        if cancel is not None and cancel.is_set():
            return CollectiveError(f"{self.node_id}: collective {seq} of job {job} was "
                                   "cancelled")
        return LostData(missing_data(self.node_id, job, src, seq, step, lost, self.phy is None))

    def forget_job(self, job: str) -> None:
        """Close the streams of a job that ended (its flows' too, `oddl.agents.point_to_point`)."""
        def of_job(label: str) -> bool:
            return label == job or label.startswith(f"{job}/")
        with self._cond:
            for key in [k for k in self._in if of_job(k[0])]:
                for conn in self._in.pop(key):
                    conn.close()
                self._landings.forget(key[0])
        with self._out_lock:
            for key in [k for k in self._out if of_job(k[0])]:
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
            self._landings.forget()
        with self._out_lock:
            for sock in self._out.values():
                sock.close()
            self._out.clear()

