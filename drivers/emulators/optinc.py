"""The emulated OptINC device: the optics average the quantised gradients of N servers.

An OptINC device (``oddl.offline.optinc.model`` for the optics) is an endpoint of the emulated
fabric (``Fabric(devices=...)``): agents address frames with ``net = "optinc"`` and
``dst = <device id>`` to it. The fabric serialises every frame at the sender's line rate, hands
it to `OptincDevice.offer`, and delivers what the device answers at the time the device says
(the output streams while the input streams: cut-through, so one pass costs S/B plus the device
latency), again at the line rate on each receiver.

One collective invocation (job, seq) is two rounds, each a frame from every node of the job
and an answer from the device to every node (T, the 1×N splitter):

- **step 0, scale**: header ``maxabs`` = max|x| of the node's gradient (no payload), or
  ``bad`` = why the gradient cannot be sent (NaN/Inf). The device answers ``maxabs`` = the
  maximum over the N nodes (the agreed per-tensor scale is ``maxabs / (2**(b−1) − 1)``); a bad
  gradient is refused to every node at once — nothing was averaged, no gradient data was sent.
- **step 1, levels**: header ``bits``, ``elems``, ``scale``, ``dtype``; payload the b-bit
  offset-binary levels (uint8 up to 8 bits, else uint16), node i on input i (its rank). When
  all N have arrived the device runs its optics (`OptincNetwork.forward`: the levels as digits
  on M transceivers, the optical preprocessing P, two layers of U·Σ blocks with thresholders
  between them, PAM receivers — the trained phases with their DAC resolution and one
  phase-noise realisation per pass) on all elements at once and answers the decided levels
  with the same header.

Refusals — a bucket larger than ``max_elements``, levels of another bit width than the phases,
another number of nodes than inputs, mismatched lengths or scales between the nodes, levels out
of range — go to every node of the job as a frame whose header carries ``error``; the agents
raise it as a CollectiveError. Nothing is ever averaged silently wrong.

Counters (`OptincStats`): passes, elements, model time (elements/s of the vectorised MZI
model), elements whose optical output differs from the exact quantised mean (phase noise;
counted off the data path, in a worker thread), refusals by kind. The fabric serves them with
its statistics (`OptincDevice.stats_dict`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oddl.common.config import OptincDeviceConfig
from oddl.offline.optinc import model as om

logger = logging.getLogger(__name__)

SCALE_STEP = 0
"""Round 1: every node announces max|x|; the device answers the maximum."""
LEVELS_STEP = 1
"""Round 2: every node sends its levels; the device answers the quantised mean."""
STARTUP_NOISE_RAD = 0.0005
"""Phase noise that phases made at start-up are trained for (`oddl optinc train`'s default)."""
STARTUP_PHASE_BITS = 16
"""DAC resolution of phases made at start-up: 8-bit levels need ~14 bits (docs/explanation/optinc.md)."""
STALE_S = 120.0
"""A pass that has not completed after this long is forgotten (a node failed)."""


def level_dtype(bits: int) -> np.dtype[Any]:
    """The wire dtype of b-bit levels: uint8 up to 8 bits, else uint16."""
    return np.dtype(np.uint8) if bits <= 8 else np.dtype("<u2")


@dataclass(frozen=True)
class Outgoing:
    """A frame the device sends: to node `dst`, not before `at` (the fabric's clock)."""

    dst: str
    header: dict[str, Any]
    payload: bytes | memoryview
    at: float


@dataclass
class OptincStats:
    """What the device has done (served with the fabric's statistics)."""

    passes: int = 0
    elements: int = 0
    model_s: float = 0.0
    inexact_elements: int = 0
    scale_rounds: int = 0
    refused: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy with the throughput of the MZI model."""
        return {"passes": self.passes, "elements": self.elements,
                "model_s": round(self.model_s, 6),
                "elements_per_s": self.elements / self.model_s if self.model_s > 0 else 0.0,
                "inexact_elements": self.inexact_elements, "scale_rounds": self.scale_rounds,
                "refused": dict(self.refused)}


@dataclass
class _Pass:
    nodes: tuple[str, ...]
    first_s: float
    parts: dict[int, Any] = field(default_factory=dict)
    arrival: float = 0.0
    header: dict[str, Any] = field(default_factory=dict)


class _Refusal(Exception):
    """A pass is refused: `kind` for the counters, the message goes to every node."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class OptincDevice:
    """The device state machine (no I/O, no threads): frames in, frames out with a time."""

    def __init__(self, device_id: str, network: om.OptincNetwork, max_elements: int, *,
                 latency_s: float = 1e-6, check_exact: bool = True,
                 phases_path: str = "") -> None:
        if max_elements < 1:
            raise om.OptincError(f"{device_id}: max_elements must be >= 1, got {max_elements}")
        self.id = device_id
        self.network = network
        self.inputs = network.n_inputs
        self.bits = network.bits
        self.dtype = level_dtype(self.bits)
        self.max_elements = int(max_elements)
        self.latency_s = float(latency_s)
        self.check_exact = check_exact
        self.phases_path = phases_path
        self.stats = OptincStats()
        self._pending: dict[tuple[str, int, int], _Pass] = {}
        self._refused: dict[tuple[str, int, int], float] = {}
        self._checks: list[Future[None]] = []
        self._checker: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def stats_dict(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """The counters, once the exactness checks of finished passes are counted."""
        for fut in list(self._checks):
            fut.result(timeout=timeout_s)
        self._checks = [f for f in self._checks if not f.done()]
        with self._lock:
            return self.stats.as_dict()

    def close(self) -> None:
        """Stop the worker thread of the exactness checks."""
        if self._checker is not None:
            self._checker.shutdown(wait=True)

    @classmethod
    def from_config(cls, dev: OptincDeviceConfig, *, seed: int = 0,
                    phases_dir: str | Path | None = None) -> OptincDevice:
        """Load the device's phase file (refusing another N or bit width), or train phases
        at start-up when the testbed file names none (written to `phases_dir` if given)."""
        overrides: dict[str, Any] = {"seed": seed}
        if dev.noise_rad is not None:
            overrides["noise_rad"] = dev.noise_rad
        path = dev.phases
        if path:
            net = om.load_phases(path, dev.inputs, dev.bits, **overrides)
        else:
            net = startup_phases(dev.inputs, dev.bits, seed)
            if dev.noise_rad is not None:
                net.noise_rad = dev.noise_rad
            if phases_dir is not None:
                path = str(Path(phases_dir) / f"{dev.id}.phases.json")
                om.save_phases(path, net, {"created_by": "oddl emulate testbed (start-up)",
                                           "seed": seed, **net.metadata})
        return cls(dev.id, net, dev.max_elements, latency_s=dev.latency_us * 1e-6,
                   phases_path=path)

    # ---- frames ----------------------------------------------------------------------------
    def offer(self, src: str, header: dict[str, Any], payload: bytes | memoryview,
              arrive_at: float) -> list[Outgoing]:
        """Take one frame that finishes arriving at `arrive_at`; return what to send."""
        self._expire(arrive_at)
        try:
            job, seq, step = str(header["job"]), int(header["seq"]), int(header["step"])
            nodes = tuple(str(n) for n in header["nodes"])
            rank = int(header["rank"])
        except (KeyError, TypeError, ValueError):
            self.stats.refused["malformed"] += 1
            return [self._error_frame(src, {"job": header.get("job", ""),
                                            "seq": header.get("seq", 0),
                                            "step": header.get("step", 0)},
                                      f"{self.id}: malformed OptINC frame from {src} (needs job, "
                                      "seq, step, nodes, rank)", arrive_at)]
        key = (job, seq, step)
        if key in self._refused:
            return []  # every node already has the refusal
        where = f"collective {seq} of job {job}"
        try:
            if step not in (SCALE_STEP, LEVELS_STEP):
                raise _Refusal("malformed", f"{self.id}: {where}: unknown step {step}")
            if not 0 <= rank < len(nodes) or nodes[rank] != src:
                raise _Refusal("malformed", f"{self.id}: {where}: {src} says it is rank {rank} "
                               f"of {list(nodes)}")
            if len(nodes) != self.inputs:
                raise _Refusal("inputs", (
                    f"{self.id}: {where} has {len(nodes)} nodes but the device has "
                    f"{self.inputs} inputs (phases trained for N={self.inputs}); run optinc "
                    f"jobs on exactly {self.inputs} nodes"))
            p = self._pending.get(key)
            if p is None:
                p = self._pending[key] = _Pass(nodes, arrive_at)
            elif p.nodes != nodes:
                raise _Refusal("mismatch", f"{self.id}: {where}: {src} names nodes "
                               f"{list(nodes)}, another node named {list(p.nodes)}")
            if rank in p.parts:
                logger.warning("%s: duplicate frame from %s for %s step %d ignored", self.id,
                               src, where, step)
                return []
            if step == SCALE_STEP:
                p.parts[rank] = self._scale_part(src, header, where)
            else:
                p.parts[rank] = self._levels_part(src, header, payload, p, where)
            p.arrival = max(p.arrival, arrive_at)
            if len(p.parts) < len(nodes):
                return []
            del self._pending[key]
            if step == SCALE_STEP:
                return self._answer_scale(job, seq, p)
            return self._answer_levels(job, seq, p, where)
        except _Refusal as refusal:
            self.stats.refused[refusal.kind] += 1
            self._pending.pop(key, None)
            self._refused[key] = arrive_at
            logger.warning("%s", refusal)
            return [self._error_frame(n, {"job": job, "seq": seq, "step": step}, str(refusal),
                                      arrive_at) for n in nodes]

    def _scale_part(self, src: str, header: dict[str, Any], where: str) -> float:
        bad = header.get("bad")
        if bad:
            raise _Refusal("nan", f"{where} refused: {src}: {bad}; nothing was averaged")
        try:
            maxabs = float(header["maxabs"])
        except (KeyError, TypeError, ValueError):
            raise _Refusal("malformed", f"{self.id}: {where}: {src} sent no maxabs") from None
        if not (math.isfinite(maxabs) and maxabs >= 0):
            raise _Refusal("nan", f"{where} refused: {src}: max|x| = {maxabs}; nothing was "
                           "averaged")
        return maxabs

    def _levels_part(self, src: str, header: dict[str, Any], payload: bytes | memoryview,
                     p: _Pass, where: str) -> np.ndarray:
        try:
            bits, elems = int(header["bits"]), int(header["elems"])
            scale = float(header["scale"])
            dtype = np.dtype(str(header["dtype"]))
        except (KeyError, TypeError, ValueError):
            raise _Refusal("malformed", f"{self.id}: {where}: {src} sent levels without bits, "
                           "elems, scale and dtype") from None
        if bits != self.bits:
            raise _Refusal("bits", (
                f"{self.id}: {where}: {src} sends {bits}-bit levels but the device's phases "
                f"({self.phases_path or 'trained at start-up'}) are for {self.bits}-bit levels; "
                f"set bits = {bits} on the device with phases trained for it (oddl optinc train "
                f"--nodes {self.inputs} --bits {bits})"))
        if elems > self.max_elements:
            raise _Refusal("too large", (
                f"{self.id}: {where}: a bucket of {elems:,} elements is larger than the device "
                f"accepts (max_elements = {self.max_elements:,}); all-reduce buckets of at most "
                f"{self.max_elements:,} elements"))
        if dtype != self.dtype:
            raise _Refusal("malformed", f"{self.id}: {where}: {src} sends levels as {dtype}, "
                           f"the device takes {self.dtype}")
        if not (math.isfinite(scale) and scale > 0):
            raise _Refusal("malformed", f"{self.id}: {where}: {src} sends scale {scale}")
        if len(payload) != elems * self.dtype.itemsize:
            raise _Refusal("length", f"{self.id}: {where}: {src} announces {elems} elements but "
                           f"sends {len(payload)} bytes")
        if p.header:
            if p.header["elems"] != elems:
                raise _Refusal("length", (
                    f"{self.id}: {where}: mismatched lengths: {src} sends {elems:,} elements, "
                    f"{p.header['src']} sent {p.header['elems']:,}; nothing was averaged"))
            if p.header["scale"] != scale:
                raise _Refusal("mismatch", (
                    f"{self.id}: {where}: {src} quantised with scale {scale!r}, "
                    f"{p.header['src']} with {p.header['scale']!r}; nothing was averaged"))
        else:
            p.header = {"elems": elems, "scale": scale, "src": src}
        return np.frombuffer(payload, dtype=self.dtype)

    def _answer_scale(self, job: str, seq: int, p: _Pass) -> list[Outgoing]:
        self.stats.scale_rounds += 1
        agreed = max(p.parts.values())
        at = p.arrival + self.latency_s
        return [Outgoing(n, self._header(job, seq, SCALE_STEP, n, maxabs=agreed), b"", at)
                for n in p.nodes]

    def _answer_levels(self, job: str, seq: int, p: _Pass, where: str) -> list[Outgoing]:
        elems, n = p.header["elems"], len(p.nodes)
        x = np.empty((elems, n), dtype=self.dtype)
        for rank in range(n):
            x[:, rank] = p.parts[rank]
        p.parts.clear()
        t0 = time.perf_counter()
        try:
            y = self.network.forward(x)
        except om.OptincError as exc:
            raise _Refusal("levels", f"{self.id}: {where}: {exc}") from None
        self.stats.model_s += time.perf_counter() - t0
        self.stats.passes += 1
        self.stats.elements += elems
        out = y.astype(self.dtype)
        if self.check_exact and elems:
            if self._checker is None:
                self._checker = ThreadPoolExecutor(1, thread_name_prefix=f"{self.id}-check")
            self._checks = [f for f in self._checks if not f.done()]
            self._checks.append(self._checker.submit(self._count_inexact, x, out))
        payload = out.view(np.uint8).data
        at = p.arrival + self.latency_s
        return [Outgoing(node, self._header(job, seq, LEVELS_STEP, node, bits=self.bits,
                                            elems=elems, scale=p.header["scale"],
                                            dtype=self.dtype.str), payload, at)
                for node in p.nodes]

    def _count_inexact(self, x: np.ndarray, out: np.ndarray) -> None:
        missed = int(np.count_nonzero(out != om.exact_mean(x)))
        with self._lock:
            self.stats.inexact_elements += missed

    # ---- helpers ---------------------------------------------------------------------------
    def _header(self, job: str, seq: int, step: int, dst: str, **extra: Any) -> dict[str, Any]:
        return {"job": job, "seq": seq, "step": step, "src": self.id, "dst": dst,
                "net": "optinc", **extra}

    def _error_frame(self, dst: str, key: dict[str, Any], message: str, at: float) -> Outgoing:
        return Outgoing(dst, {**self._header(str(key["job"]), _int(key["seq"]),
                                             _int(key["step"]), dst), "error": message},
                        b"", at)

    def _expire(self, now: float) -> None:
        for key in [k for k, p in self._pending.items() if now - p.first_s > STALE_S]:
            logger.warning("%s: forgetting incomplete pass %s (a node never sent)", self.id, key)
            del self._pending[key]
        for key in [k for k, t in self._refused.items() if now - t > STALE_S]:
            del self._refused[key]


def startup_phases(inputs: int, bits: int, seed: int) -> om.OptincNetwork:
    """Phases for a device whose testbed entry names no file.

    The phase file shipped for (N, b) if there is one (N = 4, 8 bits); otherwise the designed
    network (`OptincNetwork.designed`) fine-tuned hardware-aware for a few steps (16-bit DAC,
    0.0005 rad phase noise, fixed seed): a second or two for small b.
    """
    net = om.shipped_phases(inputs, bits, seed=seed)
    if net is not None:
        net.metadata = {**net.metadata, "start": "shipped"}
        return net
    net = om.OptincNetwork(inputs, bits, noise_rad=STARTUP_NOISE_RAD,
                           phase_bits=STARTUP_PHASE_BITS, seed=seed)
    result = om.train(net, steps=40, lr=0.0005, seed=seed, start="designed", realisations=2)
    net.metadata = {"training": result.as_dict(), "start": "designed"}
    return net


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


__all__ = ["LEVELS_STEP", "SCALE_STEP", "OptincDevice", "OptincStats", "Outgoing",
           "level_dtype", "startup_phases"]
