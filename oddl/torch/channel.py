"""The oddl torch backend's side of the local agent: one AgentClient and one FIFO worker
thread per process, the byte counters, tensors as numpy arrays the agent can sum, and the
sums the backend's collectives are built of (the all-to-all block exchange, the handshake).

Used by oddl.torch.backend (see there); only importable where torch is installed.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from oddl.agents.client.agent_client import AgentClient
from oddl.common.errors import CollectiveError, ConfigError
from oddl.torch.adopt import Promoter, array_of
from oddl.torch.counters import count, counters, reset_counters
from oddl.torch.in_rank import RankPath, open_rank_path
from oddl.torch.timeouts import GO_ON

logger = logging.getLogger(__name__)

__all__ = ["ENV_API", "ENV_FALLBACK", "ENV_JOB", "Channel", "FutureWork", "UnsupportedCollective",
           "as_numpy", "channel_for", "count", "counters", "joined_channel",
           "reset_counters"]

ENV_API, ENV_JOB, ENV_FALLBACK = "ODDL_LOCAL_API", "ODDL_JOB", "ODDL_TORCH_FALLBACK"
ENV_SUBGROUPS = "ODDL_TORCH_SUBGROUPS"
"""How subgroups run: "flows" (the default: over the optics) or "gloo" (beside)."""


class UnsupportedCollective(CollectiveError):
    """A collective (or reduction) the optical all-reduce cannot carry, with no fallback."""


# ---- work objects ---------------------------------------------------------------------------

class FutureWork(dist.Work):
    """c10d's work for a call that completes `future`: wait() raises the call's error.

    (torch 2.13's `_create_work_from_future` makes a work whose wait() returns True even when
    the future failed: a failed collective would leave its tensors as they were, silently.)"""

    def __init__(self, future: torch.futures.Future, sender: list[int] | None = None):
        super().__init__()
        self._future = future
        self._sender = sender if sender is not None else []
        """A receive from any source: the group rank it came from, put there by the call
        (which may finish before this work exists: it runs on another thread)."""

    @property
    def source(self) -> int:
        """A receive from any source: the group rank it came from once done (else -1)."""
        return self._sender[0] if self._sender else -1

    def wait(self, timeout: Any = None) -> bool:
        self._future.wait()  # raises the call's error
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def _source_rank(self) -> int:
        """The sender of a receive from any source (c10d's `recv(src=None)` asks)."""
        self._future.wait()
        return self.source


# ---- the channel to the agent: one client and one FIFO thread per process ---------------

class Channel:
    """The process's AgentClient and the single thread that uses it (not thread-safe)."""

    def __init__(self, api: str, job: str | None, timeout_s: float):
        self.api, self.job = api, job
        self.client = AgentClient(api, timeout_s=timeout_s)
        self.promoter = Promoter(self.client)  # zero copies for reused tensors
        self.failed = ""
        self.groups = 0
        """Groups over the job this process made (`realign` numbers their keys)."""
        self._use = threading.Lock()  # held while a call uses the client
        self._state = threading.Lock()
        self._pending = 0  # calls submitted and not yet finished
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="oddl-pg")
        self._lanes: dict[str, tuple[AgentClient, ThreadPoolExecutor]] = {}
        """Receive lanes (`submit_receive`): a client and a thread each."""
        self._timeout_s = timeout_s
        self.rank_path: RankPath | None = None
        """The world group's all-reduces in this process (decision record 0040), if leased."""

    def lease_rank_path(self, store: Any, rank: int, world: int) -> None:
        """A new world group (on the worker thread): its all-reduces move in this process when
        every rank gets the lease (`oddl.torch.in_rank`; ``ODDL_IN_RANK=0`` keeps them with
        the agent), else through the agent."""
        if self.rank_path is not None:
            self.rank_path.close()
            self.rank_path = None
        key = self.group_key("oddl-rank-path")
        self.rank_path = open_rank_path(self.client, self.job, store, rank, world, key)
        if self.rank_path is not None:
            self.rank_path.report_to(self.api, f"{os.getpid()}/{key}")

    def group_key(self, what: str) -> str:
        """The c10d store key of `what` for this process's newest group over the job in this
        attempt: a store an earlier group (or a destroyed world group, or the attempt before
        a torchrun restart: its agent's store outlives the workers) left keys in never
        answers for this one."""
        return f"{what}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{self.groups}"

    def _moved(self) -> tuple[int, int]:
        """Calls whose data went out: through the agent, and in this process."""
        return self.client.steps.used, self.rank_path.seq if self.rank_path else 0

    def sum_(self, array: np.ndarray, in_rank: bool = True) -> np.ndarray:
        """Sum `array` (contiguous, writable) across the job's nodes, in place (worker thread
        only): on the rank path where there is one and `in_rank` (not for a new group's
        handshake, which must not lean on the group before it). An empty array (every rank's
        is, for a collective that is well formed) needs no call."""
        if array.size == 0:
            return array
        if in_rank and self.rank_path is not None and self.rank_path.run(array, "all_reduce"):
            return array
        out = self.client.allreduce(array, job=self.job, out=array)
        if out.shape != array.shape or out.dtype != array.dtype:
            raise CollectiveError(f"the agent returned {out.dtype}{list(out.shape)} for "
                                  f"{array.dtype}{list(array.shape)}")
        return out

    @contextmanager
    def bounded(self, timeout_s: float) -> Iterator[None]:
        """The worker thread's calls in this context wait at most `timeout_s` (the process
        group's timeout, `oddl.torch.timeouts`)."""
        saved, self.client.timeout_s = self.client.timeout_s, timeout_s
        try:
            yield
        finally:
            self.client.timeout_s = saved

    def submit_receive(self, what: str, fn: Callable[[AgentClient], Any], lane: str = ""
                       ) -> torch.futures.Future:
        """Run `fn(receiving client)` on the thread of receive lane `lane` (in order); its
        result (or error) completes the future. A receive waits for its peer's send, which
        may come after this rank's next call: receives never hold up the worker thread, and a
        subgroup's receives never wait behind the world's. A failed receive breaks no
        collective sequence."""
        fut: torch.futures.Future = torch.futures.Future()
        with self._state:
            if self._executor is None:
                raise CollectiveError(f"{what}: the oddl backend was shut down")
            if lane not in self._lanes:
                self._lanes[lane] = (AgentClient(self.api, timeout_s=self._timeout_s),
                                     ThreadPoolExecutor(max_workers=1,
                                                        thread_name_prefix=f"oddl-recv{lane}"))
            receiver, receives = self._lanes[lane]

        def run() -> None:
            try:
                fut.set_result(fn(receiver))
            except BaseException as exc:  # handed to the caller through the future
                logger.error("oddl %s failed: %s", what, exc)
                fut.set_exception(exc)

        receives.submit(run)
        return fut

    def submit(self, what: str, fn: Callable[[], Any], inline: bool = False,
               collective: bool = True, after_failure: bool = False) -> torch.futures.Future:
        """Run `fn` on the worker thread; its result (or error) completes the future.

        `inline` (a call the caller waits for at once, `async_op=False`): when nothing is
        queued, run it on the caller's thread instead, saving the hand-over to the worker;
        the order stays first-in first-out either way. A `collective` that fails after its
        data went to the agent (it used up a step number) breaks the job's collective
        sequence: later calls are refused (but those `after_failure`: `realign`). One refused
        before that (a wrong argument) and a failed send do not."""
        fut: torch.futures.Future = torch.futures.Future()

        def run() -> None:
            with self._use:
                try:
                    guarded()
                finally:
                    with self._state:
                        self._pending -= 1

        def guarded() -> None:
            if self.failed and not after_failure:
                fut.set_exception(CollectiveError(
                    f"{what} not sent: an earlier collective failed after its data had gone "
                    f"to the agent ({self.failed}); {GO_ON}"))
                return
            used = self._moved()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller through the future
                # a call refused before its data went to the agent (an argument, a dtype, a
                # root; or refused unrun by the agent) used up no step: the sequence holds
                if collective and self._moved() != used and not self.failed:
                    self.failed = f"{what}: {exc}"
                    exc.add_note(f"oddl: {GO_ON}")
                logger.error("oddl %s failed: %s", what, exc)
                fut.set_exception(exc)

        if self._executor is None:
            raise CollectiveError(f"{what}: the oddl backend was shut down")
        with self._state:
            idle = self._pending == 0
            self._pending += 1
        if inline and idle:
            run()
        else:
            self._executor.submit(run)
        return fut

    def close(self) -> None:
        """Finish queued calls (unless one failed), stop the thread, close the client."""
        if self._executor is not None:
            self._executor.shutdown(wait=not self.failed, cancel_futures=bool(self.failed))
            self._executor = None
            if self.rank_path is not None:
                self.rank_path.close()
                self.rank_path = None
            self.client.close()
        for receiver, receives in self._lanes.values():
            receives.shutdown(wait=False, cancel_futures=True)
            receiver.close()
        self._lanes.clear()


