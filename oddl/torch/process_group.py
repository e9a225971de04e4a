# mypy: disable-error-code="override"
# (c10d's ProcessGroup stubs overload its methods; the backend API calls them with lists)
"""The `oddl` backend's process group: torch.distributed's view of the optical testbed.

Each collective of the world group is the agent's native collective of the same kind on the
job (oddl.torch.native); send and recv are flows on their own circuits
(oddl.agents.point_to_point); a subgroup's calls are flows among its members
(oddl.torch.flow_group). PREMUL_SUM fails with `UnsupportedCollective`. Calls run on one FIFO
worker thread per process (shared by every oddl group), so collectives reach the agent in the
order the script issued them, as c10d requires; receives run on lanes of their own. Inside
`torch.compile`d code every method runs eagerly (`oddl.torch.eager`).
`oddl.torch.backend` creates and registers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from oddl.common.errors import CollectiveError
from oddl.torch import native
from oddl.torch import trace as torch_trace
from oddl.torch.all_to_all import all_to_all, all_to_all_even
from oddl.torch.channel import Channel, FutureWork, UnsupportedCollective, count
from oddl.torch.dtypes import check_reduction
from oddl.torch.eager import eager_under_compile
from oddl.torch.timeouts import DEFAULT_TIMEOUT_S, bounded, call_timeout_s

BACKEND = "oddl"


@eager_under_compile
class OddlProcessGroup(dist.ProcessGroup):
    """torch.distributed's view of the optical testbed (see the module docstring)."""

    def __init__(self, rank: int, world: int, channel: Channel, fallback: Any = None,
                 name: str = "", to_job: list[int] | None = None, session: str = "",
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__(rank, world)  # type: ignore[call-arg]  # the (rank, size) constructor
        self._rank, self._world = rank, world
        self._timeout_s = timeout_s
        """Bounds each call (`oddl.torch.timeouts`): the group's timeout."""
        self._channel = channel
        self._fallback = fallback
        self._name = name
        self._ranks = native.Ranks(to_job if to_job is not None else list(range(world)))
        self._session = session
        """This group's point-to-point session: its flows pair only with its own."""

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return BACKEND

    def getGroupName(self) -> str:  # noqa: N802
        """c10d names only its own backends; DeviceMesh (fully_shard) looks groups up by it."""
        return self._name

    def getGroupDesc(self) -> str:  # noqa: N802
        return f"oddl:{self._name}"

    # -- plumbing --
    def _bounded(self, kind: str, fn: Callable[..., Any], opts: Any = None,
                 channel: Any = None) -> Callable[..., Any]:
        return bounded(channel, f"process group {self._name!r} of {self._world} ranks (oddl)",
                       kind, call_timeout_s(opts, self._timeout_s), fn)

    def _work(self, kind: str, fn: Callable[[], Any], opts: Any = None) -> Any:
        inline = opts is not None and not getattr(opts, "asyncOp", True)
        fn = self._bounded(kind, fn, opts, self._channel)
        with torch_trace.call(self, kind, fn) as traced:  # ODDL_TRACE_DIR, torch.profiler
            return FutureWork(self._channel.submit(kind, traced, inline))

    _op = staticmethod(native.reduce_name)

    def _root(self, root: int, what: str) -> int:
        """`root`, refused (before anything is sent) unless it is a rank of this group."""
        if not 0 <= root < self._world:
            raise UnsupportedCollective(f"{what}: root {root} is not a rank of this group of "
                                        f"{self._world} (0..{self._world - 1})")
        return root

    # -- reductions --
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Each tensor reduced on its own, in place (a list is c10d's coalesced form)."""
        opts = opts or dist.AllreduceOptions()
        name = self._op("all_reduce", opts)

        def run() -> list[torch.Tensor]:
            for t in tensors:  # every tensor checked before the first is sent
                check_reduction(t, name, "all_reduce", self._fallback is not None)
            for t in tensors:
                native.reduce_(self._channel, t, name, self._world, "all_reduce",
                               self._fallback)
            return tensors
        return self._work("all_reduce", run, opts)

    allreduce_coalesced = allreduce

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """An all-reduce: the root gets the result as gloo's does (the others get it too)."""
        opts = opts or dist.ReduceOptions()
        name = self._op("reduce", opts)

        def run() -> list[torch.Tensor]:
            self._root(opts.rootRank, "reduce")
            for t in tensors:
                check_reduction(t, name, "reduce", self._fallback is not None)
            for t in tensors:
                native.reduce_(self._channel, t, name, self._world, "reduce", self._fallback)
            return tensors
        return self._work("reduce", run, opts)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        opts = opts or dist.ReduceScatterOptions()
        name = self._op("reduce_scatter", opts)

        def run() -> list[torch.Tensor]:
            for out, parts in zip(outputs, inputs, strict=True):
                if len(parts) != self._world or any(p.numel() != out.numel() for p in parts):
                    raise UnsupportedCollective(
                        f"reduce_scatter: {len(parts)} inputs of {[p.numel() for p in parts]} "
                        f"elements for a world of {self._world} and an output of "
                        f"{out.numel()}")
                native.reduce_scatter(self._channel, self._ranks,
                                      torch.stack([p.reshape(-1) for p in parts]), name, out,
                                      "reduce_scatter")
            return outputs
        return self._work("reduce_scatter", run, opts)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                             opts: Any = None) -> Any:
        opts = opts or dist.ReduceScatterOptions()
        name = self._op("reduce_scatter_tensor", opts)

        def run() -> list[torch.Tensor]:
            if input.numel() != output.numel() * self._world:
                raise UnsupportedCollective(f"reduce_scatter_tensor: input has {input.numel()} "
                                            f"elements, not world × {output.numel()}")
            native.reduce_scatter(self._channel, self._ranks, input.reshape(self._world, -1),
                                  name, output, "reduce_scatter_tensor")
            return [output]
        return self._work("reduce_scatter_tensor", run, opts)

    # -- byte movers --
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        root = (opts or dist.BroadcastOptions()).rootRank

        def run() -> list[torch.Tensor]:
            self._root(root, "broadcast")
            for t in tensors:
                native.broadcast(self._channel, self._ranks, t, root)
            return tensors
        return self._work("broadcast", run, opts)

    def _gathered(self, flat_in: np.ndarray, what: str) -> np.ndarray:
        return native.all_gather(self._channel, self._ranks, flat_in, what)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> Any:
        def run() -> list[list[torch.Tensor]]:
            for outs, t in zip(outputs, inputs, strict=True):
                if len(outs) != self._world:
                    raise UnsupportedCollective(f"all_gather: {len(outs)} outputs for a world "
                                                f"of {self._world}")
                if native.all_gather_apart(self._channel, self._ranks, outs, t, "all_gather"):
                    continue
                total = self._gathered(native.raw(t, "all_gather").reshape(-1), "all_gather")
                for r, o in enumerate(outs):
                    native.store(o, total[r])
            return outputs
        return self._work("all_gather", run, opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                        opts: Any = None) -> Any:
        def run() -> list[torch.Tensor]:
            if output.numel() != input.numel() * self._world:
                raise UnsupportedCollective(f"all_gather_into_tensor: output has "
                                            f"{output.numel()} elements, not world × "
                                            f"{input.numel()}")
            native.all_gather_into(self._channel, self._ranks, output, input,
                                   "all_gather_into_tensor")
            return [output]
        return self._work("all_gather_into_tensor", run, opts)

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """One gather of the inputs' concatenation; outputs[r][i] receives rank r's input i."""
        def run() -> list[torch.Tensor]:
            if len(outputs) != self._world:
                raise UnsupportedCollective(f"all_gather_coalesced: {len(outputs)} output "
                                            f"lists for a world of {self._world}")
            flat = np.concatenate([native.raw(t, "all_gather_coalesced").reshape(-1)
                                   for t in inputs])
            total = self._gathered(flat, "all_gather_coalesced")
            for r, outs in enumerate(outputs):
                offset = 0
                for o in outs:
                    native.store(o, total[r, offset:offset + o.numel()])
                    offset += o.numel()
            return [o for outs in outputs for o in outs]
        return self._work("all_gather_coalesced", run, opts)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                      output_split_sizes: list[int], input_split_sizes: list[int],
                      opts: Any = None) -> Any:
        what = "all_to_all_single"

        def run() -> list[torch.Tensor]:
            if not output_split_sizes and not input_split_sizes:
                all_to_all_even(self._channel, self._ranks, self._rank, output, input, what)
            else:
                all_to_all(self._channel, self._ranks, self._rank,
                           native.rows(output, output_split_sizes, self._world, what),
                           native.rows(input, input_split_sizes, self._world, what), what)
            return [output]
        return self._work(what, run, opts)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> Any:
        def run() -> list[torch.Tensor]:
            all_to_all(self._channel, self._ranks, self._rank, list(outputs), list(inputs),
                       "all_to_all")
            return outputs
        return self._work("all_to_all", run, opts)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> Any:
        root = (opts or dist.GatherOptions()).rootRank

        def run() -> list[torch.Tensor]:
            outs = outputs[0] if self._rank == self._root(root, "gather") else []
            if self._rank == root and len(outs) != self._world:
                raise UnsupportedCollective(f"gather: {len(outs)} outputs at the root for a "
                                            f"world of {self._world}")
            native.gather(self._channel, self._ranks, self._rank, inputs[0], root, outs)
            return outs
        return self._work("gather", run, opts)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any = None) -> Any:
        root = (opts or dist.ScatterOptions()).rootRank

        def run() -> list[torch.Tensor]:
            ins = inputs[0] if self._rank == self._root(root, "scatter") else []
            if self._rank == root and len(ins) != self._world:
                raise UnsupportedCollective(f"scatter: {len(ins)} inputs at the root for a "
                                            f"world of {self._world}")
            native.scatter(self._channel, self._ranks, self._rank, outputs[0], root, ins)
            return outputs
        return self._work("scatter", run, opts)

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

    # -- point-to-point: flows on their own circuits (oddl.agents.point_to_point) --
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        """Each tensor as a flow to `dst` (in order with this rank's collectives)."""
        def run() -> list[torch.Tensor]:
            for t in tensors:
                native.send(self._channel, self._ranks, t, dst, (tag, self._session),
                            self._timeout_s)
            return tensors
        with torch_trace.call(self, "send", self._bounded("send", run)) as traced:
            return FutureWork(self._channel.submit("send", traced, collective=False))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        """The next flows from `src` on `tag` into each tensor (on the receives' thread)."""
        def run(client: Any) -> list[torch.Tensor]:
            for t in tensors:
                native.recv(client, self._channel.job, self._ranks, t, src,
                            (tag, self._session), self._timeout_s)
            return tensors
        with torch_trace.call(self, "recv", lambda: None):
            return FutureWork(self._channel.submit_receive("recv", self._bounded("recv", run)))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        """The first flow from any rank on `tag` into the tensor; the work names its sender
        (`_source_rank`, as c10d asks)."""
        if len(tensors) != 1:
            raise UnsupportedCollective(f"recv from any source takes one tensor, not "
                                        f"{len(tensors)}")
        sender: list[int] = []  # filled on the receives' thread, maybe before the work exists

        def run(client: Any) -> list[torch.Tensor]:
            sender.append(native.recv_any(client, self._channel.job, self._ranks, tensors[0],
                                          (tag, self._session), self._timeout_s))
            return tensors
        with torch_trace.call(self, "recv", lambda: None):
            return FutureWork(self._channel.submit_receive("recv", self._bounded("recv", run)),
                              sender)

    # torch 2.13 calls these names; older releases the underscored ones above
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base  # type: ignore[assignment]
    all_to_all_single = alltoall_base  # type: ignore[assignment]

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> Any:
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else self.barrier()

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Any:
        works = [self._reduce_scatter_base(o, i, opts)
                 for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else self.barrier()
