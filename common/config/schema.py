"""The testbed file's schema: what a validated testbed is (nodes, devices and their driver
resources, fibres, the wavelength grid, the device timing, the control-plane addresses), as
frozen dataclasses, and the names its values may take.

Loading, validating and writing the file: :mod:`oddl.common.config`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar

from oddl.common.config.channel_plan import FixedPlan
from oddl.common.errors import ConfigError

EMULATED = "emulated"
"""Resource value of a device that the emulator host starts (`oddl emulate testbed`)."""

DEVICE_KINDS = ("itla", "wss", "powermeter", "optinc", "ocs")
OCS = "ocs"
"""Kind of an optical circuit switch: an N×N unit, ingress ports 1..N, egress N+1..2N."""
OPTINC = "optinc"
"""Kind of an OptINC in-network averaging device (served by the emulated fabric, no driver)."""
OPTINC_MAX_INPUTS = 64  # oddl.offline.optinc.model.MAX_INPUTS (not imported: keeps this light)
LINK_KINDS = ("fabric", "direct")
TRANSPORTS = ("streams", "relay", "curve")


@dataclass(frozen=True)
class GridConfig:
    """The fixed frequency grid: channel n is at first_thz + (n-1)*spacing."""

    first_thz: float = 193.1
    spacing_ghz: float = 100.0
    channels: int = 48

    @cached_property
    def plan(self) -> FixedPlan:
        """The grid as a fixed channel plan numbered from 1."""
        return FixedPlan(1, self.first_thz, self.spacing_ghz, self.channels)

    def frequency_thz(self, channel: int) -> float:
        """Centre frequency of `channel` (1-based)."""
        return self.plan.centre_thz(channel)

    def channel_of(self, frequency_thz: float, tolerance_ghz: float = 1.0) -> int | None:
        """The channel centred within `tolerance_ghz` of a frequency, or None if off-grid."""
        return self.plan.channel_at(frequency_thz, tolerance_ghz)


@dataclass(frozen=True)
class TimingConfig:
    """Device and control-plane timing; the emulators take these times, the scheduler plans with them."""

    laser_tune_ms: float = 2.0
    wss_settle_ms: float = 100.0
    clock_skew_us: float = 100.0
    cdr_lock_us: float = 10.0
    command_ms: float = 1.0
    slot_margin_us: float = 500.0
    launch_margin_ms: float = 5.0
    receive_timeout_ms: float = 2000.0
    standing_margin_ms: float = 2.0
    """A repeated collective whose start the agents agree among themselves, without the
    controller's barrier (a standing schedule, decision record 0007): one that retunes starts
    this long after its last node is ready, and the controller, told by rank 0, executes its
    retunes (0010); one that retunes nothing starts at once (0022). 0 = no standing schedules:
    every collective goes through the controller's barrier."""


@dataclass(frozen=True)
class FabricConfig:
    """The data plane: the emulated optical fabric, or direct host links (lab)."""

    line_rate_gbps: float = 10.0
    link: str = "fabric"
    address: str = ""
    listen: str = "127.0.0.1:0"
    transport: str = "streams"
    """How bytes move: "streams" (agent to agent over TCP; on the emulated fabric where the
    light table says the light goes; with [security] certs the streams are mutually
    authenticated with the nodes' keys), "relay" (every frame through the fabric process), or
    "curve" (direct links as ZeroMQ CURVE sockets: encrypted, needs [security] certs, slower)."""
    light_table: str = ""
    """The emulator host's light table (shared memory), filled in the resolved file."""


@dataclass(frozen=True)
class AgentConfig:
    """How the agents run their slot gate (the thread that releases sends at slot edges)."""

    gate_priority: int = 0
    """SCHED_FIFO priority for the gate thread (1-99); 0 = normal scheduling. Needs root or
    CAP_SYS_NICE; where not permitted the agent says so in its status and log."""
    gate_cpu: int = -1
    """Pin the gate thread to this CPU; -1 = any CPU."""


@dataclass(frozen=True)
class ControllerConfig:
    """Where the controller listens and how agents reach it."""

    listen: str = "127.0.0.1:0"
    address: str = ""
    heartbeat_s: float = 1.0
    state: str = ""
    """SQLite file of jobs, verified device state and events ("" = not persisted)."""
    device_check_s: float = 2.0
    """How often the controller reads the devices back and restores one that lost its
    configuration (a power cycle, a serial link that dropped); 0 = never."""


@dataclass(frozen=True)
class SecurityConfig:
    """TLS with client certificates on gRPC and CURVE on ZeroMQ, from `oddl certs init`."""

    certs: str = ""
    """Folder written by `oddl certs init` ("" = no security, for emulated testbeds)."""
    operator: str = "operator"
    """Which operator certificate the CLI uses."""

    @property
    def enabled(self) -> bool:
        """True when the testbed runs in secure mode."""
        return bool(self.certs)


