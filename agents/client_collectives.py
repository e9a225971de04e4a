"""The native collectives on the training process's side: each lays out its work buffer
(`common.collective_kinds`), has the agent run it (`AgentClient.call_collective`) and reads
its result from it.

The work buffer lives in the client's shared-memory bucket when the agent can reach it, so it
crosses no socket; an `out` that is itself a `shared_array()` of the work buffer's shape is
used as the work buffer (no copy of the result). Results are never views of the bucket (the
next call reuses it) unless the caller handed that memory in. `root` and block indices are
job ranks, the job's node order. Also the helpers that drive every rank at once in tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from agents.client import AgentClient

Opts = dict[str, Any]
"""job, step and timeout_s of one call (`AgentClient.call_collective`)."""


def _work(client: AgentClient, shape: tuple[int, ...], dtype: np.dtype,
          out: np.ndarray | None = None) -> np.ndarray:
    """A work buffer of `shape`: `out` when the agent reaches it already (the bucket, or
    adopted memory), else in the bucket when shared memory is on, else plain memory."""
    if out is not None and out.shape == shape and out.dtype == dtype and out.flags.c_contiguous \
            and client.holds(out):
        return out
    if client.shared_memory:
        return client.shared_array(shape, dtype)
    return np.empty(shape, dtype)


def _input(client: AgentClient, array: Any) -> np.ndarray:
    """The caller's array, contiguous and never in the bucket (a new work buffer may replace
    the bucket, and the collective writes the work buffer)."""
    a = np.ascontiguousarray(array)
    return a.copy() if client.in_bucket(a) else a


def _check_out(out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype, what: str
               ) -> None:
    """ValueError, before anything runs, unless `out` fits the result."""
    if out is not None and (out.shape != shape or out.dtype != dtype
                            or not out.flags.writeable):
        raise ValueError(f"out of {what} must be a writable {dtype}{list(shape)} array, not "
                         f"{out.dtype}{list(out.shape)}")


def _result(client: AgentClient, part: np.ndarray, out: np.ndarray | None,
            what: str) -> np.ndarray:
    """`part` of a work buffer, written into `out` or as an array of its own."""
    if out is not None:
        _check_out(out, part.shape, part.dtype, what)
        if not np.shares_memory(out, part):
            np.copyto(out, part)
        return out
    return part.copy() if client.in_bucket(part) else part


def _blocks(array: np.ndarray, world: int, what: str) -> None:
    if array.ndim == 0 or array.shape[0] != world:
        raise ValueError(f"{what} takes an array of shape (world, ...) with world = {world} "
                         f"blocks, one per rank; got shape {list(array.shape)}")


def all_gather(client: AgentClient, array: Any, out: np.ndarray | None, opts: Opts
               ) -> np.ndarray:
    """Every rank's `array` stacked in rank order: shape (world, *array.shape)."""
    a = _input(client, array)
    rank, world = client.world(opts.get("job"))
    _check_out(out, (world, *a.shape), a.dtype, "all_gather")
    work = _work(client, (world, *a.shape), a.dtype, out)
    work[rank] = a
    res = client.call_collective(work, "all_gather", world=world, **opts)
    return _result(client, res.reshape(work.shape), out, "all_gather")


def reduce_scatter(client: AgentClient, array: Any, op: str, out: np.ndarray | None,
                   opts: Opts) -> np.ndarray:
    """Block `rank` of the elementwise `op` over every rank's (world, ...) `array`."""
    a = _input(client, array)
    rank, world = client.world(opts.get("job"))
    _blocks(a, world, "reduce_scatter")
    _check_out(out, a.shape[1:], a.dtype, "reduce_scatter")
    work = _work(client, a.shape, a.dtype)
    np.copyto(work, a)
    res = client.call_collective(work, "reduce_scatter", op=op, world=world, **opts)
    return _result(client, res.reshape(a.shape)[rank], out, "reduce_scatter")


