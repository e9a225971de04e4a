"""The native collectives on the training process's side: each lays out its work buffer
(`oddl.common.collective_kinds`), has the agent run it (`AgentClient.call_collective`) and reads
its result from it.

The work buffer lives in the client's shared-memory bucket when the agent can reach it, so it
crosses no socket; an `out` that is itself a `shared_array()` of the work buffer's shape is
used as the work buffer (no copy of the result). Results are never views of the bucket (the
next call reuses it) unless the caller handed that memory in. `root` and block indices are
job ranks, the job's node order. What these need of the client is `CollectiveClient`
(`oddl.agents.client.agent_client.AgentClient` is one); driving every rank at once is `oddl.agents.client.every_rank`.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

Opts = dict[str, Any]
"""job, step and timeout_s of one call (`CollectiveClient.call_collective`)."""


class CollectiveClient(Protocol):
    """What the native collectives use of the client: its bucket and its agent's collective
    call (`oddl.agents.client.agent_client.AgentClient` is one)."""

    @property
    def shared_memory(self) -> bool:
        """Whether the client puts work buffers in shared memory."""
        ...

    def shared_array(self, shape: tuple[int, ...] | int, dtype: Any = ...) -> np.ndarray:
        """An array in the client's shared-memory bucket."""
        ...

    def in_bucket(self, array: np.ndarray) -> bool:
        """Whether `array` lives in the client's bucket."""
        ...

    def holds(self, array: np.ndarray) -> bool:
        """Whether the agent reaches `array` where it is."""
        ...

    def world(self, job: str | None = None) -> tuple[int, int]:
        """(this node's rank, the number of ranks) of the job."""
        ...

    def call_collective(self, array: np.ndarray, kind: str, *, op: str = "sum", root: int = 0,
                        world: int | None = None, job: str | None = None,
                        step: int | None = None, out: np.ndarray | None = None,
                        timeout_s: float | None = None) -> np.ndarray:
        """Run collective `kind` on the work buffer `array`."""
        ...


def options(job: str | None, step: int | None, timeout_s: float | None) -> Opts:
    """What every collective passes on to `call_collective` beside its own arguments."""
    return {"job": job, "step": step, "timeout_s": timeout_s}


def _work(client: CollectiveClient, shape: tuple[int, ...], dtype: np.dtype,
          out: np.ndarray | None = None) -> np.ndarray:
    """A work buffer of `shape`: `out` when the agent reaches it already (the bucket, or
    adopted memory), else in the bucket when shared memory is on, else plain memory."""
    if out is not None and out.shape == shape and out.dtype == dtype and out.flags.c_contiguous \
            and client.holds(out):
        return out
    if client.shared_memory:
        return client.shared_array(shape, dtype)
    return np.empty(shape, dtype)


def _input(client: CollectiveClient, array: Any) -> np.ndarray:
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


def _result(client: CollectiveClient, part: np.ndarray, out: np.ndarray | None,
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


def all_gather(client: CollectiveClient, array: Any, out: np.ndarray | None, opts: Opts
               ) -> np.ndarray:
    """Every rank's `array` stacked in rank order: shape (world, *array.shape)."""
    a = _input(client, array)
    rank, world = client.world(opts.get("job"))
    _check_out(out, (world, *a.shape), a.dtype, "all_gather")
    work = _work(client, (world, *a.shape), a.dtype, out)
    work[rank] = a
    res = client.call_collective(work, "all_gather", world=world, **opts)
    return _result(client, res.reshape(work.shape), out, "all_gather")


def reduce_scatter(client: CollectiveClient, array: Any, op: str, out: np.ndarray | None,
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


def broadcast(client: CollectiveClient, array: np.ndarray, root: int, opts: Opts) -> np.ndarray:
    """Rank `root`'s `array` on every rank: in place when `array` is writable."""
    if isinstance(array, np.ndarray) and array.flags.c_contiguous and array.flags.writeable:
        return client.call_collective(array, "broadcast", root=root, out=array, **opts)
    res = client.call_collective(np.array(array), "broadcast", root=root, **opts)
    if isinstance(array, np.ndarray) and array.flags.writeable:  # strided: written back
        array[...] = res
        return array
    return res


def all_to_all(client: CollectiveClient, array: Any, out: np.ndarray | None, opts: Opts
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


def gather(client: CollectiveClient, array: Any, root: int, out: np.ndarray | None, opts: Opts
           ) -> np.ndarray | None:
    """Every rank's `array` stacked at `root` (shape (world, *array.shape)); None elsewhere."""
    a = _input(client, array)
    rank, world = client.world(opts.get("job"))
    _check_out(out if rank == root else None, (world, *a.shape), a.dtype, "gather")
    work = _work(client, (world, *a.shape), a.dtype, out if rank == root else None)
    work[rank] = a
    res = client.call_collective(work, "gather", root=root, world=world, **opts)
    return _result(client, res.reshape(work.shape), out, "gather") if rank == root else None


def scatter(client: CollectiveClient, array: Any, root: int, out: np.ndarray | None,
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
