"""`SetTrace`: start or stop recording at run time (`oddl trace start|stop`).

The controller switches its own recorder and tells every registered agent over its schedule
stream (``TraceSwitch``); each agent then records into the same folder on its own host. The
emulator host is not reachable from here: it records only when started with ``--trace``.
"""

from __future__ import annotations

import os

from oddl.common.config import TestbedConfig
from oddl.common.errors import OperationRefused
from oddl.common.tracing import DEFAULT_CAPACITY, TRACE
from oddl.common.tracing import session as tracing
from oddl.controller.agent_registry import AgentRegistry
from oddl.protos import oddl_pb2 as pb


def set_trace(cfg: TestbedConfig, registry: AgentRegistry, request: pb.SetTraceRequest
              ) -> pb.SetTraceReply:
    """Carry out one `SetTrace` request (OperationRefused for a start with no folder)."""
    agents = tuple(sorted(registry.agents))
    if request.on:
        if not request.dir:
            raise OperationRefused("a trace start needs the folder to record into; pass "
                                   "`oddl trace start --dir DIR`")
        if not os.path.isabs(request.dir):
            raise OperationRefused(f"trace folder {request.dir!r} is not an absolute path: it "
                                   "names a folder on the controller's and every agent's "
                                   "host, whose working folders differ; give an absolute one "
                                   "(`oddl trace start --dir` makes a relative one absolute)")
        try:
            tracing.start(request.dir, "controller", testbed=cfg.name, testbed_file=cfg.path,
                          capacity=request.buffer_events or DEFAULT_CAPACITY)
        except (OSError, ValueError) as exc:
            raise OperationRefused(
                f"cannot record into {request.dir!r} on the controller's host ({exc}); give a "
                "folder it may create and write") from exc
        path = ""
    else:
        written = TRACE.stop()
        path = str(written) if written else ""
    registry.push(agents, pb.ScheduleEvent(trace=pb.TraceSwitch(
        on=request.on, dir=request.dir, buffer_events=request.buffer_events)))
    return pb.SetTraceReply(controller_file=path, agents=list(agents))
