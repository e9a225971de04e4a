"""A PyTorch DDP communication hook that all-reduces gradient buckets through the local agent.

    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = register(ddp, AgentClient(local_api), world_size=4, verify=True)

Each gradient bucket DDP hands the hook is summed across the job's nodes by the local oddl
agent (over the scheduled optical circuits), divided by the world size and handed back as the
bucket's averaged gradient.

The agent call runs on one worker thread per hook state and the hook returns a future that the
thread completes, so the backward pass goes on computing the gradients of earlier layers while
a bucket is on the optical network (as DDP's own gloo/NCCL hooks do). One thread, not a pool:
the agent numbers the collectives of a job in the order they are called, and every rank must
issue its buckets in the same order (DDP launches them in bucket order on every rank), so the
calls stay first-in first-out; `AgentClient` is not thread-safe either, and only that thread
uses it. `asynchronous=False` runs the call inline instead (for comparison and debugging).

With `verify=True` the hook also all-reduces the same bucket over torch.distributed (gloo), in
float64 together with its absolute values, and fails the bucket (the future raises
`AllreduceMismatch`, so DDP's backward raises) if the optical sum differs from that exact
reduction by more than float summation order allows: (N-1)·eps·Σ|x|.

Only imported where torch is wanted (the optional extra `oddl[torch]`). No
`from __future__ import annotations` here: DDP checks the hook's annotations at run time
(`bucket: dist.GradBucket`, returning `torch.futures.Future[torch.Tensor]`).
"""

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from oddl.agents.client.agent_client import AgentClient
from oddl.common.errors import CollectiveError

logger = logging.getLogger(__name__)

__all__ = ["AllreduceMismatch", "OpticalHookState", "optical_allreduce_hook", "register"]


class AllreduceMismatch(CollectiveError):
    """The optical all-reduce of a bucket differs from the exact reduction."""


class OpticalHookState:
    """The hook's state: the agent client, the world size, the verifier and counters.

    `client` is an `AgentClient` or the address of the local agent API. `process_group` is
    the group the verification all-reduce runs on (default: the default group; a
    `ProcessGroupGloo` backend object works too). Call `close()` when training is done.
    """

    def __init__(self, client: AgentClient | str, world_size: int, verify: bool = False, *,
                 process_group: Any = None, asynchronous: bool = True, job: str | None = None,
                 optinc_bits: int | None = None):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, not {world_size}")
        self.client = AgentClient(client) if isinstance(client, str) else client
        self._owns_client = isinstance(client, str)
        self.world_size = world_size
        self.verify = verify
        self.process_group = process_group
        self.asynchronous = asynchronous
        self.job = job
        self.optinc_bits = optinc_bits
        """Set for an optinc job: the reference is the exact *quantised* mean (× N) that the
        in-network device computes, from every rank's bucket gathered over gloo."""
        self.buckets = 0
        self.bytes = 0
        self.verified = 0
        self.max_error_over_bound = 0.0
        self.allreduce_s: list[float] = []
        self.mismatches: list[str] = []
        self.errors: list[str] = []
        self._failed = ""
        self._lock = threading.Lock()
        self._executor = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="oddl-hook")
                          if asynchronous else None)

    def stats(self) -> dict[str, Any]:
        """Counters for a report: buckets, bytes sent, verification outcome, agent time."""
        with self._lock:
            times = np.array(self.allreduce_s or [0.0])
            return {"buckets": self.buckets, "bytes": self.bytes, "verified": self.verified,
                    "mismatches": list(self.mismatches), "errors": list(self.errors),
                    "max_error_over_bound": self.max_error_over_bound,
                    "allreduce_ms_median": float(np.median(times) * 1e3),
                    "allreduce_ms_total": float(times.sum() * 1e3)}

    def close(self) -> None:
        """Finish queued buckets, stop the worker thread, close a client this state opened.

        After a failed bucket it does not wait: a bucket in flight may be waiting for peers
        that will never come."""
        if self._executor is not None:
            failed = bool(self._failed)
            self._executor.shutdown(wait=not failed, cancel_futures=failed)
            self._executor = None
        if self._owns_client:
            self.client.close()

    # ---- the work of one bucket -------------------------------------------------------
    def _reduce(self, index: int, array: np.ndarray,
                reference: torch.Tensor | list[torch.Tensor] | None, work: Any) -> np.ndarray:
        """Sum `array` through the agent; check it against the reference; return the sum."""
        if self._failed:
            # the job's collective sequence is broken; do not wait for the agent's timeout
            raise CollectiveError(f"bucket {index} not sent: an earlier bucket failed "
                                  f"({self._failed})")
        t = time.perf_counter()
        summed = self.client.allreduce(array, job=self.job, out=array)
        elapsed = time.perf_counter() - t
        if summed.shape != array.shape or summed.dtype != array.dtype:
            raise CollectiveError(f"bucket {index}: the agent returned {summed.dtype}"
                                  f"{list(summed.shape)} for {array.dtype}{list(array.shape)}")
        checked = False
        if reference is not None:
            work.wait()
            if self.optinc_bits is not None:
                self._check_quantised(index, summed, reference)
            else:
                self._check(index, summed, reference)
            checked = True
        with self._lock:
            self.buckets += 1
            self.bytes += array.nbytes
            self.verified += checked
            self.allreduce_s.append(elapsed)
        return summed

    def _check_quantised(self, index: int, summed: np.ndarray, gathered: Any) -> None:
        """Raise AllreduceMismatch unless `summed` equals the exact quantised result."""
        from oddl.agents.collective.optinc import optinc_expected

        inputs = [t.numpy().astype(summed.dtype, copy=False) for t in gathered]
        expected = optinc_expected(inputs, int(self.optinc_bits or 8))
        bad = np.flatnonzero(summed != expected)
        if bad.size:
            i = int(bad[0])
            message = (f"bucket {index}: the optinc all-reduce differs from the exact quantised "
                       f"mean at {bad.size} of {summed.size} elements; element {i}: got "
                       f"{summed[i]:.9g}, expected {expected[i]:.9g}")
            with self._lock:
                self.mismatches.append(message)
            raise AllreduceMismatch(message)

    def _check(self, index: int, summed: np.ndarray,
               reference: torch.Tensor | list[torch.Tensor]) -> None:
        """Raise AllreduceMismatch if `summed` is off the exact sum by more than the bound."""
        exact = reference[0].numpy()
        abs_sum = reference[1].numpy()
        n = self.world_size
        # float summation in any order is within (N-1)·eps·Σ|x| of the exact sum; the float64
        # reference itself is within (N-1)·eps64·Σ|x| of it
        eps = float(np.finfo(summed.dtype).eps) + float(np.finfo(np.float64).eps)
        bound = (n - 1) * eps * abs_sum
        got = summed.astype(np.float64)
        err = np.abs(got - exact)
        ok = err <= bound
        both_nonfinite = ~np.isfinite(got) & ~np.isfinite(exact)
        ok |= both_nonfinite & ((got == exact) | (np.isnan(got) & np.isnan(exact)))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(bound > 0, err / bound, np.where(err > 0, np.inf, 0.0))
        finite = ratio[np.isfinite(got) & np.isfinite(exact)]
        worst = float(finite.max()) if finite.size else 0.0
        with self._lock:
            self.max_error_over_bound = max(self.max_error_over_bound, worst)
        if not ok.all():
            bad = np.flatnonzero(~ok)
            i = int(bad[np.argmax(err[bad])]) if np.isfinite(err[bad]).any() else int(bad[0])
            message = (f"bucket {index} (call {self.buckets + 1}): the optical all-reduce differs "
                       f"from the exact reduction at {bad.size} of {summed.size} elements; "
                       f"element {i}: got {got[i]:.9g}, exact {exact[i]:.9g}, allowed error "
                       f"{bound[i]:.3g}")
            with self._lock:
                self.mismatches.append(message)
            raise AllreduceMismatch(message)


