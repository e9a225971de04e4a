"""Parameter-server all-reduce, for comparison: every worker pushes, the server pulls back.

Two steps over whole buffers: every worker sends its buffer to the server (REDUCE), then the
server sends the sum to every worker (COPY). The server's one receiver and one transmitter
make the scheduler split each step into N−1 rounds.
"""

from __future__ import annotations

import operator

import numpy as np

from oddl.common.errors import PlanError
from oddl.controller.scheduling.plan import Op, Plan, Step, read_only
from oddl.controller.scheduling.registry import check_sizes, register_collective


@register_collective("parameter-server")
def parameter_server_allreduce(n_ranks: int, n_elems: int, *, server: int = 0) -> Plan:
    """Push every worker's buffer to rank `server` (REDUCE), then copy the sum back (COPY)."""
    n, n_elems = check_sizes("parameter-server", n_ranks, n_elems)
    try:
        s = operator.index(server)
    except TypeError:
        raise PlanError(f"parameter-server server must be a rank number; got {server!r}") from None
    if not 0 <= s < n:
        raise PlanError(f"parameter-server server rank {s} is not a rank of {n}; use 0..{n - 1}")
    if n == 1 or n_elems == 0:
        return Plan("parameter-server", n, n_elems, ())
    workers = read_only(np.delete(np.arange(n, dtype=np.int64), s))
    hub = read_only(np.full(n - 1, s, dtype=np.int64))
    zeros = read_only(np.zeros(n - 1, dtype=np.int64))
    whole = read_only(np.full(n - 1, n_elems, dtype=np.int64))
    steps = (
        Step(workers, hub, zeros, whole, Op.REDUCE, "push"),
        Step(hub, workers, zeros, whole, Op.COPY, "pull"),
    )
    return Plan("parameter-server", n, n_elems, steps)
