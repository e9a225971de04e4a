"""The ``optinc`` collective at one node: quantise, send once to the OptINC device, decode.

`run_optinc` has no plan steps: the node agrees a per-tensor scale with its peers through the
OptINC device, quantises its bucket to b-bit levels, sends them to the device in the upload
slot and returns N × the decoded quantised mean the device broadcasts (so ``allreduce``
returns the approximate SUM, like every other collective). The level arithmetic is the
optical model's (`oddl.offline.optinc.levels`); no emulator physics here.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from oddl.agents.clock import wall as wallclock
from oddl.agents.collective.context import CollectiveRun
from oddl.agents.links.zeromq import Frame, Link
from oddl.agents.slot_gate import SlotGate
from oddl.common.config import OPTINC
from oddl.common.errors import CollectiveError, LostData
from oddl.offline.optinc.levels import exact_mean
from oddl.protos.schedule_wire import SlotSpec

OPTINC_SCALE_STEP = 0  # oddl.drivers.emulators.optinc.SCALE_STEP
OPTINC_LEVELS_STEP = 1  # oddl.drivers.emulators.optinc.LEVELS_STEP


def optinc_level_dtype(bits: int) -> np.dtype:
    """Levels on the wire: uint8 up to 8 bits, else uint16."""
    return np.dtype(np.uint8) if bits <= 8 else np.dtype("<u2")


def optinc_scale(maxabs: float, bits: int) -> float:
    """The per-tensor scale every node uses: the agreed max|x| / (2**(bits−1) − 1), so that
    ±max|x| map to the levels 1 and 2**bits − 1 around the zero level 2**(bits−1)."""
    return maxabs / ((1 << (bits - 1)) - 1)


def _work_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype.itemsize > 4 else np.dtype(np.float32)


def optinc_encode(values: np.ndarray, bits: int, scale: float) -> np.ndarray:
    """Offset-binary levels ``clip(round(x/scale) + 2**(bits−1), 0, 2**bits − 1)`` (float32
    arithmetic for float32/float16 inputs, float64 otherwise), as `optinc_level_dtype`."""
    work = _work_dtype(values.dtype)
    q = np.divide(values, work.type(scale), dtype=work)
    np.rint(q, out=q)
    q += 1 << (bits - 1)
    np.clip(q, 0, (1 << bits) - 1, out=q)
    return q.astype(optinc_level_dtype(bits))


def optinc_decode_sum(levels: np.ndarray, bits: int, scale: float, n_nodes: int,
                      dtype: np.dtype) -> np.ndarray:
    """N × the value of mean levels: ``(level − 2**(bits−1)) · scale · N`` in `dtype` (one
    table look-up per element; the table is computed in float32, float64 for float64)."""
    work = _work_dtype(np.dtype(dtype))
    table = np.arange(1 << bits, dtype=work)
    table -= 1 << (bits - 1)
    table *= work.type(scale * n_nodes)
    return table.astype(dtype, copy=False)[levels]


def optinc_expected(arrays: Sequence[np.ndarray], bits: int) -> np.ndarray:
    """What optinc returns at every node when the device's optics are exact: the scale agreed
    from max|x| over all nodes, each node's levels, their round-half-up mean, decoded × N."""
    flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    dtype = flat[0].dtype
    maxabs = max((float(np.max(np.abs(a))) for a in flat if a.size), default=0.0)
    if maxabs == 0.0:
        return np.zeros(np.shape(arrays[0]), dtype=dtype)
    scale = optinc_scale(maxabs, bits)
    levels = np.stack([optinc_encode(a, bits, scale) for a in flat], axis=1)
    mean = exact_mean(levels)
    return optinc_decode_sum(mean, bits, scale, len(flat), dtype).reshape(np.shape(arrays[0]))


