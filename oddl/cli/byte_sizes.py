"""Byte counts with units on command lines (``--bytes 574.67MB``): `parse_size`."""

from __future__ import annotations

import argparse
import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a byte count such as ``4096``, ``100MB``, ``574.67 MB`` or ``1GiB`` (MB = 10⁶ B)."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}; use a byte count with an optional unit, e.g. 4096, 100MB, 1GiB"
        )
    return round(float(m.group(1)) * _UNITS[unit])
