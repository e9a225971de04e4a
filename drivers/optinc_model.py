"""Numerical model of OptINC: optical in-network averaging of quantised gradients with MZI meshes.

OptINC (Fei, Zhang, Li, Schlichtmann, arXiv 2603.28290) puts an optical neural network of
Mach-Zehnder interferometers (MZIs) into the interconnect: N servers send the same-position
element of their quantised gradients, the optics compute the b-bit quantised mean, and a passive
splitter broadcasts it back. Only the abstract is known (``shared/research/papers.md`` §4);
everything below marked *reconstruction* is a choice made here and kept as a parameter.

Data path of one element (``OptincNetwork``):

1. **Encoding** (reconstruction). Server i sends the integer level ``x_i`` in ``0..L``
   (``L = 2**bits - 1``) as the real, non-negative field amplitude ``a_i = x_i / L`` of a common
   (phase-locked) carrier; level 0 is no light. Signed gradients become levels with a per-tensor
   scale and zero point shared by all servers (``encode_levels``/``decode_levels``); the mean of
   the levels decodes to the mean of the values.
2. **P**, fixed passive preprocessing (reconstruction), untuned and noiseless, not counted
   among the tuneable MZIs:

   - ``"dft-mean"`` (default): an N-point DFT multiport (star coupler) followed by fixed
     10·log10(N) dB attenuators, so port 0 carries exactly the mean amplitude and ports 1…N−1
     the zero-mean spectral components. f_θ then only has to pass port 0 and block the rest: the
     exact solution has every phase that matters at 0 or π (on any DAC grid) and the only
     first-order noise path blocked, so errors are second order in the phase noise.
   - ``"dft"``: the same DFT without the attenuators (f_θ must attenuate by 1/√N itself).
   - ``"identity"``: no preprocessing; f_θ must form the uniform superposition itself, with
     MZIs at intermediate splitting ratios that are first-order sensitive to phase errors.
3. **f_θ**, the tuneable optics: ``mode="unitary+diagonal"`` is ``U·Σ`` (a column of attenuators,
   then one Clements mesh), ``mode="svd"`` is ``U·Σ·V†`` (two meshes). Σ ≤ 1 are attenuators
   (MZIs with one output used) of amplitude transmission ``sin(α/2)``; their common phase is
   taken as absorbed by the mesh (reconstruction).
4. **Readout** (reconstruction): output port 0 is detected. ``detection="intensity"`` is direct
   detection (|E|², phase-insensitive; thresholds are set on the square, so it compares |E|);
   ``detection="coherent"`` is homodyne detection of Re(E) against a local oscillator of phase 0.
   The detected amplitude ``r`` is compared with a fixed b-bit threshold ladder placed midway
   between achievable means (multiples of 1/N level): level ``floor(L·r + 1/2 + δ)`` clipped to
   ``0..L``, with ``δ = 1/(2N)`` for even N (so exact halves round up) and 0 for odd N. The
   target is the round-half-up mean ``floor(Σx/N + 1/2)``; an ideal device has a noise margin of
   1/(2N) level on every element. The receiver's gain (``readout_gain``) is an electronic
   calibration: by default it compensates the nominal splitter loss of T
   (``splitter_loss_db``) and the insertion loss of the straight path along waveguide 0
   (``nominal_gain``), so neither changes the value.
5. **T**, a passive 1×N splitter: every server receives the same value.

Hardware effects (all parameters): phase quantisation to a ``phase_bits`` DAC over [0, 2π)
(``None`` = full precision; also applied to attenuator phases), Gaussian phase noise
``noise_rad`` on every phase (MZI θ and φ, screens, attenuators) drawn once per forward call — a
static error of the device for one pass (thermal drift, fabrication), not per element — and
``loss_db_per_mzi`` insertion loss on both arms of each MZI and attenuator.

MZI convention (``mzi``): two 50:50 couplers ``B = [[1, i], [i, 1]]/√2``, internal phase θ on the
upper arm between them and external phase φ on the upper input::

    T(θ, φ) = B·diag(e^{iθ}, 1)·B·diag(e^{iφ}, 1)
            = i·e^{iθ/2} [[e^{iφ} sin(θ/2),  cos(θ/2)],
                          [e^{iφ} cos(θ/2), -sin(θ/2)]]

θ = 0 is the cross state, θ = π the bar state (θ = π, φ = π is the identity).

Clements layout (``ClementsMesh``): n columns; column c holds MZIs on mode pairs (m, m+1) with
m ≡ c (mod 2); n(n−1)/2 MZIs, optical depth n, then an output phase screen of n phases.
MZIs are indexed column by column, top to bottom.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oddl.errors import OddlError

__all__ = [
    "PHASE_FILE_FORMAT",
    "PHASE_FILE_VERSION",
    "CascadeResult",
    "ClementsMesh",
    "OptincError",
    "OptincNetwork",
    "TrainResult",
    "cascade_forward",
    "cascade_mzi_count",
    "decode_levels",
    "encode_levels",
    "exact_mean",
    "from_unitary",
    "load_phases",
    "mzi",
    "quantise_phase",
    "save_phases",
    "splitter_loss_db",
    "train",
    "validate_levels",
]

PHASE_FILE_FORMAT = "oddl-optinc-phases"
PHASE_FILE_VERSION = 1
TWO_PI = 2.0 * math.pi
MODES = ("unitary+diagonal", "svd")
PREPROCESSING = ("dft-mean", "dft", "identity")
DETECTION = ("intensity", "coherent")
MAX_BITS = 16
MAX_INPUTS = 64
CHUNK = 1 << 16  # elements per vectorised block (cache-sized)

Complex = NDArray[np.complex128]
Float = NDArray[np.float64]


class OptincError(OddlError):
    """An OptINC model, phase file or input is invalid; nothing was computed."""


# ---- single MZI ---------------------------------------------------------------------------


def mzi(theta: ArrayLike, phi: ArrayLike) -> Complex:
    """Return the 2×2 transfer matrix T(θ, φ) (shape ``(..., 2, 2)``); see the module docstring."""
    th = np.asarray(theta, dtype=np.float64)
    ph = np.asarray(phi, dtype=np.float64)
    th, ph = np.broadcast_arrays(th, ph)
    g = 1j * np.exp(0.5j * th)
    s, c, e = np.sin(th / 2), np.cos(th / 2), np.exp(1j * ph)
    out = np.empty(th.shape + (2, 2), dtype=np.complex128)
    out[..., 0, 0] = g * e * s
    out[..., 0, 1] = g * c
    out[..., 1, 0] = g * e * c
    out[..., 1, 1] = -g * s
    return out


def _mzi_derivatives(theta: Float, phi: Float) -> tuple[Complex, Complex, Complex]:
    """Return T, ∂T/∂θ and ∂T/∂φ (each ``(k, 2, 2)``) for k MZIs."""
    t = mzi(theta, phi)
    g = 0.5j * np.exp(0.5j * theta)
    s, c, e = np.sin(theta / 2), np.cos(theta / 2), np.exp(1j * phi)
    d_theta = 0.5j * t
    d_theta[:, 0, 0] += g * e * c
    d_theta[:, 0, 1] -= g * s
    d_theta[:, 1, 0] -= g * e * s
    d_theta[:, 1, 1] -= g * c
    d_phi = np.zeros_like(t)
    d_phi[:, :, 0] = 1j * t[:, :, 0]
    return t, d_theta, d_phi


def quantise_phase(phase: ArrayLike, bits: int | None) -> Float:
    """Return phases wrapped to [0, 2π) and rounded to a ``bits``-bit DAC (``None``: no rounding)."""
    p = np.mod(np.asarray(phase, dtype=np.float64), TWO_PI)
    if bits is None:
        return p
    step = TWO_PI / (1 << bits)
    return np.mod(np.round(p / step) * step, TWO_PI)


# ---- Clements mesh ------------------------------------------------------------------------


@cache
def _layout(n: int) -> tuple[tuple[tuple[NDArray[np.int64], NDArray[np.int64]], ...], int]:
    """Per column: (top modes, MZI indices); and the MZI count, for the rectangular mesh."""
    columns = []
    k = 0
    for c in range(n):
        tops = np.arange(c % 2, n - 1, 2, dtype=np.int64)
        columns.append((tops, np.arange(k, k + len(tops), dtype=np.int64)))
        k += len(tops)
    return tuple(columns), k


class ClementsMesh:
    """An n×n Clements rectangular mesh: n(n−1)/2 MZIs then an output phase screen.

    ``phases`` is one real vector of length n² laid out as ``[θ (n(n−1)/2), φ (n(n−1)/2),
    screen (n)]`` — n² real parameters, as many as an n×n unitary has.
    """

    def __init__(self, n: int, phases: ArrayLike | None = None) -> None:
        if not isinstance(n, int) or n < 1 or n > MAX_INPUTS:
            raise OptincError(f"mesh size must be an integer in 1..{MAX_INPUTS}, got {n!r}")
        self.n = n
        if phases is None:
            # θ = π, φ = π is the identity MZI; zero screen: the identity mesh
            p = np.zeros(n * n)
            p[: 2 * self.mzi_count] = math.pi
        else:
            p = np.array(phases, dtype=np.float64).reshape(-1)
            if p.shape != (n * n,):
                raise OptincError(f"a {n}×{n} mesh needs {n * n} phases, got {p.size}")
            if not np.all(np.isfinite(p)):
                raise OptincError("mesh phases contain NaN or Inf")
        self.phases: Float = p

    @property
    def mzi_count(self) -> int:
        """Number of MZIs, n(n−1)/2."""
        return self.n * (self.n - 1) // 2

    @property
    def depth(self) -> int:
        """Optical depth in MZI columns (n for Clements)."""
        return self.n

    @property
    def theta(self) -> Float:
        """Internal phases θ (view)."""
        return self.phases[: self.mzi_count]

    @property
    def phi(self) -> Float:
        """External phases φ (view)."""
        return self.phases[self.mzi_count : 2 * self.mzi_count]

    @property
    def screen(self) -> Float:
        """Output phase screen (view)."""
        return self.phases[2 * self.mzi_count :]

    def matrix(self, phases: ArrayLike | None = None, loss_db_per_mzi: float = 0.0) -> Complex:
        """Return the n×n transfer matrix (unitary when lossless) for ``phases`` (default own)."""
        p = self.phases if phases is None else np.asarray(phases, dtype=np.float64)
        m = self.mzi_count
        t = mzi(p[:m], p[m : 2 * m]) * _loss_amplitude(loss_db_per_mzi)
        out = np.eye(self.n, dtype=np.complex128)
        columns, _ = _layout(self.n)
        for tops, idx in columns:
            if len(tops) == 0:
                continue
            upper, lower = out[tops], out[tops + 1]
            tt = t[idx]
            out[tops] = tt[:, 0, 0, None] * upper + tt[:, 0, 1, None] * lower
            out[tops + 1] = tt[:, 1, 0, None] * upper + tt[:, 1, 1, None] * lower
        return np.exp(1j * p[2 * m :])[:, None] * out

    @property
    def unitary(self) -> Complex:
        """The lossless transfer matrix of the current phases."""
        return self.matrix()

    def propagate(self, fields: ArrayLike, loss_db_per_mzi: float = 0.0) -> Complex:
        """Propagate input fields ``(batch, n)`` column by column; return the output fields."""
        f = np.array(fields, dtype=np.complex128)
        if f.ndim != 2 or f.shape[1] != self.n:
            raise OptincError(f"fields must have shape (batch, {self.n}), got {f.shape}")
        t = mzi(self.theta, self.phi) * _loss_amplitude(loss_db_per_mzi)
        columns, _ = _layout(self.n)
        for tops, idx in columns:
            if len(tops) == 0:
                continue
            upper, lower = f[:, tops], f[:, tops + 1]
            tt = t[idx]
            f[:, tops] = tt[:, 0, 0] * upper + tt[:, 0, 1] * lower
            f[:, tops + 1] = tt[:, 1, 0] * upper + tt[:, 1, 1] * lower
        return f * np.exp(1j * self.screen)

    @classmethod
    def from_unitary(cls, u: ArrayLike, *, atol: float = 1e-9) -> ClementsMesh:
        """Return the mesh realising the unitary ``u`` exactly (Clements decomposition)."""
        return from_unitary(u, atol=atol)


def _loss_amplitude(loss_db: float) -> float:
    return float(10.0 ** (-loss_db / 20.0))


def from_unitary(u: ArrayLike, *, atol: float = 1e-9) -> ClementsMesh:
    """Decompose the unitary ``u`` into a Clements mesh (Clements et al., Optica 3, 1460, 2016).

    Alternately null the lower-left triangle from the right (``U·T⁻¹``, first columns of the mesh)
    and from the left (``T·U``, last columns), push the left-hand MZIs through the remaining
    diagonal (``T⁻¹·D = D'·T'``), then place the MZIs in light order, each in the first free
    column of matching parity (which yields the rectangular layout).
    """
    w = np.array(u, dtype=np.complex128)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise OptincError(f"from_unitary needs a square matrix, got shape {w.shape}")
    n = w.shape[0]
    if not np.all(np.isfinite(w)):
        raise OptincError("from_unitary: matrix contains NaN or Inf")
    err = float(np.max(np.abs(w.conj().T @ w - np.eye(n))))
    if err > atol:
        raise OptincError(f"from_unitary: matrix is not unitary (max |U†U − I| = {err:.3g})")
    right: list[tuple[int, float, float]] = []  # light order, first first
    left: list[tuple[int, float, float]] = []  # in the order applied from the left
    for i in range(n - 1):
        for j in range(i + 1):
            if i % 2 == 0:
                r, m = n - 1 - j, i - j  # null w[r, m] with columns (m, m+1)
                a, b = w[r, m], w[r, m + 1]
                theta = 2.0 * math.atan2(abs(b), abs(a))
                phi = float(np.angle(-a * np.conj(b)))
                t = mzi(theta, phi)
                w[:, m : m + 2] = w[:, m : m + 2] @ t.conj().T
                right.append((m, theta, phi))
            else:
                m, col = n - 2 - i + j, j  # null w[m+1, col] with rows (m, m+1)
                a, b = w[m, col], w[m + 1, col]
                theta = 2.0 * math.atan2(abs(a), abs(b))
                phi = float(np.angle(b * np.conj(a)))
                t = mzi(theta, phi)
                w[m : m + 2, :] = t @ w[m : m + 2, :]
                left.append((m, theta, phi))
    d = np.diag(w).copy()
    # U = L1⁻¹ … LK⁻¹ · D · R_R … R_1; move each L⁻¹ (innermost first) through D
    moved: list[tuple[int, float, float]] = []
    for m, theta, phi in reversed(left):
        d1, d2 = d[m], d[m + 1]
        phi_new = float(np.angle(d1) - np.angle(d2))
        d2_new = -d2 * np.exp(-1j * theta)
        d1_new = d2_new * np.exp(-1j * phi)
        d[m], d[m + 1] = d1_new, d2_new
        moved.append((m, theta, phi_new))
    # light order: R_1 … R_R, then the moved ones outermost last: T'_K … T'_1
    sequence = right + moved
    mesh = ClementsMesh(n)
    columns, count = _layout(n)
    slot = {(c, int(top)): int(k) for c, (tops, idx) in enumerate(columns)
            for top, k in zip(tops, idx, strict=True)}
    last = [-1] * n
    for m, theta, phi in sequence:
        c = max(last[m], last[m + 1]) + 1
        if c % 2 != m % 2:
            c += 1
        if (c, m) not in slot:  # pragma: no cover - would mean a bug in the ordering
            raise OptincError(f"internal: MZI on modes ({m}, {m + 1}) does not fit column {c}")
        k = slot.pop((c, m))
        mesh.theta[k] = theta % TWO_PI
        mesh.phi[k] = phi % TWO_PI
        last[m] = last[m + 1] = c
    if slot or len(sequence) != count:  # pragma: no cover
        raise OptincError("internal: Clements decomposition did not fill the mesh")
    mesh.screen[:] = np.mod(np.angle(d), TWO_PI)
    return mesh


# ---- levels, encoding, validation ---------------------------------------------------------


def _check_bits(bits: Any) -> int:
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
    bits = _check_bits(bits)
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise OptincError("values contain NaN or Inf; refusing to encode")
    if not (math.isfinite(scale) and scale > 0):
        raise OptincError(f"scale must be a positive finite number, got {scale!r}")
    zero = 1 << (bits - 1)
    return np.clip(np.round(v / scale) + zero, 0, (1 << bits) - 1).astype(np.int64)


def decode_levels(levels: ArrayLike, bits: int, scale: float) -> Float:
    """Return ``(level − 2**(bits−1))·scale``, the inverse of ``encode_levels``."""
    bits = _check_bits(bits)
    return (np.asarray(levels, dtype=np.float64) - (1 << (bits - 1))) * scale


def splitter_loss_db(n: int, excess_db: float = 0.0) -> float:
    """Return the loss of T, a passive 1×n splitter, per output: 10·log10(n) + excess."""
    return 10.0 * math.log10(n) + excess_db


# ---- the network --------------------------------------------------------------------------


def _preprocessing_matrix(kind: str, n: int) -> Complex:
    if kind == "identity":
        return np.eye(n, dtype=np.complex128)
    if kind in ("dft", "dft-mean"):
        k = np.arange(n)
        dft = np.exp(-2j * math.pi * np.outer(k, k) / n) / math.sqrt(n)
        return dft / math.sqrt(n) if kind == "dft-mean" else dft
    raise OptincError(f"unknown preprocessing {kind!r}; choose one of {', '.join(PREPROCESSING)}")


@dataclass
class _Op:
    """One element of f_θ for backprop: MZI (pair m), screen or attenuator column."""

    kind: Literal["mzi", "screen", "atten"]
    index: int  # MZI index within the mesh (mzi) or unused
    mode: int  # top mode (mzi)
    offset: int  # position of the first parameter in the network's parameter vector


class OptincNetwork:
    """P → f_θ (Clements meshes + attenuators) → readout: the b-bit quantised mean of N inputs.

    Parameters live in one vector ``params`` (radians): for each mesh its n² phases (see
    ``ClementsMesh``), then the n attenuator phases α (transmission ``sin(α/2)``). Order of meshes:
    ``unitary+diagonal`` → [U]; ``svd`` → [V†, U] in light order (V† first).
    """

    def __init__(self, n_inputs: int, bits: int, mode: str = "unitary+diagonal", *,
                 preprocessing: str = "dft-mean", detection: str = "intensity",
                 phase_bits: int | None = 8, noise_rad: float = 0.0,
                 loss_db_per_mzi: float = 0.0, readout_gain: float | None = None,
                 seed: int | None = 0, params: ArrayLike | None = None) -> None:
        if isinstance(n_inputs, bool) or not isinstance(n_inputs, (int, np.integer)) \
                or not 2 <= n_inputs <= MAX_INPUTS:
            raise OptincError(f"n_inputs must be an integer in 2..{MAX_INPUTS}, got {n_inputs!r}")
        self.n_inputs = int(n_inputs)
        self.bits = _check_bits(bits)
        if mode not in MODES:
            raise OptincError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if detection not in DETECTION:
            raise OptincError(f"unknown detection {detection!r}; choose one of "
                              f"{', '.join(DETECTION)}")
        self.mode = mode
        self.preprocessing = preprocessing
        self.p_matrix = _preprocessing_matrix(preprocessing, self.n_inputs)
        self.detection = detection
        self.phase_bits = _check_phase_bits(phase_bits)
        self.noise_rad = _check_nonneg("noise_rad", noise_rad)
        self.loss_db_per_mzi = _check_nonneg("loss_db_per_mzi", loss_db_per_mzi)
        self._rng = np.random.default_rng(seed)
        n = self.n_inputs
        self.n_meshes = 2 if mode == "svd" else 1
        self.param_count = self.n_meshes * n * n + n
        self.readout_gain = (self.nominal_gain() if readout_gain is None
                             else _check_nonneg("readout_gain", readout_gain))
        if params is None:
            p = self._rng.uniform(0.0, TWO_PI, self.param_count)
        else:
            p = np.array(params, dtype=np.float64).reshape(-1)
            if p.shape != (self.param_count,):
                raise OptincError(f"{mode} network with {n} inputs needs {self.param_count} "
                                  f"phases, got {p.size}")
            if not np.all(np.isfinite(p)):
                raise OptincError("network phases contain NaN or Inf")
        self.params: Float = p
        self.metadata: dict[str, Any] = {}  # from a phase file: training statistics etc.
        self._ops = self._build_ops()
        m = n * (n - 1) // 2
        mz = [op for op in self._ops if op.kind == "mzi"]
        self._mzi_param_index = (np.array([op.offset + op.index for op in mz], dtype=np.int64),
                                 np.array([op.offset + m + op.index for op in mz], dtype=np.int64))

    @classmethod
    def designed(cls, n_inputs: int, bits: int, mode: str = "unitary+diagonal",
                 **kwargs: Any) -> OptincNetwork:
        """Return a network with the analytic (textbook, untrained) exact phases.

        ``dft-mean``/``dft``: meshes at the identity (θ = φ = π), attenuator 0 at 1 (dft-mean)
        or 1/√N (dft), the others closed. ``identity``: the U mesh realises the DFT matrix
        (uniform first row) via ``from_unitary`` and every attenuator is 1/√N. ``svd``: V† = I.
        """
        net = cls(n_inputs, bits, mode, **kwargs)
        n, n2 = net.n_inputs, net.n_inputs ** 2
        p = np.concatenate([ClementsMesh(n).phases for _ in range(net.n_meshes)] + [np.zeros(n)])
        att = p[net.n_meshes * n2 :]
        half = 2.0 * math.asin(1.0 / math.sqrt(n))  # sin(α/2) = 1/√N
        if net.preprocessing == "identity":
            k = np.arange(n)
            dft = np.exp(-2j * math.pi * np.outer(k, k) / n) / math.sqrt(n)
            p[(net.n_meshes - 1) * n2 : net.n_meshes * n2] = from_unitary(dft).phases
            att[:] = half
        else:
            att[0] = math.pi if net.preprocessing == "dft-mean" else half
        net.params = p
        return net

    # -- structure --------------------------------------------------------------------------

    @property
    def levels(self) -> int:
        """Largest level L = 2**bits − 1."""
        return (1 << self.bits) - 1

    @property
    def mzi_count(self) -> int:
        """Tuneable mesh MZIs: n(n−1)/2 per mesh (unitary+diagonal is half of svd)."""
        return self.n_meshes * self.n_inputs * (self.n_inputs - 1) // 2

    @property
    def attenuator_count(self) -> int:
        """Attenuators of Σ (one MZI each if built as MZIs)."""
        return self.n_inputs

    @property
    def phase_shifter_count(self) -> int:
        """Tuneable phase shifters: 2 per MZI, n per output screen, 1 per attenuator."""
        return 2 * self.mzi_count + self.n_meshes * self.n_inputs + self.attenuator_count

    @property
    def depth(self) -> int:
        """Optical depth in MZI columns (attenuators count as one column)."""
        return self.n_meshes * self.n_inputs + 1

    @property
    def margin_levels(self) -> float:
        """Noise margin of an ideal device in levels: 1/(2N)."""
        return 1.0 / (2 * self.n_inputs)

    def nominal_gain(self) -> float:
        """Receiver gain compensating the insertion loss of the straight path along waveguide 0.

        That path crosses the attenuator and ⌈N/2⌉ MZIs per mesh; 1.0 when lossless.
        """
        stages = 1 + self.n_meshes * ((self.n_inputs + 1) // 2)
        return 1.0 / _loss_amplitude(stages * self.loss_db_per_mzi)

    def meshes(self, params: ArrayLike | None = None) -> list[ClementsMesh]:
        """The meshes in light order (copies of the phases)."""
        p = self.params if params is None else np.asarray(params, dtype=np.float64)
        n2 = self.n_inputs ** 2
        return [ClementsMesh(self.n_inputs, p[i * n2 : (i + 1) * n2]) for i in range(self.n_meshes)]

    def attenuation(self, params: ArrayLike | None = None) -> Float:
        """Σ: attenuator amplitude transmissions sin(α/2) (before loss), in [0, 1]."""
        p = self.params if params is None else np.asarray(params, dtype=np.float64)
        return np.sin(np.mod(p[self.n_meshes * self.n_inputs ** 2 :], TWO_PI) / 2)

    def _build_ops(self) -> list[_Op]:
        n, n2 = self.n_inputs, self.n_inputs ** 2
        ops: list[_Op] = []
        columns, m = _layout(n)

        def add_mesh(i: int) -> None:
            base = i * n2
            for tops, idx in columns:
                for top, k in zip(tops, idx, strict=True):
                    ops.append(_Op("mzi", int(k), int(top), base))
            ops.append(_Op("screen", 0, 0, base + 2 * m))

        atten = _Op("atten", 0, 0, self.n_meshes * n2)
        if self.mode == "svd":
            add_mesh(0)
            ops.append(atten)
            add_mesh(1)
        else:
            ops.append(atten)
            add_mesh(0)
        return ops

    # -- hardware view of the phases ---------------------------------------------------------

    def effective_params(self, *, noise_rad: float | None = None, phase_bits: Any = "network",
                         rng: np.random.Generator | None = None,
                         params: ArrayLike | None = None) -> Float:
        """Return the phases the hardware applies: DAC-quantised, plus one noise realisation."""
        p = self.params if params is None else np.asarray(params, dtype=np.float64)
        bits = self.phase_bits if phase_bits == "network" else _check_phase_bits(phase_bits)
        q = quantise_phase(p, bits)
        sigma = self.noise_rad if noise_rad is None else _check_nonneg("noise_rad", noise_rad)
        if sigma > 0:
            q = q + (rng or self._rng).normal(0.0, sigma, q.shape)
        return q

    def transfer_matrix(self, effective: ArrayLike | None = None) -> Complex:
        """Return the full N×N transfer matrix f_θ·P for the given (effective) phases."""
        p = self.params if effective is None else np.asarray(effective, dtype=np.float64)
        mats = [mesh.matrix(loss_db_per_mzi=self.loss_db_per_mzi) for mesh in self.meshes(p)]
        sig = np.diag(self.attenuation(p) * _loss_amplitude(self.loss_db_per_mzi)).astype(
            np.complex128)
        core = mats[1] @ sig @ mats[0] if self.mode == "svd" else mats[0] @ sig
        return core @ self.p_matrix

    def output_row(self, effective: ArrayLike | None = None) -> Complex:
        """Return w, the complex weights from the N input amplitudes to detected port 0."""
        return self.transfer_matrix(effective)[0]

    # -- forward -----------------------------------------------------------------------------

    def detect(self, x: NDArray[np.integer], row: Complex) -> Float:
        """Return the detected amplitude in levels (L·r) for validated levels ``x``."""
        out = np.empty(len(x), dtype=np.float64)
        for lo in range(0, len(x), CHUNK):
            out[lo : lo + CHUNK] = self._detect_chunk(x[lo : lo + CHUNK], row)
        return out

    def _detect_chunk(self, x: NDArray[np.integer], row: Complex) -> Float:
        # a = x/L and the output is L·r, so the factors cancel
        a = x.astype(np.float64)
        re = a @ (self.readout_gain * row.real)
        if self.detection == "coherent":
            return re
        im = a @ (self.readout_gain * row.imag)
        re *= re
        im *= im
        re += im
        return np.sqrt(re, out=re)

    def quantise_output(self, analog: Float) -> NDArray[np.int64]:
        """Apply the readout threshold ladder to analog levels."""
        delta = self.margin_levels if self.n_inputs % 2 == 0 else 0.0
        out = np.floor(analog + 0.5 + delta)
        return np.clip(out, 0, self.levels).astype(np.int64)

    def analog(self, x: ArrayLike, *, noise_rad: float | None = None, phase_bits: Any = "network",
               rng: np.random.Generator | None = None) -> Float:
        """Return the detected value before thresholds (levels) for one noise realisation."""
        xv = validate_levels(x, self.n_inputs, self.bits)
        return self.detect(xv, self._row(noise_rad, phase_bits, rng))

    def _row(self, noise_rad: float | None, phase_bits: Any,
             rng: np.random.Generator | None) -> Complex:
        return self.output_row(self.effective_params(noise_rad=noise_rad, phase_bits=phase_bits,
                                                     rng=rng))

    def forward(self, x: ArrayLike, *, noise_rad: float | None = None,
                phase_bits: Any = "network",
                rng: np.random.Generator | None = None) -> NDArray[np.int64]:
        """Return the quantised mean level of each element ``(batch,)`` (one noise realisation).

        ``x`` is ``(batch, n_inputs)`` integer levels; raises OptincError on bad input. The
        transfer row is computed once from the MZI model, then applied to all elements in
        cache-sized chunks.
        """
        xv = validate_levels(x, self.n_inputs, self.bits)
        row = self._row(noise_rad, phase_bits, rng)
        delta = 0.5 + (self.margin_levels if self.n_inputs % 2 == 0 else 0.0)
        out = np.empty(len(xv), dtype=np.int64)
        for lo in range(0, len(xv), CHUNK):
            r = self._detect_chunk(xv[lo : lo + CHUNK], row)
            r += delta
            np.floor(r, out=r)
            np.clip(r, 0, self.levels, out=r)
            out[lo : lo + CHUNK] = r
        return out

    def exact_fraction(self, x: ArrayLike, *, realisations: int = 1,
                       noise_rad: float | None = None, phase_bits: Any = "network",
                       rng: np.random.Generator | None = None) -> float:
        """Return the fraction of elements whose output equals the exact quantised mean.

        With noise, the mean over ``realisations`` independent noise draws.
        """
        xv = validate_levels(x, self.n_inputs, self.bits)
        want = exact_mean(xv)
        sigma = self.noise_rad if noise_rad is None else noise_rad
        reps = max(1, int(realisations)) if sigma > 0 else 1
        hits = 0.0
        for _ in range(reps):
            got = self.forward(xv, noise_rad=sigma, phase_bits=phase_bits, rng=rng)
            hits += float(np.mean(got == want)) if len(want) else 1.0
        return hits / reps

    def error_histogram(self, x: ArrayLike, **kwargs: Any) -> dict[int, int]:
        """Return counts of (output − exact) in levels for one forward pass."""
        xv = validate_levels(x, self.n_inputs, self.bits)
        diff = self.forward(xv, **kwargs) - exact_mean(xv)
        values, counts = np.unique(diff, return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts, strict=True)}

    def hardware(self) -> dict[str, Any]:
        """Return the hardware counts and settings as a dict."""
        return {"n_inputs": self.n_inputs, "bits": self.bits, "mode": self.mode,
                "preprocessing": self.preprocessing, "detection": self.detection,
                "phase_bits": self.phase_bits, "noise_rad": self.noise_rad,
                "loss_db_per_mzi": self.loss_db_per_mzi, "readout_gain": self.readout_gain,
                "mzi_count": self.mzi_count,
                "attenuator_count": self.attenuator_count,
                "phase_shifter_count": self.phase_shifter_count, "depth": self.depth,
                "splitter_loss_db": round(splitter_loss_db(self.n_inputs), 3)}

    # -- gradient ----------------------------------------------------------------------------

    def _loss_and_grad(self, eff: Float, a: Float, target: Float, gain: float = 1.0
                       ) -> tuple[float, Float, float]:
        """MSE of detected levels vs the exact mean; gradients wrt the phases and the gain.

        Reverse mode over f_θ: ``u_k`` (row from port 0 back to op k) and ``v_k`` (column
        ``F_k·conj(g)``) give ∂ℓ/∂p = 2·Re(u_k · ∂X_k/∂p · v_{k−1}).
        """
        n = self.n_inputs
        lam = _loss_amplitude(self.loss_db_per_mzi)
        ti, pi = self._mzi_param_index
        all_t, all_dt, all_dp = _mzi_derivatives(eff[ti], eff[pi])
        all_t *= lam
        all_dt *= lam
        all_dp *= lam
        mats: list[tuple[_Op, Any]] = []
        k = 0
        for op in self._ops:
            if op.kind == "mzi":
                mats.append((op, (all_t[k], all_dt[k], all_dp[k])))
                k += 1
            elif op.kind == "screen":
                mats.append((op, np.exp(1j * eff[op.offset : op.offset + n])))
            else:
                al = np.mod(eff[op.offset : op.offset + n], TWO_PI)
                mats.append((op, (lam * np.sin(al / 2), lam * 0.5 * np.cos(al / 2))))
        # backward pass: u_K = e0, u_{k-1} = u_k X_k
        us: list[Complex] = []
        u = np.zeros(n, dtype=np.complex128)
        u[0] = 1.0
        for op, mat in reversed(mats):
            us.append(u)
            u = _row_times(u, op, mat)
        us.reverse()
        w = u @ self.p_matrix
        yr, yi = a @ w.real, a @ w.imag
        if self.detection == "coherent":
            r = yr
            res = gain * r - target
            gy = gain * res.astype(np.complex128)  # (2/S)·res·gain·∂Re(y)/∂conj(y), ×S/2 below
        else:
            r = np.hypot(yr, yi)
            res = gain * r - target
            safe = np.where(r > 0, r, 1.0)
            gy = gain * res * (yr + 1j * yi) / safe  # ∂|y|/∂conj(y) = y/(2|y|)
        s = len(target)
        loss = float(np.mean(res * res))
        grad_gain = float(2.0 * np.mean(res * r))
        g = (gy @ a) / s  # ∂ℓ/∂conj(w) = Σ_s ∂ℓ/∂conj(y_s)·a_s
        v = self.p_matrix @ np.conj(g)
        grad = np.zeros_like(eff)
        mzi_grad = np.zeros((len(ti), 2))
        k = 0
        for (op, mat), u_k in zip(mats, us, strict=True):
            if op.kind == "mzi":
                t, dt, dp = mat
                sl = slice(op.mode, op.mode + 2)
                uu, vv = u_k[sl], v[sl]
                mzi_grad[k, 0] = (uu @ dt @ vv).real
                mzi_grad[k, 1] = (uu @ dp @ vv).real
                k += 1
                v = v.copy()
                v[sl] = t @ vv
            elif op.kind == "screen":
                e = mat
                grad[op.offset : op.offset + n] += 2.0 * np.real(u_k * 1j * e * v)
                v = e * v
            else:
                sig, dsig = mat
                grad[op.offset : op.offset + n] += 2.0 * np.real(u_k * dsig * v)
                v = sig * v
        grad[ti] += 2.0 * mzi_grad[:, 0]
        grad[pi] += 2.0 * mzi_grad[:, 1]
        return loss, grad, grad_gain


def _row_times(u: Complex, op: _Op, mat: Any) -> Complex:
    """Return the row vector u·X for one op."""
    if op.kind == "mzi":
        out = u.copy()
        sl = slice(op.mode, op.mode + 2)
        out[sl] = u[sl] @ mat[0]
        return out
    if op.kind == "screen":
        return u * mat
    return u * mat[0]


def _check_phase_bits(bits: Any) -> int | None:
    if bits is None:
        return None
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 24:
        raise OptincError(f"phase_bits must be None (full precision) or an integer in 1..24, "
                          f"got {bits!r}")
    return int(bits)


def _check_nonneg(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise OptincError(f"{name} must be a number, got {value!r}") from exc
    if not math.isfinite(v) or v < 0:
        raise OptincError(f"{name} must be finite and ≥ 0, got {value!r}")
    return v


# ---- input sets ---------------------------------------------------------------------------


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


# ---- training -----------------------------------------------------------------------------


@dataclass
class TrainResult:
    """Statistics of one training run (also stored in the phase file)."""

    steps: int
    seconds: float
    final_loss: float
    exact_fraction: float  # DAC-quantised phases, no noise
    exact_fraction_noisy: float | None  # with the training noise, mean over realisations
    eval_elements: int
    restarts: int
    history: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON-ready statistics (without the loss history)."""
        return {"steps": self.steps, "seconds": round(self.seconds, 3),
                "final_loss": self.final_loss, "exact_fraction": self.exact_fraction,
                "exact_fraction_noisy": self.exact_fraction_noisy,
                "eval_elements": self.eval_elements, "restarts": self.restarts}