def run_optinc(run: CollectiveRun, buffer: np.ndarray, link: Link, gate: SlotGate,
               device: str, bits: int, cancel: threading.Event | None = None) -> np.ndarray:
    """Run one optinc all-reduce at this node; return N × the device's quantised mean.

    1. Scale (in the launch margin, before the upload slot): send max|x| to the device, which
       answers the maximum over the N nodes; a gradient with NaN/Inf is announced as bad
       instead, and the device refuses the collective at every node — no data is sent.
    2. Upload: the b-bit levels (scale in the header) to the device in the data window of
       slot 0; the device broadcasts the Q(mean) levels (slot 1), which are decoded × N.
    """
    x = np.ascontiguousarray(buffer).reshape(-1)
    if x.dtype.kind != "f":
        raise CollectiveError(f"{run.me}: optinc all-reduces floating-point arrays, not "
                              f"{x.dtype}; use ring for integers")
    started = wallclock.now()
    base = {"job": run.job_id, "seq": run.seq, "src": run.me, "dst": device, "net": OPTINC,
            "rank": run.rank, "nodes": list(run.nodes)}
    up = run.slots[0] if run.slots else None
    down = run.slots[1] if len(run.slots) > 1 else up
    agreed = _agree_scale(run, x, link, base, _optinc_deadline(run, up, False), cancel)
    if agreed == 0.0:  # every node holds zeros; all skip the upload alike
        run.stats["duration_s"] = wallclock.now() - started
        return np.zeros_like(buffer)
    scale = optinc_scale(agreed, bits)
    levels = optinc_encode(x, bits, scale)
    worst_gate = 0.0
    if run.gated and up is not None:
        worst_gate = gate.wait_until(run.t0_local + up.data_start_s, cancel)
    upload = {**base, "step": OPTINC_LEVELS_STEP, "bits": bits, "elems": int(x.size),
              "scale": scale, "dtype": levels.dtype.str}
    link.send(upload, levels.view(np.uint8).data)
    reply = _take_optinc(link, run, OPTINC_LEVELS_STEP, device,
                         _optinc_deadline(run, down, True), cancel)
    mean = _check_mean(run, reply, upload)
    out = optinc_decode_sum(mean, bits, scale, len(run.nodes), x.dtype)
    run.stats["duration_s"] = wallclock.now() - started
    run.stats["gate_error_max_s"] = worst_gate
    return out.reshape(buffer.shape)


def _optinc_deadline(run: CollectiveRun, slot: SlotSpec | None, at_end: bool) -> float:
    """When the device's answer for `slot` is due, receive timeout included: the slot's data
    start (the scale) or end (the mean) on the optical network, else from now."""
    if run.gated and slot is not None:
        return run.t0_local + (slot.end_s if at_end else slot.data_start_s) \
            + run.receive_timeout_s
    return wallclock.now() + run.receive_timeout_s


def _agree_scale(run: CollectiveRun, x: np.ndarray, link: Link, base: dict[str, Any],
                 deadline: float, cancel: threading.Event | None) -> float:
    """Send this node's max|x| (or that it has NaN/Inf) and return the agreed maximum."""
    maxabs = max(float(x.max()), -float(x.min())) if x.size else 0.0  # NaN if any is NaN
    head = {**base, "step": OPTINC_SCALE_STEP}
    if math.isfinite(maxabs):
        head["maxabs"] = maxabs
    else:
        at = int(np.flatnonzero(~np.isfinite(x))[0])
        head["bad"] = f"its gradient contains NaN or Inf (first at element {at}: {x[at]})"
    link.send(head, b"")
    device = str(base["dst"])
    reply = _take_optinc(link, run, OPTINC_SCALE_STEP, device, deadline, cancel)
    agreed = float(reply.header.get("maxabs", math.nan))
    if not (math.isfinite(agreed) and agreed >= 0):
        raise CollectiveError(f"{run.me}: {device} agreed no usable scale ({agreed})")
    return agreed


def _check_mean(run: CollectiveRun, reply: Frame, upload: dict[str, Any]) -> np.ndarray:
    """The mean levels of the device's answer, checked against what this node uploaded."""
    h, device = reply.header, upload["dst"]
    keys = ("bits", "elems", "scale", "dtype")
    if tuple(h.get(k) for k in keys) != tuple(upload[k] for k in keys):
        raise CollectiveError(f"{run.me}: {device} answered bits {h.get('bits')}, "
                              f"{h.get('elems')} elements, scale {h.get('scale')}, "
                              f"{h.get('dtype')}; expected {upload['bits']}, {upload['elems']}, "
                              f"{upload['scale']}, {upload['dtype']}")
    mean = np.frombuffer(reply.payload, dtype=np.dtype(upload["dtype"]))
    if mean.size != upload["elems"]:
        raise CollectiveError(f"{run.me}: {device} answered {mean.size} levels, expected "
                              f"{upload['elems']}")
    return mean


def _take_optinc(link: Link, run: CollectiveRun, step: int, device: str, deadline: float,
                 cancel: threading.Event | None) -> Frame:
    """The device's answer to one round, or CollectiveError (its refusal, lost data, cancel)."""
    me = run.me
    frame = link.inbox.take((run.job_id, run.seq, step, device), deadline, cancel)
    if frame is None:
        if cancel is not None and cancel.is_set():
            raise CollectiveError(f"{me}: collective {run.seq} of job {run.job_id} was cancelled")
        what = "scale" if step == OPTINC_SCALE_STEP else "averaged levels"
        raise LostData(
            f"{me}: lost data: no {what} from OptINC device {device} for collective {run.seq} "
            f"(job {run.job_id}) by the end of its slot + {run.receive_timeout_s:.1f} s; a peer "
            "failed or the fabric has no such device (check `oddl status` and the emulator log)")
    if frame.header.get("error"):
        raise CollectiveError(str(frame.header["error"]))
    return frame
