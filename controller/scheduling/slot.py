"""One slot of a TT-FR schedule (`Slot`), and what it means for a node (`NodeEvent`) and a
transmitter (`Retune`). Laid out by `oddl.controller.scheduling.scheduler.schedule_plan`. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from oddl.controller.scheduling.job_nodes import JobNodes
from oddl.controller.scheduling.topology import IN_PORT, Circuit

UNKNOWN_CHANNEL = 0
"""Held-channel value of a transmitter whose channel is unknown (channels are 1-based)."""


@dataclass(frozen=True)
class Retune:
    """A transmitter changing channel at the start of a slot (`from_channel` None: unknown)."""

    node: str
    transmitter: str
    from_channel: int | None
    to_channel: int


@dataclass(frozen=True)
class NodeEvent:
    """One send or receive of one node, for that node's agent (times in seconds)."""

    slot: int
    step: int
    kind: str
    """``"send"`` or ``"recv"``."""
    peer: str
    bytes: int
    channel: int
    """The channel the light travels on (the receiver's channel)."""
    start_s: float
    """Start of the slot: a transmitter that must retune does so from here."""
    data_start_s: float
    end_s: float


@dataclass(frozen=True, eq=False, slots=True)
class Slot:
    """One round of circuits: a matching of flows between `data_start_s` and `end_s`.

    Flow i goes from rank ``src_rank[i]`` to ``dst_rank[i]`` carrying ``bytes[i]``. The
    arrays are read-only and may be shared with other slots and with the plan.
    """

    index: int
    step: int
    round: int
    """Round within the step (0 unless the step was split by edge colouring)."""
    start_s: float
    data_start_s: float
    end_s: float
    guard_s: float
    hold_s: float
    src_rank: np.ndarray = field(repr=False)
    dst_rank: np.ndarray = field(repr=False)
    elems: np.ndarray = field(repr=False)
    """Elements per flow; ``bytes = elems · itemsize``."""
    itemsize: int = field(repr=False)
    retune_flows: np.ndarray = field(repr=False)
    """Indices of the flows whose transmitter retunes at the start of this slot."""
    retune_from: np.ndarray = field(repr=False)
    """Channel each of those transmitters held before (0 = unknown)."""
    _job: JobNodes = field(repr=False)

    @property
    def bytes(self) -> np.ndarray:
        """Bytes per flow (int64 array)."""
        return self.elems * self.itemsize

    @property
    def n_flows(self) -> int:
        """Number of flows (circuits) in the slot."""
        return int(self.src_rank.shape[0])

    @property
    def retuned(self) -> bool:
        """Whether any transmitter retunes at the start of this slot."""
        return bool(self.retune_flows.shape[0])

    def channels(self) -> np.ndarray:
        """Return the channel of each flow (its receiver's channel)."""
        return self._job.rx_channel[self.dst_rank]

    def circuits(self) -> list[Circuit]:
        """Return the slot's circuits, built from the topology."""
        specs, rx = self._job.specs, self._job.rx_channel
        out = []
        for s, d in zip(self.src_rank.tolist(), self.dst_rank.tolist(), strict=True):
            a, b = specs[s], specs[d]
            out.append(Circuit(a.id, a.transmitter, int(rx[d]), b.wss, IN_PORT, b.out_port, b.id))
        return out

    def retunes(self) -> list[Retune]:
        """Return the transmitters that retune at the start of this slot."""
        specs, rx = self._job.specs, self._job.rx_channel
        out = []
        for i, frm in zip(self.retune_flows.tolist(), self.retune_from.tolist(), strict=True):
            a = specs[int(self.src_rank[i])]
            to = int(rx[self.dst_rank[i]])
            out.append(Retune(a.id, a.transmitter, None if frm == UNKNOWN_CHANNEL else frm, to))
        return out
