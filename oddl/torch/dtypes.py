"""Which tensors the oddl backend's reductions take, and as what they travel (issue 33).

The agent reduces numeric numpy arrays. What numpy lacks travels as something it has, reduced
to the bit what gloo gives:

- bool as uint8 (0 or 1): SUM, MAX and BOR as the maximum (a logical or), MIN, PRODUCT and
  BAND as the minimum (a logical and), BXOR as itself; AVG is refused, as gloo refuses it;
- complex SUM and AVG as the sum of its real view (real and imaginary parts add on their
  own, as gloo's complex sum does; AVG then divides the complex result, as gloo does); the
  other ops on complex tensors are refused (c10d refuses them before any backend);
- bfloat16 as float32 (`oddl.torch.native.reduce_`);
- integer AVG as the sum divided by the world size, truncated toward zero (`average`): what
  NCCL's average gives integers, and what PyTorch Lightning computes on gloo (which has no
  integer AVG) when it averages a logged integer (decision record 0030).

A 0-d tensor is a 1-element array (`at_least_1d`). `check_reduction` raises, before anything
is sent, for what none of this carries, naming the fix: such a call consumes no step and
leaves the group usable.
"""

from __future__ import annotations

import numpy as np
import torch

from oddl.torch.channel import ENV_FALLBACK, UnsupportedCollective

__all__ = ["BOOL_OPS", "at_least_1d", "average", "check_reduction", "numpy_reducible"]

BOOL_OPS = {"SUM": "MAX", "MAX": "MAX", "BOR": "MAX", "MIN": "MIN", "PRODUCT": "MIN",
            "BAND": "MIN", "BXOR": "BXOR"}
"""A bool reduction -> the uint8 reduction that gives gloo's result on 0/1 values."""
COMPLEX_OPS = ("SUM", "AVG")
BITWISE = ("BAND", "BOR", "BXOR")
_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


def at_least_1d(a: np.ndarray) -> np.ndarray:
    """`a`, or for a 0-d array a 1-element view of the same memory (the agent's calls and
    their `out=` work on arrays of at least one dimension)."""
    return a.reshape(1) if a.ndim == 0 else a


def numpy_reducible(dtype: torch.dtype) -> bool:
    """Whether numpy has `dtype` (the agent reduces it as it is)."""
    return not (dtype in (torch.bfloat16, torch.bool) or dtype.is_complex
                or dtype.is_floating_point and dtype not in _NUMPY_FLOATS)


def check_reduction(t: torch.Tensor, name: str, what: str, fallback: bool = False) -> None:
    """UnsupportedCollective, before anything is sent, unless the backend reduces `t` with
    torch's reduction `name` (natively, or over the gloo fallback when `fallback`)."""
    if t.device.type != "cpu":
        raise UnsupportedCollective(f"{what}: the oddl backend carries CPU tensors, not "
                                    f"{t.device}; register it for cpu and move tensors there")
    if t.dtype == torch.bool:
        if name not in BOOL_OPS:
            raise UnsupportedCollective(
                f"{what}({name}) of torch.bool: a bool has no average (gloo refuses it too); "
                "use SUM or MAX for a logical or, MIN or PRODUCT for a logical and, or cast to "
                "float32 first")
        return
    if t.is_complex():
        if name not in COMPLEX_OPS and not fallback:
            raise UnsupportedCollective(f"{what}({name}) of {t.dtype}: complex tensors are "
                                        f"reduced with SUM or AVG (gloo's too)")
        return
    if name in BITWISE and t.is_floating_point():
        raise UnsupportedCollective(f"{what}({name}) of {t.dtype}: bitwise reductions take "
                                    "integer or bool tensors")
    if t.dtype != torch.bfloat16 and not numpy_reducible(t.dtype) and not fallback:
        raise UnsupportedCollective(f"{what}: the agent reduces numeric numpy dtypes, not "
                                    f"{t.dtype}; cast to float32 (or set {ENV_FALLBACK}=gloo)")


def average(t: torch.Tensor, world: int) -> None:
    """`t`, the sum over `world` ranks, divided in place into their average: integers
    truncated toward zero (module docstring)."""
    if t.is_floating_point() or t.is_complex():
        t.div_(world)
    else:
        t.copy_(torch.div(t, world, rounding_mode="trunc"))