@dataclass(frozen=True)
class NodeConfig:
    """One training host: its tunable transmitter and its receiver's channel on a WSS, its
    fixed-wavelength ports on circuit switches (``ports``), or both."""

    id: str
    host: str
    transmitter: str
    """The ITLA device of its tunable transmitter ("": the host has none, only `ports`)."""
    rx_channel: int
    """Its receiver's channel on the WSS (0 without a transmitter)."""
    data_port: int = 0
    ports: int = 0
    """Fixed transceivers p1..pN whose fibres go to circuit switches (``n0.p1.tx``)."""

    @property
    def on_wss(self) -> bool:
        """True when the host has a tunable transmitter on a WSS."""
        return bool(self.transmitter)


@dataclass(frozen=True)
class DeviceConfig:
    """One device and the resource its driver opens."""

    id: str
    kind: str
    resource: str
    baud: int = 0
    timeout_s: float = 0.5
    ports: int = 0
    channels: int = 0
    power_dbm: float = 10.0
    power_range_dbm: tuple[float, float] = (0.0, 13.0)
    attenuation_range_db: tuple[float, float] = (0.0, 25.0)
    channels_allowed: tuple[int, int] = (0, 0)
    serial: str = ""
    faults: Mapping[str, Any] = field(default_factory=dict)
    lock_timeout_s: float = 5.0
    """ITLA: how long a tune may take to lock (the module's datasheet; seconds on real ones)."""
    enable_timeout_s: float = 30.0
    """ITLA: how long enabling the output may take."""
    startup_timeout_s: float = 10.0
    """ITLA: how long commands refused as "initialising" (CII) after a reset are retried."""
    module_plan: FixedPlan | None = None
    """WSS: the module's own fixed-grid channel plan, when it does not number channels as the
    testbed's grid does (the driver maps each testbed channel onto it by frequency)."""
    size: int = 0
    """OCS: an N×N unit (ingress ports 1..N, egress N+1..2N)."""
    switch_ms: float = 25.0
    """OCS: the time one connection takes to switch (a Polatis unit: 25–50 ms)."""

    @property
    def emulated(self) -> bool:
        """True when the emulator host serves this device."""
        return self.resource == EMULATED


@dataclass(frozen=True)
class OptincDeviceConfig:
    """An OptINC device: N inputs, b-bit levels, trained MZI phases; part of the emulated fabric.

    Kept apart from `TestbedConfig.devices`: the controller opens no driver for it (the
    emulator host runs it inside the fabric, `oddl.drivers.emulators.optinc`).
    """

    id: str
    resource: str
    inputs: int
    bits: int
    phases: str = ""
    """Absolute path of the phase file ("" = the emulator host trains one at start-up)."""
    max_elements: int = 1 << 24
    """Largest bucket (elements per node) the device accepts."""
    noise_rad: float | None = None
    """Phase noise of the device (None = what the phase file was trained for)."""
    latency_us: float = 1.0
    """Input to output delay of the device (P, MZI mesh, detection, splitter T)."""
    kind: str = OPTINC

    @property
    def emulated(self) -> bool:
        """True when the emulator host serves this device (the only kind that exists)."""
        return self.resource == EMULATED

    @property
    def level_itemsize(self) -> int:
        """Bytes per level on the wire: 1 up to 8 bits, else 2."""
        return 1 if self.bits <= 8 else 2


@dataclass(frozen=True)
class Endpoint:
    """One end of a fibre: `node.tx`, `node.rx`, `device.in` or `device.<port number>`."""

    owner: str
    port: str

    def __str__(self) -> str:
        return f"{self.owner}.{self.port}"


@dataclass(frozen=True)
class FibreConfig:
    """A fibre from one endpoint to another (light travels src → dst)."""

    src: Endpoint
    dst: Endpoint


PORT_END = re.compile(r"^p(\d+)\.(tx|rx)$")
"""A host port's end as a fibre names it after the node: ``p1.tx``, ``p4.rx``."""


@dataclass(frozen=True)
class PortLink:
    """A host port through a circuit switch: its tx enters `ingress`, its rx hangs on `egress`."""

    node: str
    port: int
    switch: str
    ingress: int
    egress: int


@dataclass(frozen=True)
class Attachment:
    """Where a node hangs on the optical core: its tx enters `wss` at 'in', its rx hangs on `out_port`."""

    wss: str
    out_port: int


