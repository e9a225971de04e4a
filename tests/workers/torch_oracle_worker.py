"""One rank of the gloo-oracle tests: `python tests/workers/torch_oracle_worker.py`.

Started with torchrun's environment and ODDL_LOCAL_API by tests/top/test_torch_oracle.py; joins
`init_process_group("oddl")` with a gloo group of the same ranks beside it, prints "ready",
then serves cases: each stdin line is one JSON case (`run_case`), run on both groups in this
same process from the same inputs, answered by one JSON line: each backend's result (or
error) and whether they are equal. An empty line (or end of input) ends the rank.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import oddl.torch.backend as ob

DTYPES = {name: getattr(torch, name) for name in (
    "bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64",
    "complex64", "complex128")}


def values(case: dict[str, Any], rank: int, shape: list[int], salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s input of `shape`: values on which every reduction is exact in the dtype
    (small integers, halves; for PRODUCT ±½, ±1, ±2), drawn from the case's seed."""
    g = torch.Generator().manual_seed(case["seed"] * 1000 + rank * 10 + salt)
    dtype = DTYPES[case["dtype"]]
    n = 1
    for s in shape:
        n *= s
    if dtype == torch.bool:
        return (torch.randint(0, 2, (n,), generator=g) == 1).reshape(shape)
    if case.get("op") == "PRODUCT":
        pool = torch.tensor([1, 2, -1, -2] if not dtype.is_floating_point and not dtype.is_complex
                            else [0.5, 1.0, 2.0, -1.0, -0.5])
        if dtype == torch.uint8:
            pool = torch.tensor([1, 2, 3])
        v = pool[torch.randint(0, len(pool), (n,), generator=g)]
    else:
        low = 0 if dtype == torch.uint8 else -8
        v = torch.randint(low, 9, (n,), generator=g).to(torch.float64)
        if dtype.is_floating_point or dtype.is_complex:
            v = v / 2
    if dtype.is_complex:
        v = torch.complex(v, v.flip(0) - 1)
    return v.to(dtype).reshape(shape)


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """`t` with the same values in another memory layout: "transposed" (a 2-D view with
    swapped strides), "strided" (every other element of a larger tensor), or as it is."""
    if layout == "transposed" and t.dim() == 2:
        return t.t().contiguous().t()
    if layout == "strided" and t.dim() >= 1:
        wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t


def blocks(world: int, shape: list[int]) -> list[int]:
    """The shape of `world` blocks of `shape` one after another along dim 0 (gloo's layout of
    the tensor forms)."""
    return [world * shape[0], *shape[1:]] if shape else [world]


def _rop(case: dict[str, Any]) -> Any:
    return getattr(dist.ReduceOp, case.get("op", "SUM"))


def _reductions(case: dict[str, Any], rank: int, world: int, group: Any
                ) -> dict[str, Callable[[], Any]]:
    shape, layout, root = case["shape"], case.get("layout", ""), case.get("root", 0)

    def all_reduce() -> Any:
        t = laid_out(values(case, rank, shape), layout)
        dist.all_reduce(t, op=_rop(case), group=group)
        return t

    def reduce() -> Any:
        t = laid_out(values(case, rank, shape), layout)
        dist.reduce(t, dst=root, op=_rop(case), group=group)
        return t if rank == root else None  # gloo leaves the others' tensors unspecified

    def reduce_scatter() -> Any:
        out = laid_out(torch.empty(shape, dtype=DTYPES[case["dtype"]]), layout)
        ins = [laid_out(values(case, rank, shape, j), layout) for j in range(world)]
        dist.reduce_scatter(out, ins, op=_rop(case), group=group)
        return out

    def reduce_scatter_tensor() -> Any:
        out = torch.empty(shape, dtype=DTYPES[case["dtype"]])
        dist.reduce_scatter_tensor(out, values(case, rank, blocks(world, shape)), op=_rop(case),
                                   group=group)
        return out

    return {"all_reduce": all_reduce, "reduce": reduce, "reduce_scatter": reduce_scatter,
            "reduce_scatter_tensor": reduce_scatter_tensor}


def _movers(case: dict[str, Any], rank: int, world: int, group: Any
            ) -> dict[str, Callable[[], Any]]:
    shape, layout, root = case["shape"], case.get("layout", ""), case.get("root", 0)
    dtype = DTYPES[case["dtype"]]

    def broadcast() -> Any:
        t = laid_out(values(case, rank, shape), layout)
        dist.broadcast(t, src=root, group=group)
        return t

    def all_gather() -> Any:
        outs = [laid_out(torch.zeros(shape, dtype=dtype), layout) for _ in range(world)]
        dist.all_gather(outs, laid_out(values(case, rank, shape), layout), group=group)
        return outs

    def all_gather_into_tensor() -> Any:
        out = torch.zeros(blocks(world, shape), dtype=dtype)
        dist.all_gather_into_tensor(out, values(case, rank, shape), group=group)
        return out

    def gather() -> Any:
        outs = [torch.zeros(shape, dtype=dtype) for _ in range(world)] if rank == root else None
        dist.gather(laid_out(values(case, rank, shape), layout), outs, dst=root, group=group)
        return outs

    def scatter() -> Any:
        out = laid_out(torch.zeros(shape, dtype=dtype), layout)
        ins = [values(case, rank, shape, j) for j in range(world)] if rank == root else None
        dist.scatter(out, ins, src=root, group=group)
        return out

    def all_to_all_single() -> Any:
        out = torch.zeros(blocks(world, shape), dtype=dtype)
        dist.all_to_all_single(out, values(case, rank, blocks(world, shape)), group=group)
        return out

    def barrier() -> Any:
        dist.barrier(group=group)
        return []

    return {"broadcast": broadcast, "all_gather": all_gather, "gather": gather,
            "all_gather_into_tensor": all_gather_into_tensor, "scatter": scatter,
            "all_to_all_single": all_to_all_single, "barrier": barrier}


