"""Numerical model of OptINC: optical in-network averaging of quantised gradients with MZIs.

The public face of the model (what the device, the CLI and the agents import). The parts live
in smaller modules:

- `oddl.offline.optinc.levels`: levels, digits on M transceivers, the exact mean, errors;
- `oddl.offline.optinc.mesh`: the MZI, Clements meshes and batches of unitary × diagonal blocks
  with their gradients;
- `oddl.offline.optinc.onn`: the network — transceivers, optical preprocessing P, two layers of
  U·Σ blocks with optical thresholders between them, PAM receivers (see its docstring);
- `oddl.offline.optinc.train`: hardware-aware training (DAC in the loop, phase noise).

This module adds phase files (JSON, `save_phases`/`load_phases`, and the file shipped for
N = 4, 8 bits: `shipped_phases`) and the two-level cascade for N² servers (`cascade_forward`).
What is from the paper and what is ours: ``docs/explanation/optinc.md``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oddl.offline.optinc.levels import (
    MAX_BITS,
    MAX_INPUTS,
    OptincError,
    all_inputs,
    check_transceivers,
    decode_levels,
    encode_levels,
    exact_mean,
    from_digits,
    sample_inputs,
    splitter_loss_db,
    to_digits,
    validate_levels,
)
from oddl.offline.optinc.mesh import ClementsMesh, from_unitary, mzi, quantise_phase
from oddl.offline.optinc.onn import OptincNetwork
from oddl.offline.optinc.shape import default_transceivers
from oddl.offline.optinc.train import TrainResult, train

__all__ = [
    "MAX_BITS",
    "MAX_INPUTS",
    "PHASE_FILE_FORMAT",
    "PHASE_FILE_VERSION",
    "CascadeResult",
    "ClementsMesh",
    "OptincError",
    "OptincNetwork",
    "TrainResult",
    "all_inputs",
    "cascade_forward",
    "cascade_mzi_count",
    "check_transceivers",
    "decode_levels",
    "default_transceivers",
    "encode_levels",
    "exact_mean",
    "from_digits",
    "from_unitary",
    "load_phases",
    "mzi",
    "quantise_phase",
    "sample_inputs",
    "save_phases",
    "shipped_phases",
    "splitter_loss_db",
    "to_digits",
    "train",
    "validate_levels",
]

PHASE_FILE_FORMAT = "oddl-optinc-phases"
PHASE_FILE_VERSION = 2
SHIPPED = {(4, 8): "optinc-n4-b8.json"}
"""Phase files shipped in ``offline/optinc/data`` by (N, b)."""


# ---- phase files --------------------------------------------------------------------------


def save_phases(path: str | os.PathLike[str], network: OptincNetwork,
                metadata: dict[str, Any] | None = None) -> None:
    """Write the network's phases and header as JSON (atomically).

    Format (version 2)::

        {"format": "oddl-optinc-phases", "version": 2, "n_inputs": N, "bits": b,
         "transceivers": M, "blocks": R, "phase_bits": 16 | null, "noise_rad": trained-for
         noise, "steepness": ..., hardware counts ..., "params": [R·(k²+k) phases of layer 1,
         then layer 2], "metadata": {... e.g. "training": stats}}

    Phases are the trained latent values in radians; the device quantises them at its DAC.
    """
    doc = {"format": PHASE_FILE_FORMAT, "version": PHASE_FILE_VERSION, **network.hardware(),
           "params": [round(float(v), 9) for v in network.params],
           "metadata": metadata if metadata is not None else network.metadata}
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
        fh.write("\n")
    os.replace(tmp, path)


def load_phases(path: str | os.PathLike[str], n_inputs: int | None = None,
                bits: int | None = None, **overrides: Any) -> OptincNetwork:
    """Load a phase file; refuse one for another N or bit width.

    ``n_inputs``/``bits`` of None accept what the file says. ``overrides`` (``noise_rad``,
    ``phase_bits``, ``seed``) replace the stored hardware settings. The network carries the
    file's ``metadata``.
    """
    where = f"phase file {os.fspath(path)!r}"
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise OptincError(f"cannot read {where}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise OptincError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != PHASE_FILE_FORMAT:
        raise OptincError(f"{where} is not an OptINC phase file (format != {PHASE_FILE_FORMAT!r})")
    if doc.get("version") != PHASE_FILE_VERSION:
        raise OptincError(f"{where} has version {doc.get('version')!r}; this oddl reads version "
                          f"{PHASE_FILE_VERSION} (phase files of version 1 held the single-mesh "
                          "model; train new phases with `oddl optinc train`)")
    try:
        f_n, f_bits = int(doc["n_inputs"]), int(doc["bits"])
        m, r = int(doc["transceivers"]), int(doc["blocks"])
        params = np.asarray(doc["params"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as exc:
        raise OptincError(f"{where} lacks or has a bad field: {exc}") from exc
    if (n_inputs is not None and f_n != n_inputs) or (bits is not None and f_bits != bits):
        raise OptincError(f"{where} was trained for N={f_n} inputs and {f_bits}-bit levels, but "
                          f"N={n_inputs if n_inputs is not None else f_n} inputs and "
                          f"{bits if bits is not None else f_bits}-bit levels were requested; "
                          "train phases for this configuration (oddl optinc train)")
    settings: dict[str, Any] = {"phase_bits": doc.get("phase_bits"),
                                "noise_rad": doc.get("noise_rad", 0.0),
                                "steepness": doc.get("steepness")}
    settings.update(overrides)
    try:
        net = OptincNetwork(f_n, f_bits, m, blocks=r, params=params, **settings)
    except OptincError as exc:
        raise OptincError(f"{where}: {exc}") from exc
    meta = doc.get("metadata", {})
    net.metadata = meta if isinstance(meta, dict) else {}
    return net


def shipped_phases(n_inputs: int, bits: int, **overrides: Any) -> OptincNetwork | None:
    """The phase file shipped with oddl for (N, b), loaded; None if none is shipped."""
    path = shipped_path(n_inputs, bits)
    return None if path is None else load_phases(path, n_inputs, bits, **overrides)


def shipped_path(n_inputs: int, bits: int) -> str | None:
    """Path of the shipped phase file for (N, b), if there is one on disk."""
    name = SHIPPED.get((n_inputs, bits))
    if name is None:
        return None
    p = files("oddl.offline.optinc").joinpath("data", name)  # package data (pyproject.toml)
    return str(p) if isinstance(p, Path) and p.is_file() else None


# ---- cascade ------------------------------------------------------------------------------


def cascade_mzi_count(n: int, levels: int = 2, bits: int = 8,
                      transceivers: int | None = None) -> int:
    """Tuneable MZIs of a ``levels``-deep cascade of N-input devices (N**levels servers).

    Level l (0 = the servers' side) has N**(levels−1−l) devices; each device's network has
    the MZIs of `OptincNetwork` (its size depends on b and M, not on N: P is passive).
    """
    if n < 2 or levels < 1:
        raise OptincError(f"cascade needs n ≥ 2 and levels ≥ 1, got n={n}, levels={levels}")
    per = OptincNetwork(n, bits, transceivers, params=None, seed=0).mzi_count
    return sum(n ** k for k in range(levels)) * per


@dataclass
class CascadeResult:
    """Outputs of a two-level cascade and how they compare with the exact mean."""

    levels: NDArray[np.int64]  # what every server receives
    exact: NDArray[np.int64]  # round-half-up mean of all N1·N2 inputs
    ideal: NDArray[np.int64]  # what perfect devices give: rounded mean of rounded group means
    exact_fraction: float
    ideal_fraction: float  # fraction where double rounding alone already equals the exact mean
    device_fraction: float  # fraction where the devices match the ideal cascade


def cascade_forward(x: ArrayLike, level1: OptincNetwork, level2: OptincNetwork, *,
                    noise_rad: float | None = None,
                    rng: np.random.Generator | None = None) -> CascadeResult:
    """Evaluate a two-level cascade: N2 level-1 devices of N1 inputs, one level-2 device of N2.

    Inputs ``(elements, N1·N2)``; group g is inputs g·N1 … g·N1+N1−1. All level-1 devices use
    the phases of ``level1`` (each its own noise realisation). Each level-1 result is detected
    by its receivers and re-sent on M transceivers (O-E-O), so the result is the rounded mean of
    rounded group means: it can differ from the rounded overall mean by one level
    (``ideal_fraction`` says how often).
    """
    n1, n2, bits = level1.n_inputs, level2.n_inputs, level1.bits
    if level2.bits != bits:
        raise OptincError(f"cascade levels disagree: level 1 is {bits}-bit, level 2 is "
                          f"{level2.bits}-bit")
    xv = validate_levels(x, n1 * n2, bits)
    mid = np.stack([level1.forward(xv[:, g * n1 : (g + 1) * n1], noise_rad=noise_rad, rng=rng)
                    for g in range(n2)], axis=1)
    out = level2.forward(mid, noise_rad=noise_rad, rng=rng)
    exact = exact_mean(xv)
    ideal = exact_mean(exact_mean(xv.reshape(-1, n1)).reshape(-1, n2))
    size = max(1, len(exact))
    return CascadeResult(levels=out, exact=exact, ideal=ideal,
                         exact_fraction=float(np.sum(out == exact)) / size,
                         ideal_fraction=float(np.sum(ideal == exact)) / size,
                         device_fraction=float(np.sum(out == ideal)) / size)
