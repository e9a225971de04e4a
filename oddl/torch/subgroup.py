# mypy: disable-error-code="override"
# (c10d's ProcessGroup stubs overload its methods; the backend API calls them with lists)
"""What the oddl backend hands to gloo, and how: subgroups on request, and the fallback's calls
per tensor.

**Subgroups.** `dist.new_group(ranks)` with fewer ranks than the world runs over the optics as
flows among its members (`oddl.torch.flow_group`, decision record 0021). With
``ODDL_TORCH_SUBGROUPS=gloo`` it is a `GlooServedGroup` instead: an oddl-named process group
whose every collective runs on a gloo group of the same ranks over the host network, counted
per kind as ``"<kind> (subgroup, gloo)"`` in `counters()` (`fallback_bytes`), and logged once
at creation naming the ranks.

**Per tensor.** c10d's list forms hand a backend several tensors in one call
(`all_reduce_coalesced`): each must be reduced on its own. gloo's `allreduce` given a list
reduces the list's tensors together (a multi-device call), so the fallback hands gloo one
tensor per call (`each`), never the list.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from oddl.torch.channel import FutureWork, count
from oddl.torch.eager import eager_under_compile

logger = logging.getLogger(__name__)

__all__ = ["GlooServedGroup", "WaitAll", "allreduce_options", "each", "gloo_beside", "nbytes"]

SUBGROUP_TAG = "subgroup, gloo"


def gloo_beside(dist_opts: Any, prefix: str, rank: int, world: int, timeout_s: float) -> Any:
    """A gloo group of the same ranks as the group being created, on its store under `prefix`
    (the group's own store is already apart from every other group's)."""
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, dist_opts.store), rank, world,
                                 datetime.timedelta(seconds=timeout_s))


def nbytes(tensors: Iterable[Any]) -> int:
    """The bytes of the tensors in `tensors`, a tensor or nested lists of them."""
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
        elif isinstance(t, list | tuple):
            total += nbytes(t)
    return total


class WaitAll:
    """Several gloo works waited for as one (what the fallback's `run` waits on)."""

    def __init__(self, works: list[Any]):
        self.works = works

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        return True


def allreduce_options(opts: Any) -> Any:
    """`opts` as gloo's allreduce takes them (it refuses AllreduceCoalescedOptions)."""
    plain = dist.AllreduceOptions()
    plain.reduceOp, plain.timeout = opts.reduceOp, opts.timeout
    return plain


def each(call: Callable[..., Any], tensors: list[torch.Tensor], *rest: Any) -> WaitAll:
    """`call([t], *rest)` for each tensor in turn: one reduction per tensor."""
    return WaitAll([call([t], *rest) for t in tensors])


# our method name -> gloo's, where they differ (torch 2.13 calls the first)
_GLOO_NAME = {"all_gather_single": "_allgather_base",
              "reduce_scatter_single": "_reduce_scatter_base",
              "all_to_all_single": "alltoall_base"}
_FORWARDED = ("allreduce", "broadcast", "allgather", "allgather_coalesced", "_allgather_base",
              "reduce_scatter", "_reduce_scatter_base", "barrier", "alltoall", "alltoall_base",
              "reduce", "gather", "scatter", "send", "recv", "recv_anysource",
              *_GLOO_NAME)


@eager_under_compile
class GlooServedGroup(dist.ProcessGroup):
    """A subgroup of the oddl world, served by a gloo group of its ranks (module docstring)."""

    def __init__(self, rank: int, world: int, gloo: Any, name: str, ranks: list[int]):
        super().__init__(rank, world)  # type: ignore[call-arg]  # the (rank, size) constructor
        self._gloo = gloo
        self._name = name
        if rank == 0:
            logger.warning("oddl backend: the subgroup of ranks %s is served by gloo over the "
                           "host network (ODDL_TORCH_SUBGROUPS=gloo; counted as '(%s)')",
                           ranks, SUBGROUP_TAG)

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return "oddl"

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def getGroupDesc(self) -> str:  # noqa: N802
        return f"oddl-subgroup:{self._name}"

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        count(f"allreduce_coalesced ({SUBGROUP_TAG})", fallback=nbytes(tensors))
        opts = allreduce_options(opts or dist.AllreduceCoalescedOptions())
        return _as_work(each(self._gloo.allreduce, tensors, opts))


def _forward(ours: str) -> Callable[..., Any]:
    theirs = _GLOO_NAME.get(ours, ours)

    def method(self: GlooServedGroup, *args: Any, **kwargs: Any) -> Any:
        given = [*args, *kwargs.values()]  # c10d passes some by keyword (barrier(opts=...))
        count(f"{ours} ({SUBGROUP_TAG})", fallback=nbytes(a for a in given if
                                                         isinstance(a, list | torch.Tensor)))
        return getattr(self._gloo, theirs)(*args, **kwargs)
    method.__name__ = ours
    return method


for _name in _FORWARDED:
    setattr(GlooServedGroup, _name, _forward(_name))


def _as_work(waiting: WaitAll) -> Any:
    """A c10d work that is done once every work in `waiting` is."""
    fut: torch.futures.Future = torch.futures.Future()
    try:
        waiting.wait()
        fut.set_result([])
    except BaseException as exc:  # handed to the caller through the future
        fut.set_exception(exc)
    return FutureWork(fut)
