"""The rank moves its own bytes (decision record 0040): the world group's all-reduces,
all-gathers, reduce-scatters, broadcasts and all-to-alls
(`oddl.agents.collective.lease.LEASED_KINDS`) run in the training process, over a stream link
of its own, on the schedule its agent leases it.

Unless ``ODDL_IN_RANK=0`` is in the ranks' environment, each rank asks its agent at the world
group's creation whether the job's data path can be leased (`oddl.agents.collective.lease`:
the ideal network on direct TCP streams; where they are authenticated, with the job's
rank-path keys: decision record 0042), opens a stream listener on the host its agent's
streams use, and publishes the address on the group's store. Only when every
rank got the lease does the group use it — every rank or none, so no call is ever run one
way on one rank and the other way on another — and then each rank opens its streams to every
peer at once (no call pays a connection). Then each such call asks its agent once per
size, kind and root for the job's schedule, and runs it with the agents' own executor
(`run_collective`: chunks pipelined across steps, reduced in place) and their outcome round
(decision record 0016: the call succeeds only where every rank succeeded), with no local hop,
no bucket and no agent process in the chunks' way. The agent keeps the controller link, the
clock and every other call; a crashed training process takes only its own streams with it,
and its peers fail the call in flight by their outcome round or its receive deadline.

Calls are numbered per group, in the order every rank makes them (as c10d requires), on a
stream namespace of their own (``<job>/rank-path``), apart from the agent's.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import numpy as np

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.clock import wall
from oddl.agents.collective import outcome
from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.exchange import one_element_blocks, sized_steps
from oddl.agents.collective.lease import NAMESPACE, PlanKey
from oddl.agents.collective.memory import Memory
from oddl.agents.collective.plan_run import run_in_memory
from oddl.agents.links.stream_auth import JobKeys
from oddl.agents.links.stream_wire import PeerGaveUp
from oddl.agents.links.streams import StreamLink
from oddl.agents.slot_gate import SlotGate
from oddl.common.errors import CollectiveError, OddlError
from oddl.protos import oddl_pb2 as pb
from oddl.protos.schedule_wire import StepSpec, decode_schedule

logger = logging.getLogger(__name__)

ENV_IN_RANK = "ODDL_IN_RANK"
"""``0``: every call goes through the agent, even where the job's data path can be leased."""

RANK_CHUNK_BYTES = 8 << 20
"""The rank path's largest chunk. Each chunk costs the executor's threads a few wake-ups and
some Python; with the agents' 1 MB chunks a rank spent ×1.15–1.47 gloo's CPU time per call
at 16–256 MB, with 4 MB ×0.84–1.12, with 8 MB ×0.89 at 64 and 256 MB, 4 ranks, ideal network
(docs/results.md, decision record 0040). A transfer smaller than this is one chunk."""


def wanted() -> bool:
    """Whether this process moves its own bytes where the job allows it (not
    ``ODDL_IN_RANK=0``)."""
    return os.environ.get(ENV_IN_RANK, "1").strip() != "0"


SCRATCH_KEPT = 4
"""Work buffers a rank path keeps for reuse (`RankPath.scratch`)."""

REPORT_S = 1.0
"""How often a rank tells its agent what it ran on the rank path (for `oddl status`)."""