_channel: Channel | None = None
_channel_lock = threading.Lock()


def channel_for(rank: int, timeout_s: float) -> Channel:
    """The process's channel, opened from the environment on first use."""
    global _channel
    with _channel_lock:
        if _channel is None:
            raw = os.environ.get(ENV_API, "").strip()
            if not raw:
                raise ConfigError(f"the oddl backend needs {ENV_API}=<the local agent API "
                                  f"address> (printed by `oddl agent serve`; a comma-separated "
                                  f"list indexed by rank for several ranks on one host), and "
                                  f"{ENV_JOB}=<job id> when the node is in more than one job")
            apis = [a.strip() for a in raw.split(",")]
            # torchrun's LOCAL_RANK picks this host's agent when several ranks share a host
            index = int(os.environ.get("LOCAL_RANK", rank))
            if len(apis) > 1 and index >= len(apis):
                raise ConfigError(f"{ENV_API} lists {len(apis)} agents but this is local rank "
                                  f"{index}; give one address per rank on this host, in order")
            api = apis[index] if len(apis) > 1 else apis[0]
            _channel = Channel(api, os.environ.get(ENV_JOB) or None, timeout_s)
            atexit.register(_close_channel)
        return _channel


def realign(channel: Channel, store: Any, rank: int, world: int) -> None:
    """Before a new group's handshake (on the worker thread): the ranks agree, on c10d's `store`, to number their
    next call on the job after the highest step any of them used, and a sequence a failed
    collective broke goes on from there (a failed call used up its number on the ranks that
    made it, not on the others: decision record 0030)."""
    steps = channel.client.steps
    # the agent's highest step of the job, from any process: the calls of an attempt
    # torchrun stopped (decision record 0033) sit at their numbers in the peers' ready
    # exchanges; the new group's calls must come after them
    job, seen = channel.client.steps_seen(channel.job or steps.last_job)
    own = steps.last.get(job, 0)
    channel.groups += 1
    key = channel.group_key("oddl-steps")
    store.set(f"{key}/{rank}", json.dumps([job, max(own, seen)]))
    theirs = [json.loads(store.get(f"{key}/{r}")) for r in range(world)]
    jobs = {j for j, _ in theirs if j}
    top = max(n for _, n in theirs)
    if len(jobs) == 1 and top > own:  # numbers only move forward
        steps.resume_at(jobs.pop(), top)
    if channel.failed:
        logger.warning("oddl: a new process group goes on after step %d of the job (the "
                       "sequence was broken by %s)", top, channel.failed)
        channel.failed = ""


