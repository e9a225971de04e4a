"""The optinc collective laid out in time: an upload slot and a broadcast slot.

The ``optinc`` collective is not a rank-to-rank plan: every node sends its quantised bucket
once to the testbed's OptINC device, which broadcasts the quantised mean
(`oddl.drivers.emulators.optinc`). Its schedule is an upload slot (all nodes to the device at once)
and a broadcast slot that streams while the upload does (cut-through). No transmitter retunes,
so no slot waits for hand-offs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oddl.common.config import OPTINC, OptincDeviceConfig
from oddl.controller.scheduling import TimingModel


@dataclass(frozen=True)
class OptincSlot:
    """One slot of an optinc schedule: times from the schedule start, (src, dst, bytes) flows."""

    index: int
    step: int
    start_s: float
    data_start_s: float
    end_s: float
    flows: tuple[tuple[str, str, int], ...]
    guard_s: float = 0.0
    retuned: bool = False


@dataclass(frozen=True)
class OptincSchedule:
    """The optinc collective laid out for one bucket size: upload, then broadcast.

    Slot 0: every node sends its levels to the device at once (each on its own input), after a
    guard of the clock skew; hold = 8·bytes/line rate. Slot 1: the device's splitter T sends
    the quantised mean to every node; the optics compute while the light passes, so the
    broadcast streams alongside the upload, ``latency`` later (same hold). Makespan = one
    pass: guard + hold + margin + latency.
    """

    device: str
    n_elems: int
    itemsize: int
    level_bytes: int
    hold_s: float
    slots: tuple[OptincSlot, OptincSlot]
    collective: str = OPTINC
    reconfigurations: int = 0

    @property
    def makespan_s(self) -> float:
        """End of the broadcast slot."""
        return self.slots[1].end_s

    @property
    def guard_total_s(self) -> float:
        """The skew guard before the upload."""
        return sum(s.guard_s for s in self.slots)

    @property
    def efficiency(self) -> float:
        """hold / (hold + guard) of the upload."""
        total = self.hold_s + self.guard_total_s
        return self.hold_s / total if total > 0 else 1.0


def optinc_schedule(nodes: Sequence[str], device: OptincDeviceConfig, timing: TimingModel,
                    n_elems: int, itemsize: int) -> OptincSchedule:
    """The two-slot schedule of an optinc all-reduce of `n_elems` elements per node."""
    level_bytes = n_elems * device.level_itemsize
    hold = timing.hold_s(level_bytes)
    latency = device.latency_us * 1e-6
    up_data = timing.skew_s
    up_end = up_data + hold + timing.slot_margin_s
    up = OptincSlot(0, 0, 0.0, up_data, up_end,
                    tuple((n, device.id, level_bytes) for n in nodes), guard_s=timing.skew_s)
    down = OptincSlot(1, 1, up_data + latency, up_data + latency, up_end + latency,
                      tuple((device.id, n, level_bytes) for n in nodes))
    return OptincSchedule(device.id, n_elems, itemsize, level_bytes, hold, (up, down))