@dataclass(frozen=True)
class DeviceHostConfig:
    """A process that drives some transmitters on its own machine (a rack's lasers) for the
    controller (`oddl devices host`, decision record 0036); `address`: host:port."""

    id: str
    address: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class TestbedConfig:
    """A validated testbed file."""

    __test__ = False  # not a pytest test class

    path: str
    name: str
    grid: GridConfig
    timing: TimingConfig
    fabric: FabricConfig
    controller: ControllerConfig
    nodes: tuple[NodeConfig, ...]
    devices: tuple[DeviceConfig, ...]
    fibres: tuple[FibreConfig, ...]
    seed: int = 0
    security: SecurityConfig = field(default_factory=SecurityConfig)
    optinc: tuple[OptincDeviceConfig, ...] = ()
    """OptINC in-network averaging devices (`kind = "optinc"` entries of [[devices]])."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    device_hosts: tuple[DeviceHostConfig, ...] = ()
    """Device hosts (`[[device_hosts]]`); a device in none is driven by the controller."""

    def device_host(self, device_id: str) -> DeviceHostConfig | None:
        """The device host that owns this device, or None (the controller drives it)."""
        return self._index["hosts"].get(device_id)

    def node(self, node_id: str) -> NodeConfig:
        """The node with this id, or ConfigError listing the known ids."""
        return self._index["nodes"].get(node_id) or _by_id(self.path, "node", node_id, self.nodes)

    def device(self, device_id: str) -> DeviceConfig:
        """The device with this id, or ConfigError listing the known ids."""
        return (self._index["devices"].get(device_id)
                or _by_id(self.path, "device", device_id, self.devices))

    @cached_property
    def _index(self) -> dict[str, dict[str, Any]]:
        """Lookups by id, built once: a slot edge of a thousand lasers asks a thousand times."""
        return {"nodes": {n.id: n for n in self.nodes},
                "devices": {d.id: d for d in self.devices},
                "hosts": {d: h for h in self.device_hosts for d in h.devices},
                "attachments": _attachments(self),
                "node_of": {n.transmitter: n.id for n in self.nodes if n.transmitter}}

    def node_of(self, transmitter: str) -> str | None:
        """The node whose transmitter this is, or None."""
        return self._index["node_of"].get(transmitter)

    def optinc_device(self, device_id: str | None = None) -> OptincDeviceConfig | None:
        """The OptINC device with this id (default: the first), or None if there is none."""
        for d in self.optinc:
            if device_id is None or d.id == device_id:
                return d
        return None

    def devices_of(self, kind: str) -> tuple[DeviceConfig, ...]:
        """All devices of one kind, in file order."""
        return tuple(d for d in self.devices if d.kind == kind)

    def attachment(self, node_id: str) -> Attachment:
        """The WSS and out-port that serve a node (derived from the fibres)."""
        return self._index["attachments"][node_id]

    def port_links(self) -> tuple[PortLink, ...]:
        """Every wired host port on a circuit switch, in node and port order."""
        ins: dict[tuple[str, int], tuple[str, int]] = {}
        outs: dict[tuple[str, int], int] = {}
        for f in self.fibres:
            src, dst = PORT_END.match(f.src.port), PORT_END.match(f.dst.port)
            if src is not None and src.group(2) == "tx":
                ins[(f.src.owner, int(src.group(1)))] = (f.dst.owner, int(f.dst.port))
            elif dst is not None and dst.group(2) == "rx":
                outs[(f.dst.owner, int(dst.group(1)))] = int(f.src.port)
        order = {n.id: i for i, n in enumerate(self.nodes)}
        return tuple(PortLink(node, port, switch, ingress, outs[(node, port)])
                     for (node, port), (switch, ingress) in sorted(
                         ins.items(), key=lambda kv: (order[kv[0][0]], kv[0][1]))
                     if (node, port) in outs)

    def meter_taps(self) -> dict[tuple[str, int], tuple[str, int]]:
        """Power-meter taps: (meter id, meter channel) → (wss id, out-port) it watches."""
        taps: dict[tuple[str, int], tuple[str, int]] = {}
        for f in self.fibres:
            dev = self._kind(f.dst.owner)
            if dev == "powermeter" and self._kind(f.src.owner) == "wss":
                taps[(f.dst.owner, int(f.dst.port))] = (f.src.owner, int(f.src.port))
        return taps

    def with_resources(self, resources: Mapping[str, str], fabric_address: str = "",
                       light_table: str = "") -> TestbedConfig:
        """A copy with device resources (and the fabric address and light table) replaced,
        e.g. emulator URLs."""
        devices = tuple(replace(d, resource=resources.get(d.id, d.resource)) for d in self.devices)
        fabric = replace(self.fabric, address=fabric_address or self.fabric.address,
                         light_table=light_table or self.fabric.light_table)
        return replace(self, devices=devices, fabric=fabric)

    def _kind(self, owner: str) -> str:
        dev = self._index["devices"].get(owner)
        return dev.kind if dev is not None else "node"


def as_table(obj: Any) -> dict[str, Any]:
    """The fields of a config dataclass as a dict (one level: nested values stay as they are)."""
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


_Entry = TypeVar("_Entry", NodeConfig, DeviceConfig)


def _by_id(path: str, what: str, wanted: str, entries: tuple[_Entry, ...]) -> _Entry:
    """The entry with id `wanted`, or ConfigError naming the file and the known ids."""
    for e in entries:
        if e.id == wanted:
            return e
    known = ", ".join(e.id for e in entries)
    raise ConfigError(f"{path}: unknown {what} {wanted!r}; the testbed has {known}")


def _attachments(cfg: TestbedConfig) -> dict[str, Attachment]:
    out: dict[str, Attachment] = {}
    for f in cfg.fibres:
        if f.dst.port == "rx":
            out[f.dst.owner] = Attachment(f.src.owner, int(f.src.port))
    return out