def optical_allreduce_hook(state: OpticalHookState,
                           bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average the bucket's flat gradient over the nodes through the agent.

    Uses only `bucket.index()` and `bucket.buffer()`, so tests may pass a stand-in.
    """
    buffer = bucket.buffer()
    index = bucket.index()
    flat = buffer.detach()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    try:
        array = flat.contiguous().numpy().copy()  # the agent gets bytes DDP will not touch
    except TypeError as exc:
        raise TypeError(f"the optical hook needs a numpy-compatible gradient dtype, not "
                        f"{buffer.dtype}") from exc
    reference: torch.Tensor | list[torch.Tensor] | None = None
    work: Any = None
    if state.verify and state.optinc_bits is not None:
        # optinc's reference needs every rank's bucket: gather them (in bucket order, here)
        reference = [torch.empty_like(flat) for _ in range(state.world_size)]
        work = dist.all_gather(reference, flat.contiguous(), group=state.process_group,
                               async_op=True)
    elif state.verify:
        as64 = flat.to(torch.float64)
        reference = torch.stack([as64, as64.abs()])
        # launched here, on the backward pass's thread, so every rank issues them in bucket order
        if state.process_group is not None and not isinstance(state.process_group,
                                                              dist.ProcessGroup):
            work = state.process_group.allreduce([reference])
        else:
            work = dist.all_reduce(reference, group=state.process_group, async_op=True)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    world = state.world_size

    def run() -> None:
        try:
            summed = state._reduce(index, array, reference, work)
            result = torch.from_numpy(summed).div_(world).view_as(buffer)
            future.set_result(result.to(buffer.device) if buffer.device.type != "cpu" else result)
        except BaseException as exc:  # handed to DDP, which raises it from backward
            with state._lock:
                state._failed = state._failed or str(exc)
                if not isinstance(exc, AllreduceMismatch):
                    state.errors.append(f"bucket {index}: {exc}")
            logger.error("optical all-reduce of bucket %d failed: %s", index, exc)
            future.set_exception(exc)  # type: ignore[arg-type]  # torch types it as the result

    if state._executor is not None:
        state._executor.submit(run)
    else:
        run()
    return future


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, client: AgentClient | str,
             world_size: int, verify: bool = False, **kwargs: Any) -> OpticalHookState:
    """Register the optical hook on a DDP model; returns its state (close it when done)."""
    state = OpticalHookState(client, world_size, verify, **kwargs)
    ddp_model.register_comm_hook(state, optical_allreduce_hook)
    return state