def broadcast(client: AgentClient, array: np.ndarray, root: int, opts: Opts) -> np.ndarray:
    """Rank `root`'s `array` on every rank: in place when `array` is writable."""
    if isinstance(array, np.ndarray) and array.flags.c_contiguous and array.flags.writeable:
        return client.call_collective(array, "broadcast", root=root, out=array, **opts)
    res = client.call_collective(np.array(array), "broadcast", root=root, **opts)
    if isinstance(array, np.ndarray) and array.flags.writeable:  # strided: written back
        array[...] = res
        return array
    return res


def all_to_all(client: AgentClient, array: Any, out: np.ndarray | None, opts: Opts
               ) -> np.ndarray:
    """Block j of `array` (world, ...) to rank j; out[i] came from rank i."""
    a = _input(client, array)
    rank, world = client.world(opts.get("job"))
    _blocks(a, world, "all_to_all")
    _check_out(out, a.shape, a.dtype, "all_to_all")
    work = _work(client, (2 * world, *a.shape[1:]), a.dtype)
    work[:world] = a
    work[world + rank] = a[rank]  # its own block stays here
    res = client.call_collective(work, "all_to_all", world=world, **opts)
    return _result(client, res.reshape(work.shape)[world:], out, "all_to_all")


def gather(client: AgentClient, array: Any, root: int, out: np.ndarray | None, opts: Opts
           ) -> np.ndarray | None:
    """Every rank's `array` stacked at `root` (shape (world, *array.shape)); None elsewhere."""
    a = _input(client, array)
    rank, world = client.world(opts.get("job"))
    _check_out(out if rank == root else None, (world, *a.shape), a.dtype, "gather")
    work = _work(client, (world, *a.shape), a.dtype, out if rank == root else None)
    work[rank] = a
    res = client.call_collective(work, "gather", root=root, world=world, **opts)
    return _result(client, res.reshape(work.shape), out, "gather") if rank == root else None


def scatter(client: AgentClient, array: Any, root: int, out: np.ndarray | None,
            opts: Opts) -> np.ndarray:
    """Block `rank` of the root's (world, ...) `array`. Other ranks pass None and `out` (or
    an array of the root's shape and dtype)."""
    rank, world = client.world(opts.get("job"))
    if array is not None:
        a = _input(client, array)
        _blocks(a, world, "scatter")
        shape, dtype = a.shape[1:], a.dtype
    elif rank == root:
        raise ValueError(f"scatter: the root (rank {root}) passes the (world, ...) array")
    elif out is None:
        raise ValueError("scatter: a rank other than the root passes out= (its block's shape "
                         "and dtype) or an array of the root's shape")
    else:
        shape, dtype = out.shape, out.dtype
    _check_out(out, shape, dtype, "scatter")
    work = _work(client, (world, *shape), dtype)
    if rank == root:
        np.copyto(work, a)
    res = client.call_collective(work, "scatter", root=root, world=world, **opts)
    return _result(client, res.reshape(work.shape)[rank], out, "scatter")


# ---- every rank at once (tests, benchmarks) ------------------------------------------------


def collective_all(clients: Sequence[AgentClient],
                   call: Callable[[AgentClient, int], Any]) -> tuple[float, list[Any]]:
    """Run `call(client, rank)` on every client at once (one thread each, released
    together). Returns the wall time from the common start to the last result, and per
    client its result or the exception it raised."""
    outs: list[Any] = [None] * len(clients)
    start = threading.Barrier(len(clients) + 1)

    def run(r: int) -> None:
        start.wait()
        try:
            outs[r] = call(clients[r], r)
        except Exception as exc:  # handed back to the caller
            outs[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(clients))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, outs


def allreduce_all(clients: Sequence[AgentClient], arrays: Sequence[np.ndarray], *,
                  inplace: bool = False, step: int | None = None, op: str = "sum"
                  ) -> tuple[float, list[Any]]:
    """Call allreduce on every client at once; with `inplace` each result is written into its
    input array, as gloo does; `step` numbers the call on every client (default: each
    client's own count). Returns (wall time, per client its result or exception)."""
    return collective_all(clients, lambda c, r: c.allreduce(
        arrays[r], out=arrays[r] if inplace else None, step=step, op=op))