def train(network: OptincNetwork, steps: int = 1500, lr: float = 0.05,
          noise_rad: float | None = None, phase_bits: Any = "network", seed: int = 0, *,
          batch: int = 4096, restarts: int = 3, train_gain: bool = False,
          eval_elements: int = 1 << 16,
          progress: Callable[[int, int, float], None] | None = None) -> TrainResult:
    """Learn the phases (and the receiver gain) of ``network`` in place to output the mean.

    Hardware-aware: every step applies the DAC quantisation of ``phase_bits`` (straight-through
    estimator: the gradient at the quantised phases updates the latent ones) and a fresh
    phase-noise realisation of ``noise_rad`` (default: the network's). Loss: mean squared error,
    in levels, of the detected value against the exact (unrounded) mean on ``batch`` random
    elements; Adam with a cosine-decayed learning rate and analytic gradients. With
    ``restarts`` > 1, that many scouting runs of ``steps // 5`` steps (the first from the current
    phases, the others from random ones) pick the start of the main run. The receiver gain is an
    electronic calibration constant (not quantised, no noise), kept at its value (by default the
    nominal loss compensation) unless ``train_gain``: a free gain lets training settle on
    attenuations below 1, which are first-order sensitive to phase noise.
    ``phase_bits`` also becomes the network's DAC resolution. ``progress(step, total, loss)`` is
    called about 20 times per run.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise OptincError(f"steps must be an integer ≥ 1, got {steps!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise OptincError(f"lr must be a positive number, got {lr!r}")
    if phase_bits != "network":
        network.phase_bits = _check_phase_bits(phase_bits)
    sigma = network.noise_rad if noise_rad is None else _check_nonneg("noise_rad", noise_rad)
    rng = np.random.default_rng(seed)
    n, top = network.n_inputs, network.levels
    trials = max(1, int(restarts))
    scout = steps // 5 if trials > 1 and steps >= 5 else 0
    total = trials * scout + steps if scout else steps
    done = 0
    t0 = time.perf_counter()

    def run(start: Float, n_steps: int) -> tuple[Float, float, list[tuple[int, float]]]:
        nonlocal done
        p = start.copy()  # phases, then the readout gain
        m1, m2 = np.zeros_like(p), np.zeros_like(p)
        b1, b2, eps = 0.9, 0.999, 1e-12
        hist: list[tuple[int, float]] = []
        loss = float("nan")
        every = max(1, n_steps // 20)
        for i in range(n_steps):
            a = rng.integers(0, top + 1, size=(batch, n)).astype(np.float64)
            eff = network.effective_params(noise_rad=sigma, rng=rng, params=p[:-1])
            loss, gp, gg = network._loss_and_grad(eff, a, a.mean(axis=1), float(p[-1]))
            g = np.append(gp, gg if train_gain else 0.0)
            m1 = b1 * m1 + (1 - b1) * g
            m2 = b2 * m2 + (1 - b2) * g * g
            lr_i = lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * i / n_steps)))
            p -= lr_i * (m1 / (1 - b1 ** (i + 1))) / (np.sqrt(m2 / (1 - b2 ** (i + 1))) + eps)
            p[-1] = max(p[-1], 0.0)
            done += 1
            if i % every == 0 or i == n_steps - 1:
                hist.append((done, loss))
                if progress is not None:
                    progress(done, total, loss)
        return p, loss, hist

    best = np.append(network.params, network.readout_gain)
    if scout:
        best_loss = float("inf")
        for k in range(trials):
            start = best if k == 0 else np.append(
                rng.uniform(0.0, TWO_PI, network.param_count), network.readout_gain)
            p, loss, _ = run(start, scout)
            if loss < best_loss:
                cand, best_loss = p, loss
        best = cand
    final, loss, hist = run(best, steps)
    network.params = final[:-1]
    network.readout_gain = float(final[-1])
    evalset = sample_inputs(n, network.bits, eval_elements, np.random.default_rng(seed + 1))
    frac = network.exact_fraction(evalset, noise_rad=0.0)
    noisy = None
    if sigma > 0:
        noisy = network.exact_fraction(evalset, noise_rad=sigma, realisations=8,
                                       rng=np.random.default_rng(seed + 2))
    return TrainResult(steps=total, seconds=time.perf_counter() - t0, final_loss=loss,
                       exact_fraction=frac, exact_fraction_noisy=noisy,
                       eval_elements=len(evalset), restarts=trials, history=hist)


# ---- phase files --------------------------------------------------------------------------


def save_phases(path: str | os.PathLike[str], network: OptincNetwork,
                metadata: dict[str, Any] | None = None) -> None:
    """Write the network's phases and header as JSON (atomically).

    Format (version 1)::

        {"format": "oddl-optinc-phases", "version": 1, "n_inputs": N, "bits": b,
         "mode": ..., "preprocessing": ..., "detection": ..., "phase_bits": 8 | null,
         "noise_rad": trained-for noise, "loss_db_per_mzi": ..., "readout_gain": ...,
         "mzi_count": ..., "attenuator_count": N, "phase_shifter_count": ..., "depth": ...,
         "splitter_loss_db": ..., "param_count": ...,
         "meshes": [{"theta": [...], "phi": [...], "screen": [...]}, ...]  (light order),
         "attenuators": [α...], "metadata": {... e.g. "training": stats}}

    Phases are the trained latent values in radians; the device quantises them to
    ``phase_bits`` at its DAC.
    """
    doc = {"format": PHASE_FILE_FORMAT, "version": PHASE_FILE_VERSION, **network.hardware(),
           "param_count": network.param_count,
           "meshes": [{"theta": m.theta.tolist(), "phi": m.phi.tolist(),
                       "screen": m.screen.tolist()} for m in network.meshes()],
           "attenuators": network.params[network.n_meshes * network.n_inputs ** 2 :].tolist(),
           "metadata": metadata or {}}
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


def load_phases(path: str | os.PathLike[str], n_inputs: int | None = None,
                bits: int | None = None, **overrides: Any) -> OptincNetwork:
    """Load a phase file into a network; refuse a file for another N or bit width.

    ``n_inputs``/``bits`` of None accept what the file says. ``overrides`` (e.g. ``noise_rad``,
    ``phase_bits``, ``seed``) replace the stored hardware settings. The loaded network carries
    the file's ``metadata`` as ``.metadata``.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise OptincError(f"cannot read phase file {os.fspath(path)!r}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise OptincError(f"phase file {os.fspath(path)!r} is not valid JSON: {exc}") from exc
    where = f"phase file {os.fspath(path)!r}"
    if not isinstance(doc, dict) or doc.get("format") != PHASE_FILE_FORMAT:
        raise OptincError(f"{where} is not an OptINC phase file (format != {PHASE_FILE_FORMAT!r})")
    if doc.get("version") != PHASE_FILE_VERSION:
        raise OptincError(f"{where} has version {doc.get('version')!r}; this oddl reads "
                          f"version {PHASE_FILE_VERSION}")
    try:
        f_n, f_bits = int(doc["n_inputs"]), int(doc["bits"])
        mode = str(doc["mode"])
        meshes, att = doc["meshes"], doc["attenuators"]
    except (KeyError, TypeError, ValueError) as exc:
        raise OptincError(f"{where} lacks or has a bad field: {exc}") from exc
    if (n_inputs is not None and f_n != n_inputs) or (bits is not None and f_bits != bits):
        raise OptincError(f"{where} was trained for N={f_n} inputs and {f_bits}-bit levels, but "
                          f"N={n_inputs if n_inputs is not None else f_n} inputs and "
                          f"{bits if bits is not None else f_bits}-bit levels were requested; "
                          "train phases for this configuration (oddl optinc train)")
    try:
        parts = [np.concatenate([np.asarray(m["theta"], dtype=np.float64),
                                 np.asarray(m["phi"], dtype=np.float64),
                                 np.asarray(m["screen"], dtype=np.float64)]) for m in meshes]
        params = np.concatenate(parts + [np.asarray(att, dtype=np.float64)])
    except (KeyError, TypeError, ValueError) as exc:
        raise OptincError(f"{where} has malformed phases: {exc}") from exc
    settings: dict[str, Any] = {
        "preprocessing": doc.get("preprocessing", "dft"),
        "detection": doc.get("detection", "intensity"),
        "phase_bits": doc.get("phase_bits"), "noise_rad": doc.get("noise_rad", 0.0),
        "loss_db_per_mzi": doc.get("loss_db_per_mzi", 0.0),
        "readout_gain": doc.get("readout_gain")}
    settings.update(overrides)
    try:
        net = OptincNetwork(f_n, f_bits, mode, params=params, **settings)
    except OptincError as exc:
        raise OptincError(f"{where}: {exc}") from exc
    if "mzi_count" in doc and doc["mzi_count"] != net.mzi_count:
        raise OptincError(f"{where} says {doc['mzi_count']} MZIs but a {mode} network with "
                          f"N={f_n} has {net.mzi_count}")
    meta = doc.get("metadata", {})
    net.metadata = meta if isinstance(meta, dict) else {}
    return net


