"""A gated ring all-reduce on loopback stream links in this process, with one rank started late
on purpose: the trace tests' scenario of an agent that misses its slots."""

from __future__ import annotations

import time

import numpy as np
from loopback_ranks import loopback_links, on_every_rank, step_specs

from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.plan_run import run_collective
from oddl.agents.slot_gate import SlotGate
from oddl.controller.scheduling import make_plan
from oddl.protos.schedule_wire import SlotSpec, StepSpec


def ring_steps(n: int, elems: int) -> tuple[StepSpec, ...]:
    return step_specs(make_plan("ring", n, elems).steps)


def ring_slots(steps: tuple[StepSpec, ...], nodes: tuple[str, ...], slot_s: float
           ) -> tuple[SlotSpec, ...]:
    return tuple(SlotSpec(k, k, k * slot_s, (k + 1) * slot_s,
                          tuple((nodes[s], nodes[d]) for s, d in zip(st.src, st.dst, strict=True)))
                 for k, st in enumerate(steps))


def gated_ring(late_rank: int, delay_s: float, slot_s: float) -> list[object]:
    """A gated ring on loopback streams in this process; `late_rank` starts `delay_s` late."""
    n, elems = 4, 1 << 20
    nodes = tuple(f"n{i}" for i in range(n))
    steps = ring_steps(n, elems)
    t0 = time.time() + 0.3
    with loopback_links(nodes) as links:
        def go(r: int) -> object:
            run = CollectiveRun("job-late", 1, r, nodes, steps,
                                ring_slots(steps, nodes, slot_s), t0_local=t0,
                                receive_timeout_s=10.0, collective="ring")
            if r == late_rank:
                time.sleep(delay_s + 0.3)
            return run_collective(run, np.full(elems, r + 1, np.float32), links[nodes[r]],
                                  SlotGate())

        return on_every_rank(n, go)