def joined_channel(rank: int, world: int, timeout_s: float, handshake_s: float,
                   store: Any = None) -> tuple[Channel, Handshake]:
    """The process's channel, after the handshake with the job's other ranks (and, given
    c10d's `store`, after agreeing where the job's numbering goes on: `realign`). Every rank
    is here together (c10d's rendezvous came first): `handshake_s` is enough, and a job of
    another size fails in that time instead of the group's timeout."""
    channel = channel_for(rank, timeout_s)
    if store is not None:  # on the worker thread, after the calls queued before
        channel.submit("realign", lambda: realign(channel, store, rank, world),
                       collective=False, after_failure=True).wait()
    saved = channel.client.timeout_s
    channel.client.timeout_s = min(saved, handshake_s)

    def shake() -> Handshake:
        return handshake(channel, rank, world, channel.client.world(channel.job)[0])
    try:
        shaken: Handshake = channel.submit("handshake", shake).wait()
    finally:
        channel.client.timeout_s = saved
    return channel, shaken


def _close_channel() -> None:
    global _channel
    with _channel_lock:
        if _channel is not None:
            _channel.close()
            _channel = None


# ---- tensors <-> numpy ---------------------------------------------------------------------

def as_numpy(t: torch.Tensor, what: str, promote: bool = True) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor (of at least one dimension: a 0-d tensor is one
    element); a clear error for what numpy cannot hold. An all-reduce's tensor may move into
    shared memory for the agent (`oddl.torch.adopt`) unless not `promote`."""
    if t.device.type != "cpu":
        raise UnsupportedCollective(f"{what}: the oddl backend carries CPU tensors, not "
                                    f"{t.device}; register it for cpu and move tensors there")
    if t.dtype in (torch.bfloat16, torch.bool) or t.is_complex() or t.dtype.is_floating_point \
            and t.dtype not in (torch.float16, torch.float32, torch.float64):
        raise UnsupportedCollective(f"{what}: the agent sums numeric numpy dtypes, not "
                                    f"{t.dtype}; cast to float32 (or set {ENV_FALLBACK}=gloo)")
    # reduced in place: maybe in its own memory (oddl.torch.adopt)
    if what == "all_reduce" and promote and _channel is not None \
            and _channel.promoter.enabled and t.is_contiguous():
        _channel.promoter.before_in_place(t)
        a = array_of(t)
    else:
        a = t.detach().contiguous().numpy()
    return a.reshape(1) if a.ndim == 0 else a  # a 0-d tensor as one element, same memory


@dataclass(frozen=True)
class Handshake:
    """What the ranks of a new process group agreed on."""

    to_job: list[int]
    """Each group rank's job rank."""
    session: str
    """The group's point-to-point session (drawn by rank 0): a flow an earlier group left
    unreceived never pairs with this group's receives."""