# ---- cascade ------------------------------------------------------------------------------


def cascade_mzi_count(n: int, levels: int = 2, mode: str = "unitary+diagonal") -> int:
    """Return the tuneable mesh MZIs of a ``levels``-deep cascade of N-input devices.

    Level l (0 = the servers' side) has N**(levels−1−l) devices; N**levels servers in total.
    Each device has n(n−1)/2 MZIs per mesh (attenuators not included).
    """
    if n < 2 or levels < 1:
        raise OptincError(f"cascade needs n ≥ 2 and levels ≥ 1, got n={n}, levels={levels}")
    if mode not in MODES:
        raise OptincError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    per = (2 if mode == "svd" else 1) * n * (n - 1) // 2
    devices = sum(n ** k for k in range(levels))
    return devices * per


@dataclass
class CascadeResult:
    """Outputs of a two-level cascade and how they compare with the exact mean."""

    levels: NDArray[np.int64]  # what every server receives
    exact: NDArray[np.int64]  # round-half-up mean of all N² inputs
    ideal: NDArray[np.int64]  # what perfect devices give: mean of rounded group means, rounded
    exact_fraction: float
    ideal_fraction: float  # fraction where double rounding alone already equals the exact mean
    device_fraction: float  # fraction where the devices match the ideal cascade


