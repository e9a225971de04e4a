"""A gated ring all-reduce on loopback stream links in this process, with one rank started late
on purpose: the trace tests' scenario of an agent that misses its slots."""

from __future__ import annotations

import threading
import time

import numpy as np

from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.plan_run import run_collective
from oddl.agents.links.streams import StreamLink
from oddl.agents.slot_gate import SlotGate
from oddl.controller.scheduling import make_plan
from oddl.protos.schedule_wire import SlotSpec, StepSpec


def ring_steps(n: int, elems: int) -> tuple[StepSpec, ...]:
    plan = make_plan("ring", n, elems)
    return tuple(StepSpec(str(s.op), tuple(s.src.tolist()), tuple(s.dst.tolist()),
                          tuple(s.offset.tolist()), tuple(s.length.tolist())) for s in plan.steps)


def ring_slots(steps: tuple[StepSpec, ...], nodes: tuple[str, ...], slot_s: float
           ) -> tuple[SlotSpec, ...]:
    return tuple(SlotSpec(k, k, k * slot_s, (k + 1) * slot_s,
                          tuple((nodes[s], nodes[d]) for s, d in zip(st.src, st.dst, strict=True)))
                 for k, st in enumerate(steps))


def gated_ring(late_rank: int, delay_s: float, slot_s: float) -> list[object]:
    """A gated ring on loopback streams in this process; `late_rank` starts `delay_s` late."""
    n, elems = 4, 1 << 20
    nodes = tuple(f"n{i}" for i in range(n))
    links = {nd: StreamLink(nd, "127.0.0.1:0") for nd in nodes}
    for link in links.values():
        link.set_peers({p: other.address for p, other in links.items()})
    steps = ring_steps(n, elems)
    t0 = time.time() + 0.3
    outs: list[object] = [None] * n

    def go(r: int) -> None:
        run = CollectiveRun("job-late", 1, r, nodes, steps, ring_slots(steps, nodes, slot_s),
                            t0_local=t0, receive_timeout_s=10.0, collective="ring")
        if r == late_rank:
            time.sleep(delay_s + 0.3)
        outs[r] = run_collective(run, np.full(elems, r + 1, np.float32), links[nodes[r]],
                                 SlotGate())

    threads = [threading.Thread(target=go, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for link in links.values():
        link.close()
    return outs
