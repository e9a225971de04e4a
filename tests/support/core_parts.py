"""The controller's core on its own, for unit tests: no gRPC, no processes.

`unconnected_core` builds a `ControllerCore` over a `DeviceManager` that never connected (for
barrier and admission checks that touch no device); `register_all` registers every node's
agent, and `events` takes what the core pushed to a node (its agent's event queue, the push
target the schedule stream would carry).
"""

from __future__ import annotations

from helpers import EMULATED

from oddl.common.config import TestbedConfig, parse_testbed
from oddl.controller.core import ControllerCore
from oddl.controller.devices import DeviceManager
from oddl.protos import oddl_pb2 as pb

NODES = ("n0", "n1", "n2", "n3")


def unconnected_core(text: str | None = None) -> ControllerCore:
    """A core for the emulated testbed file (or `text`), its devices never connected."""
    cfg: TestbedConfig = parse_testbed(text if text is not None else EMULATED.read_text(),
                                       str(EMULATED))
    return ControllerCore(cfg, DeviceManager(cfg))


def register_all(core: ControllerCore, nodes: tuple[str, ...] = NODES) -> dict[str, str]:
    """Register each node's agent (no data address); their sessions, queues emptied.

    The announcer (ADR 0032) tells a running job's nodes their peers from a thread of its
    own; it is settled before the queues are emptied so that no late `JobAssigned` follows.
    """
    sessions = {n: core.register(pb.RegisterAgentRequest(node_id=n)).session for n in nodes}
    core.announcer.settle()  # the registrations' announcement told now, not after the drain
    for n in nodes:
        events(core, n)
    return sessions


def events(core: ControllerCore, node: str) -> list[pb.ScheduleEvent]:
    """Everything pushed to `node` since the last call."""
    out = []
    pending = core.registry.agents[node].events
    while (event := pending.get_nowait()) is not None:
        out.append(event)
    return out


def ready(core: ControllerCore, job_id: str, seq: int, node: str, shape: list[int],
          dtype: str = "<f4", step: int = 0, call: tuple[str, str, int] = ("", "", 0)) -> None:
    """One node's `ReadyCollective`."""
    kind, op, root = call
    core.ready(pb.ReadyCollectiveRequest(job_id=job_id, seq=seq, node_id=node, shape=shape,
                                         dtype=dtype, caller_step=step, kind=kind, op=op,
                                         root=root))


def go_of(core: ControllerCore, node: str) -> pb.CollectiveGo:
    """The one `CollectiveGo` pushed to `node` since the last look (nothing else pushed)."""
    (event,) = events(core, node)
    assert event.WhichOneof("event") == "go", event
    return event.go
