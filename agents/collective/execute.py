"""Running one decoded schedule at this node: the plan through the links, or optinc through
the device, on the caller's array or on a longer work buffer when hosts forward.

A forwarded plan (`oddl.controller.scheduling.forwarding`) uses elements past the caller's:
the relays keep segments there on the way. It runs on a work buffer of the schedule's
`n_elems`, and the caller gets its own elements back, as the direct plan would leave them.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from oddl.agents.collective.context import CollectiveRun, Handoffs
from oddl.agents.collective.optinc import run_optinc
from oddl.agents.collective.plan_run import run_collective
from oddl.agents.links.choice import DataLinks
from oddl.agents.slot_gate import SlotGate
from oddl.common.config import OPTINC, TestbedConfig
from oddl.common.errors import CollectiveError


@dataclass(frozen=True)
class Execution:
    """What running a schedule at this node takes: the node, its links, gate and sender."""

    cfg: TestbedConfig
    node_id: str
    links: DataLinks
    gate: SlotGate
    cancel: threading.Event
    handoffs: Handoffs
    sender: Executor


def execute(run: CollectiveRun, array: np.ndarray, at: Execution, collective: str,
            device: str, n_elems: int) -> np.ndarray:
    """Run the schedule on `array` (in place when it is writeable); return the result."""
    if n_elems <= array.size:
        return _execute(run, array, at, collective, device)
    work = np.zeros(n_elems, dtype=array.dtype)
    work[:array.size] = array.reshape(-1)
    out = _execute(run, work, at, collective, device)[:array.size].reshape(array.shape)
    if array.flags.writeable:
        array[...] = out
    return out


def _execute(run: CollectiveRun, array: np.ndarray, at: Execution, collective: str,
             device: str) -> np.ndarray:
    if run.receive_timeout_s <= 0:
        raise CollectiveError(f"{at.node_id}: the schedule of collective {run.seq} carries "
                              "no receive timeout: the controller runs an older oddl than "
                              "this agent; run the same version on both")
    if collective != OPTINC:
        return run_collective(run, array, at.links.link, at.gate, cancel=at.cancel,
                              handoffs=at.handoffs, inplace=array.flags.writeable,
                              sender=at.sender)
    dev = at.cfg.optinc_device(device or None)
    if dev is None:
        raise CollectiveError(f"{at.node_id}: the schedule uploads to OptINC device "
                              f"{device!r}, which this agent's testbed file does not have; "
                              "start the agent with the emulator host's resolved file")
    if at.links.device_link is None:
        raise CollectiveError(f"{at.node_id}: optinc needs the emulated fabric "
                              "(link = \"fabric\"); this testbed has direct links")
    out = run_optinc(run, array, at.links.device_link, at.gate, dev.id, dev.bits,
                     cancel=at.cancel)
    if array.flags.writeable:
        array[...] = out
    return out
