"""Which collective a call is: its kind, its reduction op and its root, as every layer names
them (the client, the local API, the agents' ready exchange, the controller's barrier).

Kinds run natively over the same slot machinery as the all-reduce (`docs/explanation/collectives.md`).
Every kind works on one flat *work buffer* per rank, the same size on every rank; the client
lays it out (`work_blocks`) and reads its result from it:

- ``all_reduce``, ``broadcast``: the array itself;
- ``all_gather``, ``reduce_scatter``, ``gather``, ``scatter``: N blocks, block r is rank r's;
- ``all_to_all``: 2N blocks: the input (block j goes to rank j), then the output (block i
  came from rank i).

The reduction op only changes what a receiver does with a REDUCE segment (`UFUNCS`): the
plan and the schedule are the same for every op. Pure.
"""

from __future__ import annotations

import numpy as np

from oddl.common.errors import OperationRefused

ALL_REDUCE = "all_reduce"
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "gather",
         "scatter")
"""The native collective kinds."""
P2P = ("send", "recv", "recv_any")
"""Point-to-point calls: a flow from one rank to one other (`oddl.agents.point_to_point`); their root is the
peer's rank (none for a receive from any source), they reduce nothing, and they are no
collective of the job (no step number)."""
ROOTED = frozenset({"broadcast", "gather", "scatter"})
"""Kinds with a root rank."""
REDUCING = frozenset({"all_reduce", "reduce_scatter"})
"""Kinds whose receivers reduce (take an op)."""

UFUNCS: dict[str, np.ufunc] = {
    "sum": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
"""The reduction ops by name: what a receiver applies to a REDUCE segment."""
BITWISE = frozenset({"band", "bor", "bxor"})


def work_blocks(kind: str, world: int) -> int:
    """How many equal blocks the work buffer of `kind` holds for `world` ranks (1: the
    array itself, as the all-reduce)."""
    if kind in ("all_reduce", "broadcast") or kind in P2P:
        return 1
    if kind == "all_to_all":
        return 2 * world
    return world


def check_call(kind: str, op: str, root: int, dtype: np.dtype, world: int | None = None
               ) -> None:
    """OperationRefused naming what is wrong with (kind, op, root) for `dtype` (and `world`
    ranks, when known)."""
    if not isinstance(kind, str) or kind not in KINDS + P2P:
        raise OperationRefused(f"unknown collective kind {kind!r}; use one of "
                               f"{', '.join(KINDS + P2P)}")
    if not isinstance(op, str) or op not in UFUNCS:
        raise OperationRefused(f"unknown reduction op {op!r}; use one of {', '.join(UFUNCS)}")
    if op != "sum" and kind not in REDUCING:
        raise OperationRefused(f"{kind} does not reduce; call it without op (op {op!r})")
    if op in BITWISE and dtype.kind not in "iu":
        raise OperationRefused(f"op {op!r} is bitwise: it takes integer arrays, not {dtype}; "
                               "use sum, min, max or prod for floating-point data")
    if isinstance(root, bool) or not isinstance(root, int) or root < 0:
        raise OperationRefused(f"root {root!r} is not a rank number")
    if root and kind not in ROOTED and kind not in P2P:
        raise OperationRefused(f"{kind} has no root (root {root}); only "
                               f"{', '.join(sorted(ROOTED))} take one")
    if world is not None and root >= world:
        what = "peer" if kind in P2P else "root"
        raise OperationRefused(f"{what} {root} is not a rank of this job of {world} ranks; use "
                               f"0..{world - 1}")


def check_on_job(call: tuple[str, str, int], dtype: np.dtype, elements: int, world: int,
                 collective: str, laid_out_for: int | None = None) -> None:
    """OperationRefused unless a job of `world` ranks running `collective` can serve the
    (kind, op, root) call on a work buffer of `elements` elements that the client laid out
    for `laid_out_for` ranks (None: it did not say)."""
    kind, op, root = call
    check_call(kind, op, root, dtype, world)
    if laid_out_for is not None and laid_out_for != world:
        raise OperationRefused(f"the client laid out its {kind} buffer for {laid_out_for} ranks; "
                               f"the job has {world}: ask for the world again (AgentClient "
                               "does, and calls once more)")
    refusal = optinc_refusal((kind, op, root)) if collective == "optinc" else ""
    if refusal:
        raise OperationRefused(refusal)
    blocks = work_blocks(kind, world)
    if elements % blocks:
        raise OperationRefused(f"{kind} on {world} ranks needs a work buffer of {blocks} equal "
                               f"blocks; {elements} elements do not split so: use "
                               "oddl.agents.client.agent_client.AgentClient, which lays it out")


def optinc_refusal(call: tuple[str, str, int]) -> str:
    """Why OptINC cannot run this call ("" if it can): the device averages in the network."""
    kind, op, _root = call
    if kind == ALL_REDUCE and op == "sum":
        return ""
    return (f"optinc cannot run {describe(*call)}: the OptINC device averages the uploads in "
            "the network (it sums, then every node scales), so it serves the summed all-reduce "
            "only; submit a ring or halving-doubling job for other ops and collectives")


def describe(kind: str, op: str, root: int) -> str:
    """How a call names itself in an error ("all_reduce max", "broadcast from rank 2")."""
    if kind in REDUCING:
        return f"{kind} {op}"
    if kind in ROOTED:
        return f"{kind} root {root}"
    if kind in P2P:
        return ("recv from any rank" if kind == "recv_any"
                else f"{kind} {'to' if kind == 'send' else 'from'} rank {root}")
    return kind


def call_mismatch(job_id: str, seq: int, calls: dict[str, tuple[str, str, int]]) -> str:
    """Why collective `seq` cannot run when the ranks made these (kind, op, root) calls
    ("" if they agree)."""
    if len(set(calls.values())) <= 1:
        return ""
    detail = ", ".join(f"{node}: {describe(*c)}" for node, c in sorted(calls.items()))
    return (f"collective {seq} of job {job_id} refused: the ranks made different calls "
            f"({detail}); every rank must make the same collective with the same op and root "
            "in the same order, so nothing was run")
