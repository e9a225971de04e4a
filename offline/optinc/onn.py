"""The OptINC optical network: the optics average N servers' b-bit levels and quantise the mean.

OptINC (Fei, Zhang, Li, Schlichtmann, arXiv 2603.28290) turns the interconnect into an optical
neural network (ONN) of MZIs that averages and quantises gradients; an optical preprocessing step
simplifies its training data; its weight matrices are approximated by unitary × diagonal
matrices and trained hardware-aware. Beyond that (the abstract), the structure here is a
reconstruction; ``docs/explanation/optinc.md`` lists each choice and its source. Data path of one element:

1. **Transceivers.** Server i sends its level ``x_i`` (0…2**b − 1) on M transceivers, one
   digit of c = b/M bits each (least significant first), as the PAM-2**c field amplitude
   ``d/(2**c − 1)`` of a common phase-locked carrier.
2. **P, optical preprocessing (fixed, passive).** Transceiver m of every server enters an N×N
   DFT coupler (star coupler); its port 0 carries ``s_m = Σ_i d_{i,m} / ((2**c − 1)·√N)``, the
   in-phase sum of the servers' digits at position m; the other ports are dumped. P removes what
   the answer does not depend on (which server sent which digit: the training set shrinks from
   ``2**(b·N)`` elements to ``(N·(2**c − 1) + 1)**M`` digit sums) but computes no part of the
   answer: it neither weights the positions (2**(c·m)), nor divides by N, nor rounds, nor
   carries.
3. **Layer 1** (trained): the M digit sums and a bias laser (amplitude 1, same carrier) fan out
   through fixed 1×R splitters to R k×k blocks (k = M + 1); block r realises ``W1_r = U_r·Σ_r``
   (k attenuators, then a k×k Clements mesh; `oddl.offline.optinc.mesh`). The H = R·k outputs
   are the hidden fields z.
4. **Optical thresholders** (fixed): each hidden field drives a thresholder that emits unit
   amplitude when ``|z| > z_th`` and no light otherwise (an all-optical decision element; for
   training a sigmoid of steepness ``steepness`` stands in for the step).
5. **Layer 2** (trained): the R groups of k thresholder outputs pass R k×k blocks
   ``W2_r = U_r·Σ_r`` whose outputs are summed per port by fixed R×1 combiners; ports 0…M−1
   are the M output digits.
6. **Receivers** (fixed): each output port is an ordinary PAM-2**c receiver — direct detection
   of |E| with gain ``G`` and its fixed decision thresholds at half-integers. The M decided
   digits are the b-bit result; a passive 1×N splitter (T) broadcasts it.

So the averaging (the weights 2**(c·m)/N), the quantisation (the thresholds of step 4 sit at
the rounding points of the mean) and the conversion to digits with carries (layer 2) are all
done by trained optics; nothing electronic computes a mean or a level. A network exists that
does it exactly (`OptincNetwork.designed`, one useful hidden unit per block for each of the
2**b − 1 rounding thresholds); it needs ~log2(N·2**b) bits of analog precision in the bias
attenuators, so DAC resolution and phase noise decide how exact a real device can be.

Hardware effects: every phase (MZI θ and φ, screens, attenuators) goes through a
``phase_bits`` DAC over [0, 2π) and gets Gaussian noise ``noise_rad`` drawn once per forward
call (a static error of the device for one pass).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oddl.offline.optinc.design import designed_params
from oddl.offline.optinc.levels import (
    MAX_INPUTS,
    OptincError,
    check_bits,
    check_transceivers,
    exact_mean,
    to_digits,
    validate_levels,
)
from oddl.offline.optinc.mesh import (
    TWO_PI,
    block_matrices,
    block_param_count,
    quantise_phase,
)
from oddl.offline.optinc.shape import (
    BIAS_SCALE,
    Shape,
    check_nonneg,
    check_phase_bits,
    default_transceivers,
)

Complex = NDArray[np.complex128]
Float = NDArray[np.float64]

CHUNK = 4096  # digit-sum tuples per vectorised block


class OptincNetwork:
    """P → layer 1 (U·Σ blocks) → thresholders → layer 2 (U·Σ blocks) → PAM receivers.

    ``params`` (radians) holds layer 1's R blocks then layer 2's R blocks, each ``k² + k``
    phases (`oddl.offline.optinc.mesh.block_matrices`). ``blocks`` = R defaults to 2**b − 1,
    the size of the designed exact network; fewer blocks make an under-sized network.
    """

    def __init__(self, n_inputs: int, bits: int, transceivers: int | None = None, *,
                 blocks: int | None = None, phase_bits: int | None = 8,
                 noise_rad: float = 0.0, steepness: float | None = None,
                 seed: int | None = 0, params: ArrayLike | None = None) -> None:
        if isinstance(n_inputs, bool) or not isinstance(n_inputs, (int, np.integer)) \
                or not 2 <= n_inputs <= MAX_INPUTS:
            raise OptincError(f"n_inputs must be an integer in 2..{MAX_INPUTS}, got {n_inputs!r}")
        b = check_bits(bits)
        m = check_transceivers(b, default_transceivers(b) if transceivers is None
                               else transceivers)
        r = (1 << b) - 1 if blocks is None else blocks
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
            raise OptincError(f"blocks must be an integer ≥ 1, got {blocks!r}")
        self.shape = Shape(int(n_inputs), b, m, int(r))
        self.n_inputs, self.bits, self.transceivers = int(n_inputs), b, m
        self.phase_bits = check_phase_bits(phase_bits)
        self.noise_rad = check_nonneg("noise_rad", noise_rad)
        top = self.shape.thresholds - 0.5 - 0.5 / self.n_inputs
        self.steepness = (check_nonneg("steepness", steepness) if steepness is not None
                          else 4.0 * 2 * self.n_inputs * max(top, 0.5))
        self._rng = np.random.default_rng(seed)
        self.param_count = 2 * self.shape.blocks * block_param_count(self.shape.k)
        if params is None:
            p = self._rng.uniform(0.0, TWO_PI, self.param_count)
        else:
            p = np.array(params, dtype=np.float64).reshape(-1)
            if p.shape != (self.param_count,):
                raise OptincError(f"a network with N={n_inputs}, b={b}, M={m}, R={r} blocks "
                                  f"needs {self.param_count} phases, got {p.size}")
            if not np.all(np.isfinite(p)):
                raise OptincError("network phases contain NaN or Inf")
        self.params: Float = p
        self.metadata: dict[str, Any] = {}
        self._table: tuple[Any, NDArray[np.int64]] | None = None

    # -- structure --------------------------------------------------------------------------

    @property
    def levels(self) -> int:
        """Largest level L = 2**b − 1."""
        return (1 << self.bits) - 1

    @property
    def blocks(self) -> int:
        """R, U·Σ blocks per layer."""
        return self.shape.blocks

    @property
    def mzi_count(self) -> int:
        """Tuneable MZIs: k(k−1)/2 per block, R blocks per layer, two layers."""
        k = self.shape.k
        return 2 * self.blocks * k * (k - 1) // 2

    @property
    def attenuator_count(self) -> int:
        """Attenuators (Σ): k per block."""
        return 2 * self.blocks * self.shape.k

    @property
    def svd_mzi_count(self) -> int:
        """MZIs the same blocks would need as full U·Σ·V† (two meshes each)."""
        return 2 * self.mzi_count

    @property
    def phase_shifter_count(self) -> int:
        """Tuneable phase shifters: 2 per MZI, k screen phases and k attenuators per block."""
        return 2 * self.mzi_count + 2 * self.attenuator_count

    @property
    def z_threshold(self) -> float:
        """Field amplitude at which a thresholder fires."""
        return BIAS_SCALE / math.sqrt(self.blocks)

    @property
    def receiver_gain(self) -> float:
        """Gain of the output receivers: the R×1 combiners' loss times the layer-2 scale."""
        s = self.shape
        return math.sqrt(s.digit_top ** 2 * (s.transceivers - 1) + 1) * math.sqrt(self.blocks)

    def hardware(self) -> dict[str, Any]:
        """Hardware counts and settings (also written to phase files)."""
        s = self.shape
        return {"n_inputs": self.n_inputs, "bits": self.bits, "transceivers": s.transceivers,
                "digit_bits": s.digit_bits, "blocks": s.blocks, "block_size": s.k,
                "hidden": s.hidden, "phase_bits": self.phase_bits, "noise_rad": self.noise_rad,
                "steepness": self.steepness, "mzi_count": self.mzi_count,
                "svd_mzi_count": self.svd_mzi_count,
                "attenuator_count": self.attenuator_count,
                "phase_shifter_count": self.phase_shifter_count,
                "training_set": s.sum_levels ** s.transceivers}

    def layer_params(self, params: Float) -> tuple[Float, Float]:
        """Split a parameter vector into layer 1's and layer 2's blocks ``(R, k² + k)``."""
        per = block_param_count(self.shape.k)
        half = self.blocks * per
        return params[:half].reshape(self.blocks, per), params[half:].reshape(self.blocks, per)

    # -- preprocessing ----------------------------------------------------------------------

    def digit_sums(self, x: NDArray[np.integer]) -> NDArray[np.int64]:
        """P's job in integers: the sum over servers of each digit position ``(elements, M)``."""
        c, mask = self.shape.digit_bits, self.shape.digit_top
        work = x if x.dtype.itemsize <= 2 else x.astype(np.int64)
        out = np.empty((len(x), self.transceivers), dtype=np.int64)
        for m in range(self.transceivers):
            out[:, m] = ((work >> (c * m)) & mask).sum(axis=1, dtype=np.int64)
        return out

    def preprocessed(self, sums: NDArray[np.integer]) -> Float:
        """Layer 1's inputs: the field of P's port 0 per position, then the bias laser."""
        s = self.shape
        out = np.ones((len(sums), s.k), dtype=np.float64)
        out[:, : s.transceivers] = sums / (s.digit_top * math.sqrt(self.n_inputs))
        return out

    def training_set(self) -> tuple[NDArray[np.int64], Float]:
        """Every digit-sum tuple and its probability for uniform random levels."""
        s = self.shape
        one = np.zeros(s.sum_levels)
        one[0] = 1.0
        digit = np.zeros(s.sum_levels)
        digit[: s.digit_top + 1] = 1.0 / (s.digit_top + 1)
        dist = one
        for _ in range(self.n_inputs):  # distribution of a sum of N uniform digits
            dist = np.convolve(dist, digit)[: s.sum_levels]
        grids = np.indices((s.sum_levels,) * s.transceivers).reshape(s.transceivers, -1).T
        prob = np.prod(dist[grids], axis=1)
        return np.ascontiguousarray(grids, dtype=np.int64), prob / prob.sum()

    def target_digits(self, sums: NDArray[np.integer]) -> NDArray[np.int64]:
        """The exact answer for digit sums: digits of floor(Σ_m 2**(c·m)·S_m / N + 1/2)."""
        s = self.shape
        total = np.sum(sums << (s.digit_bits * np.arange(s.transceivers)), axis=1)
        q = (2 * total + self.n_inputs) // (2 * self.n_inputs)
        return to_digits(q, self.bits, self.transceivers)

    # -- hardware view of the phases --------------------------------------------------------

    def effective_params(self, *, noise_rad: float | None = None, phase_bits: Any = "network",
                         rng: np.random.Generator | None = None,
                         params: ArrayLike | None = None) -> Float:
        """Return the phases the hardware applies: DAC-quantised, plus one noise realisation."""
        p = self.params if params is None else np.asarray(params, dtype=np.float64)
        bits = self.phase_bits if phase_bits == "network" else check_phase_bits(phase_bits)
        q = quantise_phase(p, bits)
        sigma = self.noise_rad if noise_rad is None else check_nonneg("noise_rad", noise_rad)
        if sigma > 0:
            q = q + (rng or self._rng).normal(0.0, sigma, q.shape)
        return q

    def matrices(self, effective: Float) -> tuple[Complex, Complex]:
        """The blocks ``(R, k, k)`` of layer 1 and layer 2 for the given phases."""
        p1, p2 = self.layer_params(effective)
        return block_matrices(p1, self.shape.k)[0], block_matrices(p2, self.shape.k)[0]

    def flat_matrices(self, effective: Float) -> tuple[Complex, Complex]:
        """Layer 1 as ``(k, H)`` (inputs × hidden) and layer 2 as ``(H, M)`` for matmuls."""
        w1, w2 = self.matrices(effective)
        k, m = self.shape.k, self.transceivers
        return (np.ascontiguousarray(w1.reshape(-1, k).T),
                np.ascontiguousarray(np.swapaxes(w2[:, :m, :], 1, 2).reshape(-1, m)))

    # -- forward ----------------------------------------------------------------------------

    def decide(self, sums: NDArray[np.integer], effective: Float) -> NDArray[np.int64]:
        """The receivers' digits ``(tuples, M)`` for digit sums through the given phases.

        Hard thresholders; evaluated in float32 as real matrix products (|z|² against the
        threshold², layer 2 on the real and imaginary parts), in chunks.
        """
        w1f, w2f = self.flat_matrices(effective)
        root = math.sqrt(self.blocks)
        a1 = np.concatenate([w1f.real, w1f.imag], axis=1).astype(np.float32) / root
        a2 = np.concatenate([w2f.real, w2f.imag], axis=1).astype(np.float32)
        hid, m = w1f.shape[1], self.transceivers
        th2 = np.float32(self.z_threshold ** 2)
        gain = self.receiver_gain / root
        out = np.empty((len(sums), m), dtype=np.int64)
        for lo in range(0, len(sums), CHUNK):
            x = self.preprocessed(sums[lo : lo + CHUNK]).astype(np.float32)
            z = x @ a1
            power = z[:, :hid] ** 2 + z[:, hid:] ** 2
            h = (power > th2).astype(np.float32)
            y = h @ a2
            r = gain * np.hypot(y[:, :m], y[:, m:])
            out[lo : lo + CHUNK] = np.clip(np.floor(r + 0.5), 0, self.shape.digit_top)
        return out

    def _levels_of_keys(self, keys: NDArray[np.int64], eff: Float) -> NDArray[np.int64]:
        """Decided levels for digit-sum tuples given by key ``Σ_m S_m·L_s**m``."""
        s = self.shape
        base = s.sum_levels ** np.arange(self.transceivers, dtype=np.int64)
        tuples = (keys[:, None] // base) % s.sum_levels
        weights = 1 << (s.digit_bits * np.arange(self.transceivers))
        return np.sum(self.decide(tuples, eff) * weights, axis=1)

    def forward(self, x: ArrayLike, *, noise_rad: float | None = None,
                phase_bits: Any = "network",
                rng: np.random.Generator | None = None) -> NDArray[np.int64]:
        """Return the quantised mean level of each element ``(batch,)`` (one noise realisation).

        ``x`` is ``(batch, n_inputs)`` integer levels; raises OptincError on bad input. The
        optics are evaluated once per distinct digit-sum tuple of the batch (what P leaves).
        """
        xv = validate_levels(x, self.n_inputs, self.bits)
        if len(xv) == 0:
            return np.zeros(0, dtype=np.int64)
        eff = self.effective_params(noise_rad=noise_rad, phase_bits=phase_bits, rng=rng)
        keys = self.tuple_keys(xv)
        sigma = self.noise_rad if noise_rad is None else noise_rad
        space = self.shape.sum_levels ** self.transceivers
        if space <= 1 << 20 and sigma == 0:
            # a table of every tuple, kept while the phases and the DAC stay the same
            tag = (eff.tobytes(), self.shape)
            if self._table is None or self._table[0] != tag:
                self._table = (tag, self._levels_of_keys(np.arange(space, dtype=np.int64), eff))
            return self._table[1][keys]
        if space <= 1 << 22:
            # only the tuples this batch holds (found with a count, not a sort)
            present = np.flatnonzero(np.bincount(keys, minlength=space))
            table = np.zeros(space, dtype=np.int64)
            table[present] = self._levels_of_keys(present, eff)
            return table[keys]
        uniq, inverse = np.unique(keys, return_inverse=True)
        return self._levels_of_keys(uniq, eff)[inverse.reshape(-1)]

    def tuple_keys(self, x: NDArray[np.integer]) -> NDArray[np.int64]:
        """Key ``Σ_m S_m·L_s**m`` of each element's digit sums, as Σ_i key(x_i) (a lookup per
        server: the key of one level is its digits in base L_s)."""
        s = self.shape
        base = s.sum_levels ** np.arange(self.transceivers, dtype=np.int64)
        per_level = to_digits(np.arange(1 << self.bits), self.bits, self.transceivers) @ base
        keys = per_level[x[:, 0]]
        for i in range(1, self.n_inputs):
            keys += per_level[x[:, i]]
        return keys

    def exact_fraction(self, x: ArrayLike, *, realisations: int = 1,
                       noise_rad: float | None = None, phase_bits: Any = "network",
                       rng: np.random.Generator | None = None) -> float:
        """Fraction of elements whose output equals the exact quantised mean (mean over noise
        realisations when there is noise)."""
        xv = validate_levels(x, self.n_inputs, self.bits)
        want = exact_mean(xv)
        sigma = self.noise_rad if noise_rad is None else noise_rad
        reps = max(1, int(realisations)) if sigma > 0 else 1
        hits = 0.0
        for _ in range(reps):
            got = self.forward(xv, noise_rad=sigma, phase_bits=phase_bits, rng=rng)
            hits += float(np.mean(got == want)) if len(want) else 1.0
        return hits / reps

    def set_exact_fraction(self, *, realisations: int = 1, noise_rad: float | None = None,
                           phase_bits: Any = "network", rng: np.random.Generator | None = None,
                           params: ArrayLike | None = None) -> float:
        """Exact fraction over the whole training set weighted by its probability (the same
        figure as uniform random levels, without sampling)."""
        tuples, prob = self.training_set()
        want = self.target_digits(tuples)
        sigma = self.noise_rad if noise_rad is None else noise_rad
        reps = max(1, int(realisations)) if sigma > 0 else 1
        total = 0.0
        for _ in range(reps):
            eff = self.effective_params(noise_rad=sigma, phase_bits=phase_bits, rng=rng,
                                        params=params)
            ok = np.all(self.decide(tuples, eff) == want, axis=1)
            total += float(np.sum(prob[ok]))
        return total / reps

    def error_histogram(self, x: ArrayLike, **kwargs: Any) -> dict[int, int]:
        """Counts of (output − exact) in levels for one forward pass."""
        xv = validate_levels(x, self.n_inputs, self.bits)
        diff = self.forward(xv, **kwargs) - exact_mean(xv)
        values, counts = np.unique(diff, return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts, strict=True)}

    # -- designed network -------------------------------------------------------------------

    @classmethod
    def designed(cls, n_inputs: int, bits: int, transceivers: int | None = None,
                 **kwargs: Any) -> OptincNetwork:
        """The textbook exact network before hardware-aware training
        (`oddl.offline.optinc.design.designed_params`)."""
        net = cls(n_inputs, bits, transceivers, **kwargs)
        net.params = designed_params(net.shape)
        return net