def cascade_forward(x: ArrayLike, level1: OptincNetwork, level2: OptincNetwork, *,
                    noise_rad: float | None = None,
                    rng: np.random.Generator | None = None) -> CascadeResult:
    """Evaluate a two-level cascade for N² inputs: N level-1 devices, then one level-2 device.

    All level-1 devices use the phases of ``level1`` (each with its own noise realisation).

    Each level-1 output is detected and re-sent as a b-bit level (O-E-O), so the result is the
    rounded mean of rounded group means: it can differ from the rounded overall mean by one
    level (``ideal_fraction`` says how often); exact only with log2(N) extra output bits at
    level 1 (not modelled).
    """
    n, bits = level1.n_inputs, level1.bits
    if level2.n_inputs != n or level2.bits != bits:
        raise OptincError(f"cascade levels disagree: level 1 is N={n}, {bits}-bit; level 2 is "
                          f"N={level2.n_inputs}, {level2.bits}-bit")
    xv = validate_levels(x, n * n, bits)
    # group g is inputs g·N … g·N+N−1; each level-1 device draws its own noise realisation
    mid = np.stack([level1.forward(xv[:, g * n : (g + 1) * n], noise_rad=noise_rad, rng=rng)
                    for g in range(n)], axis=1)
    out = level2.forward(mid, noise_rad=noise_rad, rng=rng)
    exact = exact_mean(xv)
    ideal = exact_mean(exact_mean(xv.reshape(-1, n)).reshape(-1, n))
    size = max(1, len(exact))
    return CascadeResult(levels=out, exact=exact, ideal=ideal,
                         exact_fraction=float(np.sum(out == exact)) / size,
                         ideal_fraction=float(np.sum(ideal == exact)) / size,
                         device_fraction=float(np.sum(out == ideal)) / size)
