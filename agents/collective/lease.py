"""What a training process needs to run its job's collectives itself (decision record 0040).

On a job whose data moves over direct TCP streams with no slots to gate (the ideal network),
the agent can lease the data path to the rank: it answers, for one bucket size, the job's
schedule from the controller (the same one the agent would run), and the host the rank's own
stream listens on. The agent keeps everything else: the controller link, the clock, the job
table, and every job on which the lease is refused. A lease is refused, naming why, where
the agent must stay in the bytes' way: the slots of an optical network (the agent gates them
into their windows), the emulated light layer (it lives in the agent), links that are not
streams, collectives other than those in `LEASED_KINDS`, and schedules that run
on a device (OptINC) or forward through hosts.

Where the agent's streams are authenticated (a lab's certificates, decision record 0008), the
lease carries the job's rank-path keys, derived per peer from the node's shared secrets
(decision record 0042): the ranks prove each other with them, and the node's secret key stays
with the agent.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from oddl.agents.agent_jobs import AgentJob
from oddl.agents.links.choice import DataLinks
from oddl.agents.links.stream_auth import AuthError, StreamAuth
from oddl.agents.links.stream_wire import parse_address
from oddl.agents.links.streams import StreamLink
from oddl.common.collective_kinds import ALL_REDUCE
from oddl.common.config import OPTINC
from oddl.common.errors import OperationRefused
from oddl.protos import oddl_pb2 as pb

NAMESPACE = "rank-path"
"""The stream namespace of the ranks' calls: ``<job>/rank-path``, apart from the agent's."""

PlanKey = tuple[int, str, str, int]
"""(elements, dtype, kind, root): the key of a job's cached schedule (`AgentJob.plans`)."""

LEASED_KINDS = (ALL_REDUCE, "all_gather", "reduce_scatter", "broadcast", "all_to_all")
"""The collectives a rank may run itself: those a training loop makes every step (DDP's and
FSDP's buckets, a mixture of experts' all-to-all) and the broadcast that starts it. Gather,
scatter and point to point stay with the agent."""

FetchSchedule = Callable[[str, int, int, str, int], pb.Schedule]
"""The controller's `GetSchedule`: (job, bytes, itemsize, kind, root) → its schedule."""


def schedule_for(job: AgentJob, key: PlanKey, itemsize: int,
                 fetch: FetchSchedule) -> pb.Schedule:
    """The job's schedule of `key` on the ideal network: cached, else asked of the
    controller once."""
    schedule = job.plans.get(key)
    if schedule is None:
        n, _dtype, kind, root = key
        schedule = job.plans[key] = fetch(job.id, n * itemsize, itemsize, kind, root)
    return schedule


def refusal(job: AgentJob, links: DataLinks) -> str:
    """Why this job's data path cannot be leased to its ranks ("" if it can)."""
    link = links.link
    if job.network != "ideal":
        return (f"job {job.id} runs on the {job.network} network: its agent gates every send "
                "into its slot")
    if not isinstance(link, StreamLink) or link.phy is not None:
        return "the agent's links are not direct TCP streams (emulated light or a relay)"
    if link.auth is not None and not isinstance(link.auth, StreamAuth):
        return "the agent's streams are themselves keyed for one job"
    return ""


def lease(job: AgentJob, links: DataLinks, ask: Any, fetch: FetchSchedule,
          line_rate_bps: float) -> dict[str, Any]:
    """The answer to a rank's lease request `ask` ({"n", "dtype", "itemsize", "kind",
    "root"}; n = 0 asks only whether the job can be leased): granted with the host to listen
    on, the line rate receives are due by and, for n > 0, the schedule (serialized, base64);
    or refused with the reason."""
    if not isinstance(ask, dict):
        raise OperationRefused("malformed lease request: give n, dtype, itemsize, kind, root")
    try:
        key: PlanKey = (int(ask.get("n", 0)), str(ask.get("dtype", "")),
                        str(ask.get("kind", ALL_REDUCE)), int(ask.get("root", 0)))
        itemsize = int(ask.get("itemsize", 0))
    except (TypeError, ValueError) as exc:
        raise OperationRefused(f"malformed lease request ({exc}): give n, dtype, itemsize, "
                               "kind, root as numbers and names") from exc
    why = refusal(job, links)
    if not why and key[2] not in LEASED_KINDS:
        why = f"{key[2]} stays with the agent; only {', '.join(LEASED_KINDS)} are leased"
    if why:
        return {"granted": False, "why": why}
    granted: dict[str, Any] = {"granted": True, "host": parse_address(links.address)[0],
                               "line_rate_bps": line_rate_bps}
    if key[0] <= 0:
        return _keyed(granted, job, links)
    if itemsize <= 0:
        raise OperationRefused("malformed lease request: itemsize must be positive")
    schedule = schedule_for(job, key, itemsize, fetch)
    if schedule.collective == OPTINC or (schedule.n_elems and schedule.n_elems > key[0]):
        return {"granted": False, "why": "the schedule runs on a device or forwards through "
                                         "hosts: it stays with the agent"}
    return {**granted, "schedule": base64.b64encode(schedule.SerializeToString()).decode("ascii")}


def _keyed(granted: dict[str, Any], job: AgentJob, links: DataLinks) -> dict[str, Any]:
    """`granted`, with the job's rank-path keys (hex) where the agent's streams are
    authenticated (decision record 0042); refused, naming the peer, where a peer has no key
    or a revoked one."""
    auth = getattr(links.link, "auth", None)
    if not isinstance(auth, StreamAuth):
        return granted
    try:
        keys = auth.job_keys(f"{job.id}/{NAMESPACE}", job.nodes)
    except AuthError as exc:
        return {"granted": False, "why": f"the job's rank-path streams cannot be keyed: {exc}"}
    return {**granted, "keys": {peer: key.hex() for peer, key in keys.items()}}


class LeasedCalls:
    """The calls ranks ran on a leased data path, as they report them: totals per group
    (a report repeats its group's totals, so a lost or repeated one changes nothing)."""

    def __init__(self) -> None:
        self._by_group: dict[str, tuple[int, int, int]] = {}

    def report(self, raw: Any) -> None:
        """Take a rank's report {"group", "done", "failed", "bytes"}."""
        try:
            group = str(raw["group"])
            counts = (int(raw["done"]), int(raw["failed"]), int(raw["bytes"]))
        except (TypeError, KeyError, ValueError) as exc:
            raise OperationRefused(f"malformed rank-path report ({exc!r}): give group, done, "
                                   "failed and bytes") from exc
        if min(counts) < 0:
            raise OperationRefused(f"a rank-path report with negative counts {counts}")
        self._by_group[group] = counts

    def totals(self) -> tuple[int, int, int]:
        """(calls done, calls failed, bytes reduced) over every group reported."""
        groups = list(self._by_group.values())
        return (sum(g[0] for g in groups), sum(g[1] for g in groups),
                sum(g[2] for g in groups))
