"""What the scheduler plans on: the wavelength grid, the TT-FR fabric and the device timing.

The fabric is single-stage TT-FR (docs/sources.md §1.2): every node has one tunable transmitter and
one fixed receiver that owns a channel. All transmitter fibres of a WSS are combined into its
common in-port ``"in"``; the WSS routes each channel to an out-port, and out-port k feeds one
node's receiver. Node s reaches node d by tuning its transmitter to ``rx_channel(d)``.

Pure values: no I/O, no clock. Invariants are checked on construction and raise
`ScheduleError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from oddl.common.errors import ScheduleError

IN_PORT = "in"
"""Name of a WSS's common in-port, where every transmitter fibre of that WSS enters."""


@dataclass(frozen=True)
class Grid:
    """A fixed frequency grid: channel n (1-based) is at ``first_thz + (n-1)·spacing``."""

    first_thz: float
    spacing_ghz: float
    channels: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.first_thz) and self.first_thz > 0):
            raise ScheduleError(
                f"grid first_thz must be a positive frequency; got {self.first_thz}"
            )
        if not (math.isfinite(self.spacing_ghz) and self.spacing_ghz > 0):
            raise ScheduleError(
                f"grid spacing_ghz must be positive; got {self.spacing_ghz}, e.g. use 50.0 or 100.0"
            )
        if self.channels < 1:
            raise ScheduleError(f"grid needs at least 1 channel; got {self.channels}")

    def frequency_thz(self, ch: int) -> float:
        """Return the centre frequency of channel `ch` (1-based)."""
        if not 1 <= ch <= self.channels:
            raise ScheduleError(f"channel {ch} is off the grid; use 1..{self.channels}")
        return self.first_thz + (ch - 1) * self.spacing_ghz / 1000.0

    def channel_of(self, freq_thz: float, tolerance_ghz: float = 1.0) -> int | None:
        """Return the channel centred within `tolerance_ghz` of `freq_thz`, or None if off-grid."""
        n = round((freq_thz - self.first_thz) * 1000.0 / self.spacing_ghz) + 1
        if not 1 <= n <= self.channels:
            return None
        if abs(self.frequency_thz(n) - freq_thz) * 1000.0 > tolerance_ghz:
            return None
        return n


@dataclass(frozen=True)
class NodeSpec:
    """One host: its transmitter enters `wss` at ``"in"``; its receiver hangs on `out_port`."""

    id: str
    transmitter: str
    rx_channel: int
    wss: str
    out_port: int


@dataclass(frozen=True)
class WssSpec:
    """A 1×K wavelength-selective switch: common in-port ``"in"``, out-ports 1..`ports`."""

    id: str
    ports: int


@dataclass(frozen=True)
class Circuit:
    """One light path for one slot: src's transmitter on `channel` through `wss` to dst."""

    src: str
    transmitter: str
    channel: int
    wss: str
    in_port: str
    out_port: int
    dst: str


