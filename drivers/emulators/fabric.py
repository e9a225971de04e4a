"""The emulated optical fabric: bytes go where the emulated light goes.

Agents hand frames to the fabric over ZeroMQ (a DEALER per node, identity = node id). For a
frame on the optical network the fabric looks at the emulated devices *at that moment*: the
sender's laser (output on, locked, frequency), the WSS its fibre enters (the active
channel → out-port table, not settling), the fibre from that out-port, and the receiver's
channel filter. A host whose ports are on a circuit switch sends a frame on the port whose
light reaches the node named in the header (each port paced on its own, lost when no port
reaches it). The frame is delivered to the node the light reaches, after its serialisation
time at the line rate; it is lost when there is no light path, when the path changes while the
frame is on the wire, or when two transmitters' light overlaps at one receiver. Frames on the
ideal network ("ideal": a non-blocking electrical switch) are delivered to the node named in
the header, with the same per-port line rate. Frames on the "optinc" network go to an in-network
OptINC device (`oddl.drivers.emulators.optinc`) named in the header's dst, serialised at the
sender's line rate (the sender's laser must be lit); the device's answers go to the nodes at the
time it says, at the line rate of each receiver.

Wire format (multipart, never pickle): [b"D", header JSON, payload] from an agent;
[b"D", header JSON, payload] to the receiving agent; [b"S"] asks for statistics, answered by
[b"S", JSON] (with each OptINC device's counters under "optinc"); [b"H"] is a hello,
answered by [b"H"].
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import zmq

from oddl.drivers.emulators.optical_model import (
    INSERTION_LOSS_DB,
    LightPath,
    LightRouter,
    LightSource,
    OpticalModel,
)

logger = logging.getLogger(__name__)

__all__ = ["INSERTION_LOSS_DB", "Fabric", "FabricStats", "LightPath", "LightRouter",
           "LightSource", "OpticalModel"]

@dataclass(order=True)
class _InFlight:
    deliver_at: float
    order: int
    src: str = field(compare=False)
    dst: str = field(compare=False)
    start: float = field(compare=False)
    end: float = field(compare=False)
    frames: list[Any] = field(compare=False)
    optical: bool = field(compare=False)
    lost: str = field(default="", compare=False)
    tx: str = field(default="", compare=False)
    """The transmitter it left on: the node (its laser) or one of its ports (``n0.p2``)."""
    rx: str = field(default="", compare=False)
    """The receiver it reaches: the node, or one of its ports."""


@dataclass
class FabricStats:
    """Counters the fabric keeps; served on request and logged."""

    delivered: int = 0
    delivered_bytes: int = 0
    lost: Counter[str] = field(default_factory=Counter)
    lost_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy."""
        return {"delivered": self.delivered, "delivered_bytes": self.delivered_bytes,
                "lost": dict(self.lost), "lost_bytes": self.lost_bytes}


