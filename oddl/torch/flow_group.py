"""A subgroup of the oddl world over the optics: its collectives made of flows among its
members (`oddl.torch.mesh`), its point-to-point calls flows of its own session.

`MeshChannel` stands in for the process's `Channel` in an `OddlProcessGroup`, so a subgroup
runs the very code of the world group (`oddl.torch.native`), with ranks and roots as member
indices: its client (`MeshClient`) answers each collective with flows among the members
(the controller makes each flow's circuit and window), and its receives run on a lane of
their own. The world group's handshake drew the run's session; a subgroup's flows travel in
a session derived from it and the group's name, so two groups' flows never pair.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from oddl.agents.client.agent_client import AgentClient
from oddl.torch.channel import Channel, count
from oddl.torch.mesh import FlowMesh, MeshClient

__all__ = ["MeshChannel", "subgroup_session"]


def subgroup_session(world_session: str, group_name: str) -> str:
    """The session of a subgroup's flows: the world's, and the group's name (hashed to fit
    the agent's session names)."""
    digest = hashlib.sha256(group_name.encode()).hexdigest()[:12]
    return f"{world_session}-{digest}"


class MeshChannel:
    """A subgroup's channel: the process channel's worker and receive lanes, its collectives
    over flows among the members `job_ranks` (member i runs on job rank job_ranks[i])."""

    def __init__(self, base: Channel, job_ranks: list[int], me: int, session: str):
        self.base = base
        self.api, self.job = base.api, base.job
        self.job_ranks = job_ranks
        self.session = session
        self._lane = f"-{session}"
        self.mesh = FlowMesh(me, len(job_ranks), self._send_block, self._receive_block)
        self.client = MeshClient(self.mesh, self._send)
        self.timeout_s: float | None = None
        """The bound of the call in progress (`bounded`); None: the process channel's."""
        self.promoter = None
        """Nothing to move into shared memory: the group's flows write into its tensors in
        this process (`torch_native.all_gather_into`)."""

    # ---- the mesh's flows (the group's collectives) -------------------------------------
    def _send_block(self, a: np.ndarray, member: int) -> None:
        self.base.client.send(a, self.job_ranks[member], session=f"{self.session}c",
                              job=self.job, timeout_s=self.timeout_s)
        count("subgroup flows", optical=a.nbytes)

    def _receive_block(self, out: np.ndarray, member: int) -> torch.futures.Future:
        src, timeout_s = self.job_ranks[member], self.timeout_s
        return self.base.submit_receive(
            "subgroup collective", lambda c: c.recv(out, src, session=f"{self.session}c",
                                                    job=self.job, timeout_s=timeout_s),
            self._lane)

    # ---- the group's own point-to-point calls ---------------------------------------------
    def _send(self, a: np.ndarray, dst: int, **where: Any) -> None:
        self.base.client.send(a, self.job_ranks[dst], **where)

    def submit_receive(self, what: str, fn: Callable[[Any], Any]) -> torch.futures.Future:
        """`fn` with a receiving client whose ranks are member indices."""
        return self.base.submit_receive(what, lambda c: fn(_MemberReceiver(c, self.job_ranks)),
                                        f"{self._lane}p")

    # ---- what OddlProcessGroup asks of a channel ------------------------------------------
    def submit(self, what: str, fn: Callable[[], Any], inline: bool = False,
               collective: bool = True) -> torch.futures.Future:
        """On the process's worker thread, in order with every group's calls; a failed
        subgroup call breaks no sequence of the job."""
        del collective
        return self.base.submit(what, fn, inline, collective=False)

    @contextmanager
    def bounded(self, timeout_s: float) -> Iterator[None]:
        """The group's flows in this context wait at most `timeout_s` each."""
        saved, self.timeout_s = self.timeout_s, timeout_s
        try:
            yield
        finally:
            self.timeout_s = saved

    def sum_(self, array: np.ndarray) -> np.ndarray:
        """Sum `array` across the members, in place (worker thread only)."""
        return self.client.allreduce(array, out=array) if array.size else array


class _MemberReceiver:
    """A receiving `AgentClient` addressed by member index."""

    def __init__(self, client: AgentClient, job_ranks: list[int]):
        self._client, self._job_ranks = client, job_ranks

    def recv(self, out: np.ndarray, src: int, **where: Any) -> np.ndarray:
        return self._client.recv(out, self._job_ranks[src], **where)

    def recv_any(self, out: np.ndarray, **where: Any) -> tuple[np.ndarray, int]:
        got, source = self._client.recv_any(out, **where)
        if source not in self._job_ranks:
            raise ValueError(f"a flow from job rank {source}, outside this subgroup "
                             f"{self._job_ranks}, on the subgroup's session")
        return got, self._job_ranks.index(source)