class _Reporter:
    """Tells the agent, from a thread and a client of its own, the group's totals on the
    rank path every `REPORT_S` while they change, and once more at the end: the agent's
    heartbeat then counts them, so `oddl status` shows the calls the ranks ran."""

    def __init__(self, api: str, job: str, group: str, path: RankPath):
        self._client = AgentClient(api, timeout_s=2.0)  # a gone agent delays no exit long
        self._job, self._group, self._path = job, group, path
        self._sent: tuple[int, int, int] = (0, 0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oddl-rank-report",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(REPORT_S):
            self._flush()

    def _flush(self) -> None:
        counts = (self._path.calls, self._path.failed, self._path.bytes)
        if counts == self._sent:
            return
        try:
            self._client.ask_world(self._job, report=dict(
                zip(("done", "failed", "bytes"), counts, strict=True), group=self._group))
            self._sent = counts
        except OddlError as exc:  # the agent restarting: the next report says it all
            logger.debug("oddl: the rank path's report to the agent failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self._flush()
        self._client.close()


class RankPath:
    """One group's all-reduces run by this rank (see the module docstring)."""

    def __init__(self, client: AgentClient, job: str, rank: int, nodes: tuple[str, ...],
                 link: StreamLink, line_rate_bps: float):
        self.client, self.job, self.rank, self.nodes = client, job, rank, nodes
        self.link = link
        self.line_rate_bps = line_rate_bps
        self.label = f"{job}/{NAMESPACE}"
        self.seq = 0
        """Calls whose data started to move (the group's numbering)."""
        self.calls = 0
        self.failed = 0
        self.bytes = 0
        self._plans: dict[PlanKey, tuple[tuple[StepSpec, ...], float, str] | None] = {}
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="oddl-rank-send")
        self._scratch: OrderedDict[tuple[str, tuple[int, ...], str], np.ndarray] = OrderedDict()
        self._reporter: _Reporter | None = None

    def run(self, work: np.ndarray | Memory, kind: str, op: str = "sum", root: int = 0) -> bool:
        """Run the collective `kind` (`LEASED_KINDS`) on the work buffer `work` (contiguous,
        writable, laid out as the agent's client lays it out:
        `oddl.common.collective_kinds.work_blocks`, or that layout held by the call's own
        tensors: `Memory.apart`; `root` a job rank) in place across the job; False, with
        nothing sent, when this call's schedule stays with the agent (every rank alike)."""
        memory = work if isinstance(work, Memory) else Memory.whole(work.reshape(-1))
        plan = self._plan(memory.size, memory.dtype, kind, root)
        if plan is None:
            return False
        steps, receive_timeout_s, collective = plan
        self._execute(memory, steps, receive_timeout_s, collective, kind, op, root)
        return True

    def sizes_all_to_all(self, dtype: np.dtype) -> bool:
        """Whether an all-to-all of `dtype` runs with each block at its own size
        (`run_sized_all_to_all`): the agent leases the job's all-to-all and it moves every
        block straight to its receiver. Every rank alike: it depends on the job's plan."""
        world = len(self.nodes)
        plan = self._plan(2 * world, dtype, "all_to_all", 0)
        return plan is not None and one_element_blocks(plan[0], world)

    def run_sized_all_to_all(self, memory: Memory, sent: tuple[int, ...],
                             received: tuple[int, ...]) -> None:
        """An all-to-all whose blocks have the sizes this rank knows (`sent[j]` elements to
        job rank j, `received[i]` from job rank i), in `memory` laid out sparsely
        (`oddl.agents.collective.exchange`): no sizes round, no padding. Only where
        `sizes_all_to_all` said so."""
        plan = self._plan(2 * len(self.nodes), memory.dtype, "all_to_all", 0)
        assert plan is not None, "sizes_all_to_all said the agent keeps it"
        steps = sized_steps(plan[0], self.rank, sent, received)
        self._execute(memory, steps, plan[1], plan[2], "all_to_all", "sum", 0, once=True)

    def give_up(self, failure: CollectiveError) -> NoReturn:
        """Fail the group's next call before it runs (this rank found its own call wrong):
        its peers, waiting for this rank's chunks, hear why at once."""
        self.seq += 1
        self.failed += 1
        me = self.nodes[self.rank]
        outcome.tell_failure(self.link, self.label, self.seq,
                             [n for n in self.nodes if n != me], failure)
        raise failure

    def _execute(self, memory: Memory, steps: tuple[StepSpec, ...], receive_timeout_s: float,
                 collective: str, kind: str, op: str, root: int, once: bool = False) -> None:
        """Run `steps` as the group's next call, then the outcome round (record 0016);
        `once`: a sized all-to-all's plan (`CollectiveRun.exchange_once`)."""
        self.seq += 1
        run = CollectiveRun(self.label, self.seq, self.rank, self.nodes, steps,
                            network="ideal", receive_timeout_s=receive_timeout_s,
                            line_rate_bps=self.line_rate_bps, reduce_op=op, kind=kind,
                            collective=collective, chunk_bytes=RANK_CHUNK_BYTES,
                            exchange_once=once)
        me, peers = self.nodes[self.rank], [n for n in self.nodes if n != self.nodes[self.rank]]
        try:
            run_in_memory(run, memory, self.link, SlotGate(), sender=self._sender)
            outcome.agree_outcome(self.link, me, self.label, self.seq, peers,
                                  wall.now() + max(2 * receive_timeout_s, 5.0), None,
                                  (kind, op, root))
        except CollectiveError as exc:
            self.failed += 1
            if not isinstance(exc, PeerGaveUp):
                outcome.tell_failure(self.link, self.label, self.seq, peers, exc)
            raise
        self.calls += 1
        self.bytes += memory.nbytes

    def scratch(self, kind: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A work buffer for a call of `kind` that lays one out of its own (its contents
        undefined), reused from the call before of that kind and shape: a new one of 64 MB
        costs 16,384 page faults. The `SCRATCH_KEPT` most recent are kept."""
        key = (kind, tuple(shape), np.dtype(dtype).str)
        buf = self._scratch.pop(key, None)
        if buf is None:
            buf = np.empty(shape, dtype)
        self._scratch[key] = buf
        while len(self._scratch) > SCRATCH_KEPT:
            self._scratch.popitem(last=False)
        return buf

    def kept(self, kind: str) -> list[tuple[tuple[int, ...], str]]:
        """The shapes and dtypes (`numpy.dtype.str`) of the work buffers kept for calls of
        `kind` (`scratch`)."""
        return [(shape, dtype) for k, shape, dtype in self._scratch if k == kind]

    def _plan(self, n: int, dtype: np.dtype, kind: str, root: int
              ) -> tuple[tuple[StepSpec, ...], float, str] | None:
        """This call's steps, receive timeout and collective, leased once per layout size
        `n`, dtype, kind and root (None: the agent keeps them)."""
        key = (n, dtype.str, kind, root)
        if key not in self._plans:
            info = self.client.ask_world(self.job, lease={
                "n": n, "dtype": dtype.str, "itemsize": dtype.itemsize,
                "kind": kind, "root": root})["lease"]
            if not info.get("granted") or "schedule" not in info:
                logger.info("oddl: %s of %d x %s stays with the agent: %s", kind, n, dtype,
                            info.get("why", "no schedule leased"))
                self._plans[key] = None
            else:
                schedule = pb.Schedule.FromString(base64.b64decode(info["schedule"]))
                decoded = decode_schedule(schedule)
                self._plans[key] = (decoded.steps, decoded.receive_timeout_s,
                                    decoded.collective)
        return self._plans[key]

    def report_to(self, api: str, group: str) -> None:
        """Tell the agent at `api` what this group runs (`_Reporter`), from now on."""
        self._reporter = _Reporter(api, self.job, group, self)

    def close(self) -> None:
        """Stop the sender and the link (the group is gone), and report the last calls."""
        self._sender.shutdown(wait=True)
        self.link.close()
        if self._reporter is not None:
            self._reporter.close()


def open_rank_path(client: AgentClient, job: str | None, store: Any, rank: int, world: int,
                   key: str) -> RankPath | None:
    """The group's rank path when every rank got the lease, else None (every rank alike).
    `store` is the group's c10d store; `key` names this group's entries in it. A rank that
    declines (``ODDL_IN_RANK=0``) still says so there, so the others do not wait for it."""
    if wanted():
        info = client.ask_world(job, lease={"n": 0})
        lease = info.get("lease") or {"why": "the agent runs an older oddl that leases nothing"}
    else:
        info, lease = client.ask_world(job), {"why": f"{ENV_IN_RANK}=0"}
    nodes = tuple(info["nodes"])
    link: StreamLink | None = None
    why = lease.get("why", "")
    if lease.get("granted") and len(nodes) != world:
        why = f"the job has {len(nodes)} nodes for a group of {world} ranks"
    elif lease.get("granted"):
        keys = lease.get("keys")  # the lab's streams are authenticated (decision record 0042)
        auth = None if keys is None else JobKeys(
            nodes[int(info["rank"])], {peer: bytes.fromhex(k) for peer, k in keys.items()})
        link = StreamLink(nodes[int(info["rank"])], f"{lease['host']}:0", auth=auth)
    store.set(f"{key}/{rank}", json.dumps([int(info["rank"]), link.address if link else "",
                                           why]))
    theirs = [json.loads(store.get(f"{key}/{r}")) for r in range(world)]
    refused = [(r, w) for r, (_jr, address, w) in enumerate(theirs) if not address]
    if refused:
        if link is not None:
            link.close()
        if rank == 0:
            r, w = refused[0]
            logger.info("oddl: the agents move the bytes (rank %d: %s)", r, w)
        return None
    assert link is not None
    link.set_peers({nodes[job_rank]: address for job_rank, address, _ in theirs})
    if rank == 0:
        logger.info("oddl: the ranks move their own bytes on job %s (decision record 0040)",
                    info["job"])
    path = RankPath(client, str(info["job"]), int(info["rank"]), nodes, link,
                    float(lease.get("line_rate_bps", 0.0)))
    try:  # every listener is up (its address is on the store): the first call connects none
        link.connect(path.label)
    except CollectiveError as exc:  # the first call tries again, and names the peer
        logger.warning("oddl: the rank path's streams did not open at once: %s", exc)
    return path
