"""What a worker process reports of a result instead of its values: its length, the SHA-256
of its float32 bytes and its first values. A rank's results of several million elements as
JSON lists cost the rank-path tests most of their minutes (printing, piping, parsing and
comparing them); the test compares the fingerprint of the values it expects instead."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

HEAD = 4
"""Values kept as they are, so a failing comparison shows where the results start."""


def fingerprint(values: Any) -> dict[str, Any]:
    """`values` (anything numpy reads: an array, a list, a CPU tensor's `.numpy()`) as
    float32: {"n", "sha256", "head"}."""
    flat = np.ascontiguousarray(np.asarray(values, dtype=np.float32)).reshape(-1)
    return {"n": int(flat.size), "sha256": hashlib.sha256(flat.tobytes()).hexdigest(),
            "head": flat[:HEAD].tolist()}
