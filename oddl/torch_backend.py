# mypy: disable-error-code="override"
# (c10d's ProcessGroup stubs overload its methods; the backend API calls them with lists)
"""A `torch.distributed` backend named ``oddl``: every collective crosses the optical circuits.

    import oddl.torch_backend  # registers the backend
    dist.init_process_group("oddl")  # under torchrun; ODDL_LOCAL_API names the agent

Each collective of the world group is carried by the local agent's job (docs/torch-backend.md
says as what, and at how many bytes); what the job cannot carry fails with
`UnsupportedCollective` naming ``ODDL_TORCH_FALLBACK=gloo``, which routes it to a gloo group
beside this one, one tensor per call, counted apart in `counters()`. Subgroups smaller than the
world are served by gloo (oddl.torch_subgroup says why), counted and named the same way.

Calls run on one FIFO worker thread per process (shared by every oddl group), so collectives
reach the agent in the order the script issued them, which c10d requires to be the same on
every rank. Only importable where torch is installed (the extra `oddl[torch]`).
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from common.errors import CollectiveError, ConfigError
from oddl.torch_channel import (
    ENV_API,
    ENV_FALLBACK,
    ENV_JOB,
    Channel,
    FutureWork,
    UnsupportedCollective,
    as_numpy,
    block_exchange,
    count,
    counters,
    flat_sum,
    joined_channel,
    reset_counters,
)
from oddl.torch_subgroup import GlooServedGroup, allreduce_options, each, gloo_beside

logger = logging.getLogger(__name__)

__all__ = ["BACKEND", "ENV_API", "ENV_FALLBACK", "ENV_JOB", "OddlProcessGroup",
           "UnsupportedCollective", "counters", "create", "register", "reset_counters"]

BACKEND = "oddl"
_SUMS = {dist.ReduceOp.SUM: "SUM", dist.ReduceOp.AVG: "AVG"}
HANDSHAKE_TIMEOUT_S = 60.0


def _reduce_name(opts: Any) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    for known, name in _SUMS.items():
        if op == known:
            return name
    return str(getattr(op, "op", op)).rsplit(".", 1)[-1]


# ---- the process group ---------------------------------------------------------------------

class OddlProcessGroup(dist.ProcessGroup):
    """torch.distributed's view of the optical testbed (see the module docstring)."""

    def __init__(self, rank: int, world: int, channel: Channel, fallback: Any = None,
                 name: str = ""):
        super().__init__(rank, world)  # type: ignore[call-arg]  # the (rank, size) constructor
        self._rank, self._world = rank, world
        self._channel = channel
        self._fallback = fallback
        self._name = name

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return BACKEND

    def getGroupName(self) -> str:  # noqa: N802
        """c10d names only its own backends; DeviceMesh (fully_shard) looks groups up by it."""
        return self._name

    def getGroupDesc(self) -> str:  # noqa: N802
        return f"oddl:{self._name}"

    # -- plumbing --
    def _work(self, kind: str, fn: Callable[[], Any], opts: Any = None) -> Any:
        inline = opts is not None and not getattr(opts, "asyncOp", True)
        return FutureWork(self._channel.submit(kind, fn, inline))

    def _fallback_or_refuse(self, kind: str, reason: str) -> Any:
        if self._fallback is None:
            raise UnsupportedCollective(
                f"{kind}: {reason}; the optical testbed only sums. Set {ENV_FALLBACK}=gloo to "
                "route such calls to a gloo group beside the oddl one (they are counted), or "
                "rewrite the call as a sum")
        return self._fallback

    def _sum_kind(self, kind: str, opts: Any) -> str | None:
        name = _reduce_name(opts)
        if name in ("SUM", "AVG"):
            return name
        self._fallback_or_refuse(f"{kind}({name})", f"reduction {name} is not a sum")
        return None

    def _via_fallback(self, kind: str, tensors: list[torch.Tensor],
                      call: Callable[[Any], Any], opts: Any = None) -> Any:
        fb = self._fallback
        nbytes = sum(t.numel() * t.element_size() for t in tensors)

        def run() -> list[torch.Tensor]:
            call(fb).wait()
            count(kind, fallback=nbytes)
            return tensors
        return self._work(kind, run, opts)

    # -- collectives --
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts or dist.AllreduceOptions()
        name = self._sum_kind("all_reduce", opts)
        if name is None:
            return self._via_fallback(f"all_reduce({_reduce_name(opts)})", tensors,
                                      lambda fb: each(fb.allreduce, tensors,
                                                       allreduce_options(opts)), opts)
        world = self._world

        def run() -> list[torch.Tensor]:
            for t in tensors:
                if name == "AVG" and not t.is_floating_point():
                    raise UnsupportedCollective(f"all_reduce(AVG) of {t.dtype}: average "
                                                "floating-point tensors (or SUM the integers)")
                a = as_numpy(t, "all_reduce")
                if t.is_contiguous():
                    self._channel.sum_(a)  # in place, in the tensor's own memory
                else:  # `a` is a contiguous copy
                    t.copy_(torch.from_numpy(self._channel.sum_(a)).view_as(t))
                if name == "AVG":
                    t.div_(world)
                count(f"all_reduce({name})", optical=a.nbytes)
            return tensors
        return self._work("all_reduce", run, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        root = (opts or dist.BroadcastOptions()).rootRank

        def run() -> list[torch.Tensor]:
            for t in tensors:
                a = as_numpy(t, "broadcast").copy()
                if self._rank != root:
                    a[...] = 0
                t.copy_(torch.from_numpy(self._channel.sum_(a)).view_as(t))
                count("broadcast", optical=a.nbytes)
            return tensors
        return self._work("broadcast", run, opts)

    def _gather_into(self, flat_in: torch.Tensor, what: str) -> np.ndarray:
        """The world-sized sum in which slot r holds rank r's `flat_in`."""
        a = as_numpy(flat_in, what).reshape(-1)
        buf = np.zeros(a.size * self._world, dtype=a.dtype)
        buf[self._rank * a.size:(self._rank + 1) * a.size] = a
        count(what, optical=buf.nbytes)
        return self._channel.sum_(buf)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> Any:
        def run() -> list[list[torch.Tensor]]:
            for outs, t in zip(outputs, inputs, strict=True):
                if len(outs) != self._world:
                    raise UnsupportedCollective(f"all_gather: {len(outs)} outputs for a world "
                                                f"of {self._world}")
                total = self._gather_into(t, "all_gather").reshape(self._world, -1)
                for r, o in enumerate(outs):
                    o.copy_(torch.from_numpy(total[r]).view_as(o))
            return outputs
        return self._work("all_gather", run, opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                        opts: Any = None) -> Any:
        def run() -> list[torch.Tensor]:
            if output.numel() != input.numel() * self._world:
                raise UnsupportedCollective(f"all_gather_into_tensor: output has "
                                            f"{output.numel()} elements, not world × "
                                            f"{input.numel()}")
            total = self._gather_into(input, "all_gather_into_tensor")
            output.copy_(torch.from_numpy(total).view_as(output))
            return [output]
        return self._work("all_gather_into_tensor", run, opts)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        opts = opts or dist.ReduceScatterOptions()
        name = self._sum_kind("reduce_scatter", opts)
        if name is None:
            return self._via_fallback(f"reduce_scatter({_reduce_name(opts)})", outputs,
                                      lambda fb: fb.reduce_scatter(outputs, inputs, opts), opts)

        def run() -> list[torch.Tensor]:
            for out, parts in zip(outputs, inputs, strict=True):
                total = flat_sum(self._channel, parts, "reduce_scatter")
                count(f"reduce_scatter({name})", optical=total.nbytes)
                mine = total.reshape(self._world, -1)[self._rank]
                self._store_reduced(out, mine, name)
            return outputs
        return self._work("reduce_scatter", run, opts)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                             opts: Any = None) -> Any:
        opts = opts or dist.ReduceScatterOptions()
        name = self._sum_kind("reduce_scatter_tensor", opts)
        if name is None:
            return self._via_fallback(f"reduce_scatter_tensor({_reduce_name(opts)})", [output],
                                      lambda fb: fb._reduce_scatter_base(output, input, opts), opts)

        def run() -> list[torch.Tensor]:
            if input.numel() != output.numel() * self._world:
                raise UnsupportedCollective(f"reduce_scatter_tensor: input has {input.numel()} "
                                            f"elements, not world × {output.numel()}")
            total = flat_sum(self._channel, [input], "reduce_scatter_tensor")
            count(f"reduce_scatter_tensor({name})", optical=total.nbytes)
            self._store_reduced(output, total.reshape(self._world, -1)[self._rank], name)
            return [output]
        return self._work("reduce_scatter_tensor", run, opts)

    def _store_reduced(self, out: torch.Tensor, part: np.ndarray, name: str) -> None:
        value = torch.from_numpy(part).view_as(out)
        if name == "AVG":
            if not out.is_floating_point():
                raise UnsupportedCollective(f"reduce_scatter(AVG) of {out.dtype}: average "
                                            "floating-point tensors")
            value = value / self._world
        out.copy_(value)

    def barrier(self, opts: Any = None) -> Any:
        def run() -> list[torch.Tensor]:
            one = np.ones(1, dtype=np.int32)
            got = int(self._channel.sum_(one)[0])
            if got != self._world:
                raise CollectiveError(f"barrier: {got} nodes answered, the world is "
                                      f"{self._world}")
            count("barrier", optical=one.nbytes)
            return []
        return self._work("barrier", run, opts)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                      output_split_sizes: list[int], input_split_sizes: list[int],
                      opts: Any = None) -> Any:
        world = self._world

        def splits(t: torch.Tensor, sizes: list[int], what: str) -> list[torch.Tensor]:
            if not sizes:
                if t.shape[0] % world:
                    raise UnsupportedCollective(f"all_to_all_single: {what} has {t.shape[0]} "
                                                f"rows, not a multiple of the world {world}")
                sizes = [t.shape[0] // world] * world
            return list(torch.split(t, list(sizes), dim=0))

        def run() -> list[torch.Tensor]:
            block_exchange(self._channel, self._rank, world,
                           splits(output, output_split_sizes, "output"),
                           splits(input, input_split_sizes, "input"), "all_to_all_single")
            return [output]
        return self._work("all_to_all_single", run, opts)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> Any:
        def run() -> list[torch.Tensor]:
            block_exchange(self._channel, self._rank, self._world, list(outputs), list(inputs),
                           "all_to_all")
            return outputs
        return self._work("all_to_all", run, opts)

    # -- what the optics do not carry: the fallback, or a clear error --
    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """SUM/AVG as an all-reduce (every rank gets the result, the root as gloo's)."""
        opts = opts or dist.ReduceOptions()
        if _reduce_name(opts) in ("SUM", "AVG"):
            ar = dist.AllreduceOptions()
            ar.reduceOp, ar.asyncOp = opts.reduceOp, getattr(opts, "asyncOp", True)
            return self.allreduce(tensors, ar)
        name = f"reduce({_reduce_name(opts)})"
        self._fallback_or_refuse(name, f"reduction {_reduce_name(opts)} is not a sum")
        return self._via_fallback(name, tensors, lambda fb: each(fb.reduce, tensors, opts), opts)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> Any:
        self._fallback_or_refuse("gather", "gather is not implemented over the optics (use "
                                 "all_gather, which is)")
        return self._via_fallback("gather", inputs,
                                  lambda fb: fb.gather(outputs, inputs, opts), opts)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any = None) -> Any:
        self._fallback_or_refuse("scatter", "scatter is not implemented over the optics (use "
                                 "broadcast, which is)")
        return self._via_fallback("scatter", outputs,
                                  lambda fb: fb.scatter(outputs, inputs, opts), opts)

    def _p2p(self, kind: str, tensors: list[torch.Tensor], call: Callable[[Any], Any]) -> Any:
        fb = self._fallback_or_refuse(kind, "point-to-point transfers do not go over the "
                                      "scheduled circuits")
        count(f"{kind} (fallback)", fallback=sum(t.numel() * t.element_size()
                                                  for t in tensors))
        return call(fb)  # gloo's own work: a receive must not block the collectives' queue

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._p2p("send", tensors, lambda fb: fb.send(tensors, dst, tag))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._p2p("recv", tensors, lambda fb: fb.recv(tensors, src, tag))

    # torch 2.13 calls these names; older releases the underscored ones above
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base  # type: ignore[assignment]
    all_to_all_single = alltoall_base  # type: ignore[assignment]

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Each tensor is reduced on its own (one agent call each), in the list's order."""
        return self.allreduce(tensors, opts)

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """One gather of the inputs' concatenation; outputs[r][i] receives rank r's input i."""
        def run() -> list[torch.Tensor]:
            if len(outputs) != self._world:
                raise UnsupportedCollective(f"all_gather_coalesced: {len(outputs)} output "
                                            f"lists for a world of {self._world}")
            flat = torch.cat([t.reshape(-1) for t in inputs])
            total = self._gather_into(flat, "all_gather_coalesced").reshape(self._world, -1)
            for r, outs in enumerate(outputs):
                offset = 0
                for o in outs:
                    part = total[r, offset:offset + o.numel()]
                    o.copy_(torch.from_numpy(part).view_as(o))
                    offset += o.numel()
            return [o for outs in outputs for o in outs]
        return self._work("all_gather_coalesced", run, opts)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> Any:
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else self.barrier()

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Any:
        works = [self._reduce_scatter_base(o, i, opts)
                 for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else self.barrier()


# ---- creation and registration -------------------------------------------------------------

def create(dist_opts: Any, backend_opts: Any = None) -> dist.ProcessGroup:
    """The creator torch.distributed calls for ``init_process_group("oddl")`` and for each
    ``new_group``: the world's group over the agent's job, a smaller one served by gloo."""
    rank, world = int(dist_opts.group_rank), int(dist_opts.group_size)
    ranks = list(dist_opts.global_ranks_in_group or [])
    timeout = dist_opts.timeout
    timeout_s = (timeout.total_seconds() if isinstance(timeout, datetime.timedelta)
                 else 1800.0)
    name = str(dist_opts.group_id or "")
    if dist.is_initialized() and ranks and len(ranks) != dist.get_world_size():
        gloo = gloo_beside(dist_opts, "oddl-subgroup", rank, world, timeout_s)
        return GlooServedGroup(rank, world, gloo, name, ranks)
    channel = joined_channel(rank, world, timeout_s, HANDSHAKE_TIMEOUT_S)
    fallback = None
    mode = os.environ.get(ENV_FALLBACK, "").strip().lower()
    if mode == "gloo":
        fallback = gloo_beside(dist_opts, "oddl-fallback", rank, world, timeout_s)
    elif mode:
        raise ConfigError(f"{ENV_FALLBACK}={mode!r}: use 'gloo' or leave it unset")
    logger.info("oddl backend: rank %d of %d via agent %s (job %s), fallback %s", rank, world,
                channel.api, channel.job or "its only job", mode or "none")
    return OddlProcessGroup(rank, world, channel, fallback, name)


def register() -> None:
    """Register the backend (done on import; repeating it is harmless)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu"])


register()
