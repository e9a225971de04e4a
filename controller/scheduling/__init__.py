"""The pure scheduling core: collective plans and the TT-FR slot scheduler.

No I/O, no clocks, no threads: time is a value passed in. The controller, the agents and the
1024-node simulator all use this same code.

    plan = make_plan("ring", 4, 1_000_000)
    sched = schedule_plan(plan, topo.node_ids, topo, timing, itemsize=4)
    sched.check_contention_free()
"""

from oddl.controller.scheduling.classic_allreduce import halving_doubling_allreduce, ring_allreduce
from oddl.controller.scheduling.link_budget import LinkBudget, link_budget
from oddl.controller.scheduling.matchings import bipartite_edge_colouring
from oddl.controller.scheduling.optinc import optinc_allreduce, optinc_cascade, optinc_layout
from oddl.controller.scheduling.param_server import parameter_server_allreduce
from oddl.controller.scheduling.plan import Op, Plan, Step, execute_plan, validate_plan
from oddl.controller.scheduling.registry import (
    COLLECTIVES,
    CollectiveBuilder,
    make_plan,
    register_collective,
)
from oddl.controller.scheduling.scheduler import Schedule, schedule_plan
from oddl.controller.scheduling.slot import NodeEvent, Retune, Slot
from oddl.controller.scheduling.topology import (
    IN_PORT,
    Circuit,
    Grid,
    NodeSpec,
    TimingModel,
    Topology,
    WssSpec,
)
from oddl.controller.scheduling.totient import (
    candidate_jumps,
    circulant_diameter,
    select_permutations,
    totientperms_allreduce,
)
from oddl.controller.scheduling.wrht import WrhtWavelengthPlan, wrht_allreduce, wrht_wavelength_plan

__all__ = [
    "COLLECTIVES",
    "IN_PORT",
    "Circuit",
    "CollectiveBuilder",
    "Grid",
    "LinkBudget",
    "NodeEvent",
    "NodeSpec",
    "Op",
    "Plan",
    "Retune",
    "Schedule",
    "Slot",
    "Step",
    "TimingModel",
    "Topology",
    "WrhtWavelengthPlan",
    "WssSpec",
    "bipartite_edge_colouring",
    "candidate_jumps",
    "circulant_diameter",
    "execute_plan",
    "halving_doubling_allreduce",
    "link_budget",
    "make_plan",
    "optinc_allreduce",
    "optinc_cascade",
    "optinc_layout",
    "parameter_server_allreduce",
    "register_collective",
    "ring_allreduce",
    "schedule_plan",
    "select_permutations",
    "totientperms_allreduce",
    "validate_plan",
    "wrht_allreduce",
    "wrht_wavelength_plan",
]

import oddl.controller.scheduling.topoopt  # noqa: E402,F401  (registers "topoopt")