@dataclass(frozen=True)
class Topology:
    """The grid, the nodes and the WSS devices of one fabric, with lookup by id."""

    grid: Grid
    nodes: tuple[NodeSpec, ...]
    wss: tuple[WssSpec, ...]
    _node_index: dict[str, int] = field(init=False, repr=False, compare=False)
    _wss_index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "wss", tuple(self.wss))
        wss_index = _unique_index((w.id for w in self.wss), "WSS")
        node_index = _unique_index((n.id for n in self.nodes), "node")
        _unique_index((n.transmitter for n in self.nodes), "transmitter")
        for w in self.wss:
            if w.ports < 1:
                raise ScheduleError(f"WSS {w.id!r} needs at least 1 out-port; got {w.ports}")
        channel_owner: dict[tuple[str, int], str] = {}
        port_owner: dict[tuple[str, int], str] = {}
        for n in self.nodes:
            if n.wss not in wss_index:
                raise ScheduleError(
                    f"node {n.id!r} hangs on unknown WSS {n.wss!r}; known: {_names(wss_index)}"
                )
            ports = self.wss[wss_index[n.wss]].ports
            if not 1 <= n.out_port <= ports:
                raise ScheduleError(
                    f"node {n.id!r} is on out-port {n.out_port} of {n.wss!r}, which has "
                    f"out-ports 1..{ports}"
                )
            if not 1 <= n.rx_channel <= self.grid.channels:
                raise ScheduleError(
                    f"node {n.id!r} receives on channel {n.rx_channel}, off the grid; "
                    f"use 1..{self.grid.channels}"
                )
            other = port_owner.setdefault((n.wss, n.out_port), n.id)
            if other != n.id:
                raise ScheduleError(
                    f"nodes {other!r} and {n.id!r} both hang on out-port {n.out_port} of "
                    f"{n.wss!r}; give each node its own out-port"
                )
            other = channel_owner.setdefault((n.wss, n.rx_channel), n.id)
            if other != n.id:
                raise ScheduleError(
                    f"nodes {other!r} and {n.id!r} both receive on channel {n.rx_channel} of "
                    f"{n.wss!r}; receive channels must be unique per WSS"
                )
        object.__setattr__(self, "_node_index", node_index)
        object.__setattr__(self, "_wss_index", wss_index)

    @property
    def node_ids(self) -> tuple[str, ...]:
        """Node ids in declaration order."""
        return tuple(n.id for n in self.nodes)

    def node(self, node_id: str) -> NodeSpec:
        """Return the node called `node_id`."""
        i = self._node_index.get(node_id)
        if i is None:
            raise ScheduleError(f"unknown node {node_id!r}; known: {_names(self._node_index)}")
        return self.nodes[i]

    def wss_spec(self, wss_id: str) -> WssSpec:
        """Return the WSS called `wss_id`."""
        i = self._wss_index.get(wss_id)
        if i is None:
            raise ScheduleError(f"unknown WSS {wss_id!r}; known: {_names(self._wss_index)}")
        return self.wss[i]

    @classmethod
    def single_wss(
        cls,
        n_nodes: int,
        grid: Grid | None = None,
        *,
        wss_id: str = "wss0",
        node_prefix: str = "node",
        transmitter_prefix: str = "tx",
    ) -> Topology:
        """Build a one-WSS fabric for tests and benchmarks: node i on channel i+1, port i+1.

        Nodes are ``node0 .. node{n-1}`` with transmitters ``tx0 ..``. Without `grid`, a 50 GHz
        grid from 191.3 THz with exactly `n_nodes` channels is used (an abstract grid: beyond
        ~96 channels it leaves the C band, which the scheduler does not care about).
        """
        if n_nodes < 1:
            raise ScheduleError(f"a fabric needs at least 1 node; got {n_nodes}")
        if grid is None:
            grid = Grid(first_thz=191.3, spacing_ghz=50.0, channels=n_nodes)
        if grid.channels < n_nodes:
            raise ScheduleError(
                f"{n_nodes} nodes on one WSS need {n_nodes} receive channels; the grid has "
                f"{grid.channels}, use a grid with channels >= {n_nodes}"
            )
        nodes = tuple(
            NodeSpec(
                id=f"{node_prefix}{i}",
                transmitter=f"{transmitter_prefix}{i}",
                rx_channel=i + 1,
                wss=wss_id,
                out_port=i + 1,
            )
            for i in range(n_nodes)
        )
        return cls(grid=grid, nodes=nodes, wss=(WssSpec(id=wss_id, ports=n_nodes),))


@dataclass(frozen=True)
class TimingModel:
    """Device timing the scheduler plans with (seconds; line rate in bit/s).

    Guard (docs/sources.md §1.2, step 4): each time a transmitter changes destination the slot
    starts with ``t_g = t_tune + t_skew + t_CDR``; here the command budget to reach the
    transmitter is added: ``guard_s = command_s + tune_s + skew_s + cdr_s``. A slot where no
    transmitter retunes still starts with ``skew_s`` so clock skew cannot overlap slots.
    Hold time of a flow is ``t_h = 8·bytes / line_rate_bps``; every data window adds
    `slot_margin_s` (receive, reduce, start the next send). `wss_settle_s` is job scale: the
    WSS table is set before the collective starts and is not part of any slot.
    """

    tune_s: float
    skew_s: float
    cdr_s: float
    command_s: float
    wss_settle_s: float
    slot_margin_s: float
    line_rate_bps: float

    def __post_init__(self) -> None:
        for name in ("tune_s", "skew_s", "cdr_s", "command_s", "wss_settle_s", "slot_margin_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ScheduleError(f"timing {name} must be a finite time >= 0 s; got {v}")
        if not (math.isfinite(self.line_rate_bps) and self.line_rate_bps > 0):
            raise ScheduleError(
                f"timing line_rate_bps must be positive; got {self.line_rate_bps}, e.g. 100e9"
            )

    @property
    def guard_s(self) -> float:
        """Guard before a slot in which some transmitter retunes: command+tune+skew+CDR."""
        return self.command_s + self.tune_s + self.skew_s + self.cdr_s

    def hold_s(self, n_bytes: float) -> float:
        """Return the time `n_bytes` occupy a circuit at the line rate."""
        return 8.0 * n_bytes / self.line_rate_bps


def _unique_index(ids: Iterable[str], what: str) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, x in enumerate(ids):
        if x in index:
            raise ScheduleError(f"{what} id {x!r} appears twice; ids must be unique")
        index[x] = i
    return index


def _names(index: dict[str, int], limit: int = 8) -> str:
    names = list(index)
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f", … ({len(names)} in all)" if len(names) > limit else ""
    return (shown + more) or "none"
