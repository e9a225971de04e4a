"""MZI meshes of OptINC: the MZI, the Clements mesh, and batches of unitary × diagonal blocks.

MZI convention (``mzi``): two 50:50 couplers ``B = [[1, i], [i, 1]]/√2``, internal phase θ on the
upper arm between them and external phase φ on the upper input::

    T(θ, φ) = B·diag(e^{iθ}, 1)·B·diag(e^{iφ}, 1)
            = i·e^{iθ/2} [[e^{iφ} sin(θ/2),  cos(θ/2)],
                          [e^{iφ} cos(θ/2), -sin(θ/2)]]

θ = 0 is the cross state, θ = π the bar state (θ = π, φ = π is the identity).

Clements layout (``ClementsMesh``): n columns; column c holds MZIs on mode pairs (m, m+1) with
m ≡ c (mod 2); n(n−1)/2 MZIs, optical depth n, then an output phase screen of n phases
(Clements et al., Optica 3, 1460, 2016). MZIs are indexed column by column, top to bottom.

``BlockLayer``: a weight matrix partitioned into k×k blocks, each realised as ``U·Σ`` — a
column of k attenuators (Σ, amplitude ``sin(α/2)`` each, light passes them first) followed by
one k×k Clements mesh (U). That is the unitary × diagonal approximation of a block's
``U·Σ·V†`` with the V† mesh left out (half the MZIs). ``block_matrices`` builds all blocks at
once; ``block_gradients`` takes ∂L/∂W of every block back to its phases (reverse mode).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oddl.offline.optinc.levels import MAX_INPUTS, OptincError

TWO_PI = 2.0 * math.pi

Complex = NDArray[np.complex128]
Float = NDArray[np.float64]


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
    w = _checked_unitary(u, atol)
    n = w.shape[0]
    right, left = _null_triangle(w)
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
    mesh = _place(n, right + moved)
    mesh.screen[:] = np.mod(np.angle(d), TWO_PI)
    return mesh


def _checked_unitary(u: ArrayLike, atol: float) -> Complex:
    w = np.array(u, dtype=np.complex128)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise OptincError(f"from_unitary needs a square matrix, got shape {w.shape}")
    n = w.shape[0]
    if not np.all(np.isfinite(w)):
        raise OptincError("from_unitary: matrix contains NaN or Inf")
    err = float(np.max(np.abs(w.conj().T @ w - np.eye(n))))
    if err > atol:
        raise OptincError(f"from_unitary: matrix is not unitary (max |U†U − I| = {err:.3g})")
    return w


def _null_triangle(w: Complex) -> tuple[list[tuple[int, float, float]],
                                         list[tuple[int, float, float]]]:
    """Null `w`'s lower-left triangle in place: (MZIs from the right in light order, MZIs
    from the left in the order applied), each (top mode, θ, φ); `w` is left diagonal."""
    n = w.shape[0]
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
    return right, left


def _place(n: int, sequence: list[tuple[int, float, float]]) -> ClementsMesh:
    """A mesh with the MZIs of `sequence` (light order), each in the first free column of
    matching parity."""
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
    return mesh


# ---- batches of U·Σ blocks ----------------------------------------------------------------


def block_param_count(k: int) -> int:
    """Phases of one k×k U·Σ block: k² for the mesh (θ, φ, screen), k attenuators."""
    return k * k + k


def _mzi_ops(k: int) -> list[tuple[int, int]]:
    """(MZI index, top mode) in light order for the k×k rectangular mesh."""
    columns, _ = _layout(k)
    return [(int(j), int(m)) for tops, idx in columns for m, j in zip(tops, idx, strict=True)]


def block_matrices(params: Float, k: int) -> tuple[Complex, Complex, Float, list[Complex]]:
    """Build B blocks ``W = U·Σ`` from phases ``(B, k² + k)``.

    Returns W ``(B, k, k)``, U, the attenuations σ ``(B, k)`` and the prefix products
    (mesh before each MZI) that `block_gradients` needs.
    """
    b = params.shape[0]
    n_mzi = k * (k - 1) // 2
    theta, phi = params[:, :n_mzi], params[:, n_mzi : 2 * n_mzi]
    screen, alpha = params[:, 2 * n_mzi : k * k], params[:, k * k :]
    t = mzi(theta, phi)  # (B, n_mzi, 2, 2)
    v = np.broadcast_to(np.eye(k, dtype=np.complex128), (b, k, k)).copy()
    prefixes: list[Complex] = []
    for j, m in _mzi_ops(k):
        prefixes.append(v.copy())
        rows = v[:, m : m + 2, :]
        v[:, m : m + 2, :] = t[:, j] @ rows
    u = np.exp(1j * screen)[:, :, None] * v
    sigma = np.sin(np.mod(alpha, TWO_PI) / 2)
    return u * sigma[:, None, :], u, sigma, prefixes


def block_gradients(params: Float, k: int, grad_w: Complex,
                    built: tuple[Complex, Complex, Float, list[Complex]] | None = None) -> Float:
    """Return ∂L/∂params ``(B, k² + k)`` given ``grad_w = ∂L/∂Re W + i·∂L/∂Im W`` per block.

    With ``dL = Re Σ conj(G)∘dW``: Σ from the columns of U, the screen from the rows of U, and
    each MZI from ``Y = (D·O_K…O_{j+1})^H · G_U · (O_{j−1}…O_1)^H`` restricted to its 2×2.
    """
    w, u, sigma, prefixes = built if built is not None else block_matrices(params, k)
    n_mzi = k * (k - 1) // 2
    theta, phi = params[:, :n_mzi], params[:, n_mzi : 2 * n_mzi]
    screen, alpha = params[:, 2 * n_mzi : k * k], params[:, k * k :]
    out = np.zeros_like(params)
    out[:, k * k :] = np.real(np.sum(np.conj(grad_w) * u, axis=1)) * 0.5 * np.cos(
        np.mod(alpha, TWO_PI) / 2)
    g_u = grad_w * sigma[:, None, :]
    out[:, 2 * n_mzi : k * k] = np.real(np.sum(np.conj(g_u) * 1j * u, axis=2))
    if n_mzi:
        t, d_theta, d_phi = _mzi_derivatives(theta.reshape(-1), phi.reshape(-1))
        shape = (params.shape[0], n_mzi, 2, 2)
        t, d_theta, d_phi = t.reshape(shape), d_theta.reshape(shape), d_phi.reshape(shape)
        z = np.conj(np.exp(1j * screen))[:, :, None] * g_u  # (D·…)^H G, walking backwards
        for (j, m), before in zip(reversed(_mzi_ops(k)), reversed(prefixes), strict=True):
            y = z[:, m : m + 2, :] @ np.conj(np.swapaxes(before[:, m : m + 2, :], 1, 2))
            # y is (B, 2, 2): rows m, m+1 of Z times columns m, m+1 of B^H
            out[:, j] = np.real(np.sum(np.conj(y) * d_theta[:, j], axis=(1, 2)))
            out[:, n_mzi + j] = np.real(np.sum(np.conj(y) * d_phi[:, j], axis=(1, 2)))
            z[:, m : m + 2, :] = np.conj(np.swapaxes(t[:, j], 1, 2)) @ z[:, m : m + 2, :]
    return out


def designed_block(row: ArrayLike, k: int) -> Float:
    """Phases of a k×k U·Σ block whose output row 0 is ``row`` (|row| ≤ 1); rows 1… are free.

    Σ = |row|·I and U has first row ``row/|row|`` (a Householder-completed unitary, decomposed
    by `from_unitary`): the textbook starting point before hardware-aware training.
    """
    r = np.zeros(k, dtype=np.complex128)
    vals = np.asarray(row, dtype=np.complex128).reshape(-1)
    r[: len(vals)] = vals
    norm = float(np.linalg.norm(r))
    if norm > 1 + 1e-12:
        raise OptincError(f"a U·Σ block row needs |row| ≤ 1, got {norm:.4g}")
    m = np.eye(k, dtype=np.complex128)
    if norm > 0:
        lead = int(np.argmax(np.abs(r)))
        m[:, [0, lead]] = m[:, [lead, 0]]
        m[:, 0] = np.conj(r / norm)
    q, _ = np.linalg.qr(m)  # q[:, 0] = conj(r/|r|) up to a phase
    u = np.conj(q).T
    if norm > 0:
        u[0] *= (r[lead] / norm) / u[0, lead]  # a phase on row 0 keeps U unitary
    mesh = from_unitary(u, atol=1e-8)
    alpha = np.full(k, 2.0 * math.asin(min(1.0, norm)))
    return np.concatenate([mesh.phases, alpha])