class Fabric:
    """Serves the emulated data plane on a ZeroMQ ROUTER socket until closed."""

    def __init__(self, model: OpticalModel, line_rate_bps: float, listen: str = "127.0.0.1:0",
                 clock: Callable[[], float] = time.monotonic, curve: Any = None,
                 devices: Mapping[str, Any] | None = None, light: Any = None):
        """`devices`: in-network OptINC devices by id (`OptincDevice`), reached with
        net = "optinc"; `light`: the light table whose counters the agents' streams keep."""
        self.model = model
        self.light = light
        self.devices = dict(devices or {})
        self.rate = line_rate_bps
        self.clock = clock
        self.stats = FabricStats()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.SNDHWM, 100000)
        self._sock.setsockopt(zmq.RCVHWM, 100000)
        self._curve = curve  # oddl.common.security.curve.CurveServer: only listed node keys get in
        if curve is not None:
            curve.configure(self._sock)
        host, _, port = listen.rpartition(":")
        if port == "0":
            bound = self._sock.bind_to_random_port(f"tcp://{host}")
            self.address = f"tcp://{host}:{bound}"
        else:
            self._sock.bind(f"tcp://{listen}")
            self.address = f"tcp://{listen}"
        self._tx_free: dict[str, float] = {}
        self._rx_free: dict[str, float] = {}
        self._on_rx: dict[str, list[_InFlight]] = {}
        self._heap: list[_InFlight] = []
        self._order = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fabric", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the socket."""
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(0)
        for device in self.devices.values():
            device.close()
        if self._curve is not None:
            self._curve.close()

    @property
    def in_flight(self) -> int:
        """Frames accepted and neither delivered nor lost yet."""
        return len(self._heap)

    # ---- the loop (one thread owns the socket) ------------------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            now = self.clock()
            wait_ms = 50.0
            if self._heap:
                wait_ms = max(0.0, min(wait_ms, (self._heap[0].deliver_at - now) * 1000.0))
            if poller.poll(int(wait_ms)):  # whole ms, as pyzmq would round it
                while True:
                    try:
                        frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._handle(frames)
            self._deliver_due(self.clock())

    def _handle(self, frames: list[zmq.Frame]) -> None:
        ident = frames[0].bytes
        kind = frames[1].bytes if len(frames) > 1 else b""
        if kind == b"H":
            self._send([ident, b"H"])
        elif kind == b"S":
            stats = self.stats.as_dict()
            if self.light is not None:
                stats["streams"] = self.stream_stats()
            if self.devices:
                stats["optinc"] = {k: d.stats_dict() for k, d in self.devices.items()}
            self._send([ident, b"S", json.dumps(stats).encode()])
        elif kind == b"D" and len(frames) == 4:
            if self._curve is not None:
                from oddl.common.security.curve import sender_matches

                if not sender_matches(ident, frames[-1]):
                    self._lose(None, "sender identity does not match its CURVE key",
                               len(frames[3]))
                    return
            try:
                header = json.loads(frames[2].bytes)
                src = ident.decode().split("/")[0]
                dst, net = str(header["dst"]), str(header.get("net", "optical"))
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                self._lose(None, "malformed header", len(frames[3]))
                return
            if net == "optinc":
                self._accept_device(src, dst, header, frames[2].bytes, frames[3])
                return
            self._accept(src, dst, net == "optical", frames[2].bytes, frames[3])
        else:
            self._lose(None, "malformed frame", sum(len(f) for f in frames[1:]))

    def _accept(self, src: str, dst_named: str, optical: bool, header: bytes,
                payload: zmq.Frame) -> None:
        now = self.clock()
        nbytes = len(payload) + len(header)
        ser = 8.0 * nbytes / self.rate
        tx, path = self._light_of(src, dst_named, now) if optical else (src, None)
        node = self.model._node_by_id.get(src)
        if not optical and node is not None and not node.on_wss and node.ports > 1:
            ser /= node.ports  # the ideal network: one port as fast as the host's optical ones
        if not tx:  # no port of `src` reaches dst_named: nothing goes on any fibre
            self._lose(src, path.reason if path else "no light", len(payload))
            return
        start = max(now, self._tx_free.get(tx, 0.0))
        end = start + ser
        self._tx_free[tx] = end
        if path is not None:
            if path.dst is None:
                self._lose(src, path.reason, len(payload))
                return
            dst, rx = path.dst, path.dst if not path.port else f"{path.dst}.p{path.port}"
        else:
            if dst_named not in self.model._node_by_id:
                self._lose(src, f"unknown destination {dst_named}", len(payload))
                return
            dst = rx = dst_named
        deliver = max(end, self._rx_free.get(rx, 0.0) + ser)
        self._rx_free[rx] = deliver
        self._order += 1
        item = _InFlight(deliver, self._order, src, dst, start, end, [header, payload], optical,
                         tx=tx, rx=rx)
        if optical:
            for other in self._on_rx.get(rx, []):
                if other.tx != tx and other.start < end and start < other.end:
                    other.lost = item.lost = f"collision at {rx} ({other.tx} and {tx})"
            self._on_rx.setdefault(rx, []).append(item)
        heapq.heappush(self._heap, item)

    def _light_of(self, src: str, dst: str, now: float) -> tuple[str, LightPath]:
        """The transmitter a frame for `dst` leaves on and where its light goes: `src`'s
        laser wherever its light goes, or the port of `src` whose light reaches `dst` (free
        soonest, the first on a tie); ("", why) when no port does."""
        node = self.model._node_by_id.get(src)
        if node is None or node.on_wss or not node.ports:
            return src, self.model.path(src, now)
        best: tuple[str, LightPath] | None = None
        seen = []
        for port in range(1, node.ports + 1):
            label, path = f"{src}.p{port}", self.model.port_path(src, port, now)
            seen.append(f"p{port}→{path.dst}" if path.dst else f"p{port} dark: {path.reason}")
            if path.dst == dst and (best is None or self._tx_free.get(label, 0.0)
                                    < self._tx_free.get(best[0], 0.0)):
                best = (label, path)
        if best is not None:
            return best
        return "", LightPath(None, f"no port's light reaches {dst} ({', '.join(seen)})")

    def _accept_device(self, src: str, dst: str, header: dict[str, Any], header_raw: bytes,
                       payload: zmq.Frame) -> None:
        """A frame to an OptINC device: serialised at the sender's line rate, then offered to
        the device; its answers are queued to the nodes at the time it gives."""
        now = self.clock()
        device = self.devices.get(dst)
        node = self.model._node_by_id.get(src)
        if device is None or node is None or not isinstance(header, dict):
            self._lose(src, f"no OptINC device {dst!r} on this fabric (devices: "
                       f"{', '.join(self.devices) or 'none'})", len(payload))
            return
        if not node.on_wss:
            self._lose(src, f"{src} has no tunable transmitter to reach OptINC device {dst} "
                       "(its ports are on circuit switches)", len(payload))
            return
        if self.model.lasers[node.transmitter].optical_output(now) is None:
            self._lose(src, f"{node.transmitter} dark (off, tuning or reset)", len(payload))
            return
        ser = 8.0 * (len(payload) + len(header_raw)) / self.rate
        start = max(now, self._tx_free.get(src, 0.0))
        end = start + ser
        self._tx_free[src] = end
        self.stats.delivered += 1
        self.stats.delivered_bytes += len(payload)
        try:
            answers = device.offer(src, header, payload.buffer, end)
        except Exception:  # a device bug must not stop the fabric
            logger.exception("OptINC device %s failed on a frame from %s", dst, src)
            self._lose(src, f"OptINC device {dst} failed", len(payload))
            return
        for out in answers:
            raw = json.dumps(out.header, separators=(",", ":")).encode()
            ser_out = 8.0 * (len(out.payload) + len(raw)) / self.rate
            deliver = max(out.at, self.clock(), self._rx_free.get(out.dst, 0.0) + ser_out)
            self._rx_free[out.dst] = deliver
            self._order += 1
            heapq.heappush(self._heap, _InFlight(deliver, self._order, dst, out.dst,
                                                 deliver - ser_out, deliver,
                                                 [raw, out.payload], False))

    def _deliver_due(self, now: float) -> None:
        while self._heap and self._heap[0].deliver_at <= now:
            item = heapq.heappop(self._heap)
            if item.optical:
                on_rx = self._on_rx.get(item.rx, [])
                if item in on_rx:
                    on_rx.remove(item)
                if not item.lost:
                    path = self.model.row_path(item.tx, now)
                    reached = path.dst if not path.port else f"{path.dst}.p{path.port}"
                    if reached != item.rx:
                        item.lost = (f"circuit {item.tx}->{item.rx} changed during the frame "
                                     f"({path.reason})")
            if item.lost:
                self._lose(item.src, item.lost, len(item.frames[1]))
                continue
            if self._send([item.dst.encode(), b"D", *item.frames]):
                self.stats.delivered += 1
                self.stats.delivered_bytes += len(item.frames[1])

    def stream_stats(self) -> dict[str, float]:
        """The agents' stream counters (chunks delivered, lost and late), summed over nodes."""
        from oddl.common.lighttable import COUNTERS

        rows = self.light.counters.copy()
        out = {name: float(rows[:, i].sum()) for i, name in enumerate(COUNTERS)}
        out["worst_late_s"] = float(rows[:, COUNTERS.index("worst_late_s")].max())
        return out

    def _send(self, frames: list[Any]) -> bool:
        try:
            self._sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
            return True
        except (zmq.Again, zmq.ZMQError) as exc:
            self._lose(None, f"receiver {frames[0]!r} not connected ({exc})",
                       len(frames[-1]) if frames else 0)
            return False

    def _lose(self, src: str | None, reason: str, nbytes: int) -> None:
        self.stats.lost[reason] += 1
        self.stats.lost_bytes += nbytes
        logger.warning("fabric lost %d bytes from %s: %s", nbytes, src or "?", reason)