def handshake(channel: Channel, rank: int, world: int, job_rank: int | None = None
              ) -> Handshake:
    """Check distinct ranks and a job of exactly `world` nodes (one small all-reduce); returns
    each group rank's job rank (this rank's is `job_rank`, the agent's, by default `rank`)
    and the group's session."""
    v = np.zeros(2 * world + 2, dtype=np.int64)
    v[rank], v[world] = 1, 1
    v[world + 1 + rank] = rank if job_rank is None else job_rank
    if rank == 0:
        v[-1] = secrets.randbits(62)
    try:
        channel.sum_(v, in_rank=False)
    except CollectiveError as exc:
        raise CollectiveError(f"the oddl backend's first all-reduce failed ({exc}); does the "
                              f"agent's job ({ENV_JOB}={channel.job or 'its only job'}) have "
                              f"exactly the {world} nodes of this world, and does every rank "
                              f"talk to its own node's agent ({ENV_API})?") from exc
    if int(v[world]) != world or (v[:world] != 1).any():
        missing = [r for r in range(world) if v[r] == 0]
        doubled = [r for r in range(world) if v[r] > 1]
        raise ConfigError(f"the job has {int(v[world])} nodes for a world of {world}"
                          f"{'; no rank ' + str(missing) if missing else ''}"
                          f"{'; ranks given twice ' + str(doubled) if doubled else ''}: start "
                          "one rank per node of the job, each with its own agent")
    to_job = [int(j) for j in v[world + 1:2 * world + 1]]
    if sorted(to_job) != list(range(world)):
        raise ConfigError(f"the ranks sit on job ranks {to_job}, not one each of 0..{world - 1}: "
                          f"is every rank talking to its own node's agent ({ENV_API})?")
    return Handshake(to_job, f"{int(v[-1]) & (1 << 62) - 1:x}")
