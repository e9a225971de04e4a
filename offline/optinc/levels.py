"""Levels of OptINC: b-bit gradient levels, their digits on M transceivers, the exact mean.

The reference every OptINC optic is measured against is the round-half-up mean
``floor(Σx/N + 1/2)`` of N b-bit levels (`exact_mean`). A level travels on M transceivers per
server as M digits of c = b/M bits (`to_digits`/`from_digits`), the least significant first:
transceiver m sends digit ``(x >> c·m) & (2**c − 1)`` as one PAM-2**c symbol.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oddl.common.config import OPTINC_MAX_INPUTS
from oddl.common.errors import OddlError

MAX_BITS = 16
MAX_INPUTS = OPTINC_MAX_INPUTS
"""Largest OptINC device (inputs); one definition in `oddl.common.config`."""

Float = NDArray[np.float64]


class OptincError(OddlError):
    """An OptINC model, phase file or input is invalid; nothing was computed."""


def check_bits(bits: Any) -> int:
    """Return ``bits`` as an int, or raise OptincError when it is not a whole number in 1..MAX_BITS."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= MAX_BITS:
        raise OptincError(f"bits must be an integer in 1..{MAX_BITS}, got {bits!r}")
    return int(bits)


def validate_levels(x: ArrayLike, n_inputs: int, bits: int) -> NDArray[np.integer]:
    """Return ``x`` as an integer ``(batch, n_inputs)`` array of b-bit levels, or raise OptincError.

    Integer arrays are returned as they are (no copy); floats must hold whole numbers.
    Refuses NaN/Inf, non-integer values, values outside ``0..2**bits − 1`` and a wrong number of
    inputs; never clips.
    """
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise OptincError(f"inputs must have shape (elements, {n_inputs}), got shape {arr.shape}")
    if arr.shape[1] != n_inputs:
        raise OptincError(f"network has {n_inputs} inputs but the data has {arr.shape[1]} "
                          f"per element (shape {arr.shape})")
    top = (1 << bits) - 1
    if arr.dtype.kind in "iu":
        out = arr
    elif arr.dtype.kind == "f":
        finite = np.isfinite(arr)
        if not finite.all():
            bad = np.argwhere(~finite)[0]
            raise OptincError(f"input contains NaN or Inf (first at element {bad[0]}, input "
                              f"{bad[1]}: {arr[tuple(bad)]}); nothing was averaged")
        if not np.all(arr == np.round(arr)):
            raise OptincError("inputs must be integer levels; got fractional values")
        out = arr.astype(np.int64)
    elif arr.dtype.kind == "b":
        out = arr.astype(np.int64)
    else:
        raise OptincError(f"inputs must be numeric levels, got dtype {arr.dtype}")
    if out.size:
        lo, hi = int(out.min()), int(out.max())
        if lo < 0 or hi > top:
            bad_val = lo if lo < 0 else hi
            raise OptincError(f"input level {bad_val} is outside the {bits}-bit range 0..{top}; "
                              "nothing was averaged")
    return out


def exact_mean(x: ArrayLike, n_inputs: int | None = None, bits: int | None = None) -> NDArray[np.int64]:
    """Return the round-half-up mean ``floor(Σx/N + 1/2)`` of each element (row)."""
    arr = np.asarray(x)
    if n_inputs is not None and bits is not None:
        arr = validate_levels(arr, n_inputs, bits)
    n = arr.shape[1]
    return (2 * arr.sum(axis=1, dtype=np.int64) + n) // (2 * n)


def encode_levels(values: ArrayLike, bits: int, scale: float) -> NDArray[np.int64]:
    """Return b-bit levels ``clip(round(v/scale) + 2**(bits−1), 0, 2**bits − 1)`` (offset binary).

    All servers of one all-reduce must use the same ``scale`` (e.g. agreed max|g| / 2**(bits−1));
    then ``decode_levels(mean of levels)`` is the mean of the values up to quantisation.
    Raises OptincError on NaN/Inf or a non-positive scale.
    """
    bits = check_bits(bits)
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise OptincError("values contain NaN or Inf; refusing to encode")
    if not (math.isfinite(scale) and scale > 0):
        raise OptincError(f"scale must be a positive finite number, got {scale!r}")
    zero = 1 << (bits - 1)
    return np.clip(np.round(v / scale) + zero, 0, (1 << bits) - 1).astype(np.int64)


def decode_levels(levels: ArrayLike, bits: int, scale: float) -> Float:
    """Return ``(level − 2**(bits−1))·scale``, the inverse of ``encode_levels``."""
    bits = check_bits(bits)
    return (np.asarray(levels, dtype=np.float64) - (1 << (bits - 1))) * scale


def splitter_loss_db(n: int, excess_db: float = 0.0) -> float:
    """Return the loss of T, a passive 1×n splitter, per output: 10·log10(n) + excess."""
    return 10.0 * math.log10(n) + excess_db






def all_inputs(n_inputs: int, bits: int) -> NDArray[np.int64]:
    """Return every possible element ``((2**bits)**n, n)``; refuse more than 2**24 rows."""
    count = (1 << bits) ** n_inputs
    if count > 1 << 24:
        raise OptincError(f"{count} possible elements for N={n_inputs}, b={bits}: too many to "
                          "enumerate; sample instead")
    grids = np.indices((1 << bits,) * n_inputs).reshape(n_inputs, -1).T
    return np.ascontiguousarray(grids, dtype=np.int64)


def sample_inputs(n_inputs: int, bits: int, count: int,
                  rng: np.random.Generator | None = None) -> NDArray[np.int64]:
    """Return the whole input space if it has ≤ ``count`` elements, else ``count`` uniform draws."""
    if (1 << bits) ** n_inputs <= count:
        return all_inputs(n_inputs, bits)
    gen = rng or np.random.default_rng(0)
    return gen.integers(0, 1 << bits, size=(count, n_inputs), dtype=np.int64)


def check_transceivers(bits: int, transceivers: Any) -> int:
    """Return M if it divides the bit width b (every transceiver carries c = b/M bits)."""
    if isinstance(transceivers, bool) or not isinstance(transceivers, (int, np.integer)) \
            or not 1 <= transceivers <= bits or bits % int(transceivers):
        raise OptincError(f"transceivers per server must divide the level bits ({bits}): "
                          f"choose M in {[m for m in range(1, bits + 1) if bits % m == 0]}, "
                          f"got {transceivers!r}")
    return int(transceivers)


def to_digits(x: ArrayLike, bits: int, transceivers: int) -> NDArray[np.int64]:
    """Split levels ``(...,)`` into M digits ``(..., M)`` of c = b/M bits, least significant first."""
    m = check_transceivers(bits, transceivers)
    c = bits // m
    shifts = c * np.arange(m, dtype=np.int64)
    return (np.asarray(x, dtype=np.int64)[..., None] >> shifts) & ((1 << c) - 1)


def from_digits(d: ArrayLike, bits: int) -> NDArray[np.int64]:
    """Join M digits ``(..., M)`` (least significant first) back into b-bit levels."""
    arr = np.asarray(d, dtype=np.int64)
    c = bits // arr.shape[-1]
    return np.sum(arr << (c * np.arange(arr.shape[-1], dtype=np.int64)), axis=-1)
