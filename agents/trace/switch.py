"""Switching an agent's recording on and off: at start-up (`--trace DIR`) or when the
controller says so over the schedule stream (``TraceSwitch``, `oddl trace start|stop`).

The agent records on the controller's clock: each event's time on this host's clock
(`oddl.agents.clock.wall`) plus the offset the clock sync measured then; the file carries the
offset and its error bound at the end of the recording.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from oddl.agents.clock import wall as wallclock
from oddl.agents.clock.offset_filter import ClockEstimate
from oddl.common.config import TestbedConfig
from oddl.common.errors import ConfigError
from oddl.common.tracing import DEFAULT_CAPACITY
from oddl.common.tracing import session as tracing
from oddl.protos import oddl_pb2 as pb

logger = logging.getLogger(__name__)


def start(node_id: str, cfg: TestbedConfig, clock: Callable[[], ClockEstimate],
          directory: str | os.PathLike[str], capacity: int = DEFAULT_CAPACITY,
          offset_ns: Callable[[], int] | None = None) -> None:
    """Record this agent's timeline into `directory` (written at `stop`). `offset_ns`: the
    offset without waiting (`ClockSync.offset_ns`), else taken from `clock()`."""

    def error_ns() -> int:
        est = clock()
        return round(est.error_bound_s * 1e9) if est.known else -1

    tracing.start(directory, f"agent-{node_id}", testbed=cfg.name, testbed_file=cfg.path,
                  capacity=capacity, clock=wallclock.now_ns,
                  offset_ns=offset_ns or (lambda: round(clock().offset_s * 1e9)),
                  error_ns=error_ns)


def on_switch(node_id: str, cfg: TestbedConfig, clock: Callable[[], ClockEstimate],
              event: pb.TraceSwitch, offset_ns: Callable[[], int] | None = None) -> None:
    """Carry out the controller's ``TraceSwitch`` (a bad folder is logged, never fatal)."""
    try:
        if event.on:
            start(node_id, cfg, clock, event.dir, event.buffer_events or DEFAULT_CAPACITY,
                  offset_ns)
            logger.info("%s: recording the timeline into %s", node_id, event.dir)
        else:
            path = tracing.stop()
            logger.info("%s: trace written to %s", node_id, path or "(nothing was recording)")
    except (ConfigError, OSError) as exc:
        logger.error("%s: could not switch the trace %s: %s", node_id,
                     "on" if event.on else "off", exc)