def refusals(rank: int, group: Any) -> dict[str, Any]:
    """Calls the oddl backend refuses before any data moves, then a sum on the same group
    (which must work: the refusals used up no step). Nothing on gloo's group."""
    if group is not None:
        return {}
    errors: dict[str, str] = {}

    def refused(name: str, call: Callable[[], Any]) -> None:
        try:
            call()
            errors[name] = ""
        except Exception as exc:  # reported to the test
            errors[name] = f"{type(exc).__name__}: {exc}"

    refused("bool_avg", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool),
                                                op=dist.ReduceOp.AVG))
    opts = dist.BroadcastOptions()
    opts.rootRank = 7
    world = dist.group.WORLD
    assert world is not None
    refused("root_7", lambda: world.broadcast([torch.ones(2)], opts).wait())
    refused("mixed_dtypes", lambda: dist.reduce_scatter_tensor(
        torch.empty(2), torch.ones(8, dtype=torch.float64)))
    after = torch.full((3,), rank + 1.0)
    dist.all_reduce(after)
    return {"errors": errors, "sum_after": after.tolist()}


def _plain(x: Any) -> Any:
    """A result as JSON: tensors as [dtype, shape, values] (complex as [re, im] pairs)."""
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, torch.Tensor):
        v = torch.view_as_real(x.resolve_conj()) if x.is_complex() else x
        if v.dtype == torch.bfloat16:
            v = v.float()
        return [str(x.dtype), list(x.shape), v.tolist()]
    return x


def _one(case: dict[str, Any], rank: int, world: int, group: Any) -> dict[str, Any]:
    calls = {**_reductions(case, rank, world, group), **_movers(case, rank, world, group),
             "refusals": lambda: refusals(rank, group)}
    start = time.monotonic()
    try:
        return {"value": _plain(calls[case["collective"]]()),
                "seconds": time.monotonic() - start}
    except Exception as exc:  # reported: the test decides whether refusing was right
        return {"error": f"{type(exc).__name__}: {exc}"[:800],
                "seconds": time.monotonic() - start}


def _drop_last_dim(v: Any) -> Any:
    """A `_plain` result of one-element-last-dim tensors as the 0-d case's result."""
    if isinstance(v, list) and len(v) == 3 and isinstance(v[0], str) and v[0].startswith(
            "torch."):
        dtype, shape, values = v
        if not shape or shape[-1] != 1:
            return v  # (a concatenation of 0-d blocks is 1-d either way)

        def squeeze(x: Any, depth: int) -> Any:
            return x[0] if depth == 0 else [squeeze(y, depth - 1) for y in x]
        return [dtype, shape[:-1], squeeze(values, len(shape) - 1)]
    return [_drop_last_dim(x) for x in v] if isinstance(v, list) else v


def run_case(case: dict[str, Any], rank: int, world: int, gloo: Any) -> dict[str, Any]:
    """The case on gloo, then on oddl (the world group), from the same inputs. gloo runs it on
    contiguous tensors of the same values: its reduce_scatter of strided inputs returns wrong
    sums (found here; oddl's were the sums computed by hand). gloo refuses some 0-d tensors
    (all_gather_into_tensor) and dies (SIGSEGV) reduce-scattering into a 0-d output: for a 0-d
    case its oracle is then the same case with one-element tensors, the result read as 0-d."""
    contiguous = {**case, "layout": ""}
    crashes = case["collective"] == "reduce_scatter_tensor"
    theirs = {"error": "not run"} if crashes and case["shape"] == [] else \
        _one(contiguous, rank, world, gloo)
    if "error" in theirs and case["shape"] == []:
        theirs = _one({**contiguous, "shape": [1]}, rank, world, gloo)
        if "value" in theirs:
            theirs["value"] = _drop_last_dim(theirs["value"])
            theirs["as_one_element"] = True
    ours = _one(case, rank, world, None)
    return {"rank": rank, "gloo": theirs, "oddl": ours,
            "equal": "value" in theirs and ours.get("value") == theirs["value"]}


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("oddl", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    assert ob.BACKEND == dist.get_backend()
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        print(json.dumps(run_case(json.loads(line), rank, world, gloo)), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
