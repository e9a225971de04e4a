"""Ranks of a collective as threads of this process, on real stream links on loopback: the
executor tests' common ground (a plan's steps as the agent receives them, the links, and
every rank run at once)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from oddl.agents.links.streams import StreamLink
from oddl.controller.scheduling.plan import Step
from oddl.protos.schedule_wire import StepSpec

L = TypeVar("L", bound=StreamLink)


def step_specs(steps: Sequence[Step]) -> tuple[StepSpec, ...]:
    """A plan's steps as the agent receives them (where each transfer lands included)."""
    return tuple(StepSpec(str(s.op), tuple(s.src.tolist()), tuple(s.dst.tolist()),
                          tuple(s.offset.tolist()), tuple(s.length.tolist()),
                          tuple(s.landing.tolist())) for s in steps)


@contextmanager
def loopback_links(nodes: Sequence[str], make: Callable[[str], L] | None = None,
                   dead: Collection[str] = ()) -> Iterator[dict[str, L]]:
    """A stream link per node on 127.0.0.1 (`make(node)`, a plain `StreamLink` by default),
    each knowing the others; chunks to a node in `dead` go to an address where nothing
    listens. Closed on the way out."""
    build = make if make is not None else (lambda node: StreamLink(node, "127.0.0.1:0"))
    links = {node: build(node) for node in nodes}
    nowhere = StreamLink("nowhere", "127.0.0.1:0")
    nowhere.close()
    try:
        for link in links.values():
            link.set_peers({p: nowhere.address if p in dead else other.address
                            for p, other in links.items()})
        yield links  # type: ignore[misc]
    finally:
        for link in links.values():
            link.close()


def on_every_rank(n: int, go: Callable[[int], object], timeout_s: float = 60.0
                  ) -> list[object]:
    """`go(rank)` for every rank at once, each on a thread of its own; what each returned, or
    the exception it raised, by rank. AssertionError naming the ranks still running after
    `timeout_s`."""
    outs: list[object] = [None] * n

    def run(rank: int) -> None:
        try:
            outs[rank] = go(rank)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outs[rank] = exc

    threads = [threading.Thread(target=run, args=(r,), name=f"rank-{r}") for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"ranks {stuck} still running after {timeout_s} s"
    return outs
