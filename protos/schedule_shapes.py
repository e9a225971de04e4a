"""What the schedule encoders read of the scheduling core's schedules, as protocols.

`protos` sits below `controller` in the layer contract, so the codec cannot import the
core's `Schedule` or the controller's `oddl.controller.optinc_schedule.OptincSchedule`; it states
the attributes it reads instead, and any object that has them (the core's, a test's) encodes.
Read-only properties, so frozen dataclasses match.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class StepShape(Protocol):
    """A plan step: equally long int arrays of transfers and the op."""

    @property
    def src(self) -> np.ndarray: ...
    @property
    def dst(self) -> np.ndarray: ...
    @property
    def offset(self) -> np.ndarray: ...
    @property
    def length(self) -> np.ndarray: ...
    @property
    def op(self) -> object: ...
    @property
    def recv_offset(self) -> np.ndarray | None: ...


class PlanShape(Protocol):
    """A collective plan: its name, buffer length and steps."""

    @property
    def collective(self) -> str: ...
    @property
    def n_elems(self) -> int: ...
    @property
    def steps(self) -> Sequence[StepShape]: ...


class CircuitShape(Protocol):
    """One light path of a slot."""

    @property
    def src(self) -> str: ...
    @property
    def dst(self) -> str: ...
    @property
    def transmitter(self) -> str: ...
    @property
    def channel(self) -> int: ...
    @property
    def wss(self) -> str: ...
    @property
    def in_port(self) -> str: ...
    @property
    def out_port(self) -> int: ...


class RetuneShape(Protocol):
    """A transmitter that retunes at the start of a slot."""

    @property
    def transmitter(self) -> str: ...


class TimedSlotShape(Protocol):
    """What every slot has: its index, its plan step and its times."""

    @property
    def index(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def start_s(self) -> float: ...
    @property
    def data_start_s(self) -> float: ...
    @property
    def end_s(self) -> float: ...


class SlotShape(TimedSlotShape, Protocol):
    """One slot of a schedule: absolute times, its circuits, their bytes and retunes."""

    @property
    def bytes(self) -> np.ndarray: ...
    def circuits(self) -> Sequence[CircuitShape]:
        """The slot's circuits, in flow order."""
    def retunes(self) -> Sequence[RetuneShape]:
        """The transmitters that retune at the start of the slot."""


class GridShape(Protocol):
    """The wavelength grid."""

    def frequency_thz(self, ch: int) -> float:
        """The centre frequency of channel `ch`."""


class TopologyShape(Protocol):
    """The fabric, as far as the encoder needs it."""

    @property
    def grid(self) -> GridShape: ...


class TotalsShape(Protocol):
    """What every schedule reports: element size and its time totals."""

    @property
    def itemsize(self) -> int: ...
    @property
    def guard_total_s(self) -> float: ...
    @property
    def makespan_s(self) -> float: ...
    @property
    def efficiency(self) -> float: ...


class ScheduleShape(TotalsShape, Protocol):
    """A plan laid out in time on a topology (`oddl.controller.scheduling.Schedule`)."""

    @property
    def plan(self) -> PlanShape: ...
    @property
    def topology(self) -> TopologyShape: ...
    @property
    def slots(self) -> Sequence[SlotShape]: ...
    @property
    def start_s(self) -> float: ...
    @property
    def reconfigurations(self) -> int: ...


class OptincSlotShape(TimedSlotShape, Protocol):
    """One slot of an optinc schedule: times from the schedule start, (src, dst, bytes)."""

    @property
    def flows(self) -> Sequence[tuple[str, str, int]]: ...


class OptincScheduleShape(TotalsShape, Protocol):
    """The optinc collective laid out for one bucket
    (`oddl.controller.optinc_schedule.OptincSchedule`)."""

    @property
    def n_elems(self) -> int: ...
    @property
    def slots(self) -> Sequence[OptincSlotShape]: ...
