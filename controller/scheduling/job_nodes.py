"""A job's nodes by rank, with numpy lookups into the topology (channel, out-port, WSS).

Shared by the slot scheduler (`oddl.controller.scheduling.scheduler`) and the splitting of plan
steps into matchings (`oddl.controller.scheduling.matchings`). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oddl.common.errors import ScheduleError
from oddl.controller.scheduling.plan import read_only
from oddl.controller.scheduling.topology import NodeSpec, Topology


class JobNodes:
    """The job's nodes by rank, with per-rank numpy lookups into the topology."""

    def __init__(self, topology: Topology, nodes: Sequence[str], n_ranks: int) -> None:
        nodes = tuple(nodes)
        if len(nodes) != n_ranks:
            raise ScheduleError(
                f"the plan has {n_ranks} ranks but {len(nodes)} nodes were given; pass one node "
                "id per rank"
            )
        self.rank_of: dict[str, int] = {}
        for r, node_id in enumerate(nodes):
            if self.rank_of.setdefault(node_id, r) != r:
                raise ScheduleError(f"node {node_id!r} is given for two ranks; use each node once")
        self.topology = topology
        self.node_ids = nodes
        self.specs: tuple[NodeSpec, ...] = tuple(topology.node(n) for n in nodes)
        self.wss_ids = tuple(dict.fromkeys(s.wss for s in self.specs))
        wss_pos = {w: i for i, w in enumerate(self.wss_ids)}
        self.rx_channel = read_only(np.array([s.rx_channel for s in self.specs], dtype=np.int64))
        self.out_port = read_only(np.array([s.out_port for s in self.specs], dtype=np.int64))
        self.wss_index = read_only(np.array([wss_pos[s.wss] for s in self.specs], dtype=np.int64))

    def rank(self, node_id: str) -> int:
        """The rank of `node_id`; ScheduleError naming the job's nodes if it is not one."""
        r = self.rank_of.get(node_id)
        if r is None:
            raise ScheduleError(
                f"node {node_id!r} is not in this schedule; its nodes are "
                f"{', '.join(self.node_ids[:8])}{' …' if len(self.node_ids) > 8 else ''}"
            )
        return r
