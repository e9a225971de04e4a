"""The testbed file: one TOML document that describes a testbed, validated on load.

A testbed file names the nodes, the devices and their driver resources, the fibres between
them, the wavelength grid, the device timing and the control-plane addresses. The emulated and
the lab testbed differ only in this file. Every error names the file, the key and the fix.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common.errors import ConfigError

EMULATED = "emulated"
"""Resource value of a device that the emulator host starts (`oddl emulate testbed`)."""

DEVICE_KINDS = ("itla", "wss", "powermeter", "optinc")
OPTINC = "optinc"
"""Kind of an OptINC in-network averaging device (served by the emulated fabric, no driver)."""
OPTINC_MAX_INPUTS = 64  # offline.optinc.model.MAX_INPUTS (not imported: keeps this light)
LINK_KINDS = ("fabric", "direct")
TRANSPORTS = ("streams", "relay", "curve")

_REQUIRED = object()


@dataclass(frozen=True)
class GridConfig:
    """The fixed frequency grid: channel n is at first_thz + (n-1)*spacing."""

    first_thz: float = 193.1
    spacing_ghz: float = 100.0
    channels: int = 48

    def frequency_thz(self, channel: int) -> float:
        """Centre frequency of `channel` (1-based)."""
        return self.first_thz + (channel - 1) * self.spacing_ghz / 1000.0

    def channel_of(self, frequency_thz: float, tolerance_ghz: float = 1.0) -> int | None:
        """The channel centred within `tolerance_ghz` of a frequency, or None if off-grid."""
        n = round((frequency_thz - self.first_thz) * 1000.0 / self.spacing_ghz) + 1
        if not 1 <= n <= self.channels:
            return None
        if abs(self.frequency_thz(n) - frequency_thz) * 1000.0 > tolerance_ghz:
            return None
        return n


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
    """A repeated collective that retunes nothing starts this long after its last node is
    ready, agreed among the agents without the controller (0 = always ask the controller)."""


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
    """One training host: its transmitter device and its receiver's channel."""

    id: str
    host: str
    transmitter: str
    rx_channel: int
    data_port: int = 0


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

    @property
    def emulated(self) -> bool:
        """True when the emulator host serves this device."""
        return self.resource == EMULATED


@dataclass(frozen=True)
class OptincDeviceConfig:
    """An OptINC device: N inputs, b-bit levels, trained MZI phases; part of the emulated fabric.

    Kept apart from `TestbedConfig.devices`: the controller opens no driver for it (the
    emulator host runs it inside the fabric, `drivers.emulators.optinc`).
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


@dataclass(frozen=True)
class Attachment:
    """Where a node hangs on the optical core: its tx enters `wss` at 'in', its rx hangs on `out_port`."""

    wss: str
    out_port: int


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

    def node(self, node_id: str) -> NodeConfig:
        """The node with this id, or ConfigError listing the known ids."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        known = ", ".join(n.id for n in self.nodes)
        raise ConfigError(f"{self.path}: unknown node {node_id!r}; the testbed has {known}")

    def device(self, device_id: str) -> DeviceConfig:
        """The device with this id, or ConfigError listing the known ids."""
        for d in self.devices:
            if d.id == device_id:
                return d
        known = ", ".join(d.id for d in self.devices)
        raise ConfigError(f"{self.path}: unknown device {device_id!r}; the testbed has {known}")

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
        return _attachments(self)[node_id]

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
        for d in self.devices:
            if d.id == owner:
                return d.kind
        return "node"


# ---- loading --------------------------------------------------------------------------


def load_testbed(path: str | Path) -> TestbedConfig:
    """Read and validate a testbed file; raise ConfigError naming the file, key and fix."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the testbed file ({exc.strerror}); "
                          "check the path (examples are in deploy/testbeds/)") from exc
    return parse_testbed(text, str(p))


def parse_testbed(text: str, path: str = "<testbed>") -> TestbedConfig:
    """Validate the text of a testbed file."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax at that line") from exc
    return _Parser(path).testbed(doc)


def dump_testbed(cfg: TestbedConfig) -> str:
    """Serialise a testbed back to TOML (used to write a resolved copy for emulated runs)."""
    import tomli_w

    doc: dict[str, Any] = {
        "testbed": {"name": cfg.name, "seed": cfg.seed},
        "grid": _asdict(cfg.grid),
        "timing": _asdict(cfg.timing),
        "fabric": _asdict(cfg.fabric),
        "controller": _asdict(cfg.controller),
        "nodes": [_asdict(n) for n in cfg.nodes],
        "devices": [],
        "fibres": [{"from": str(f.src), "to": str(f.dst)} for f in cfg.fibres],
        "security": _asdict(cfg.security),
        "agent": _asdict(cfg.agent),
    }
    for d in cfg.devices:
        entry = {k: v for k, v in _asdict(d).items() if k in _DEVICE_KEYS_BY_KIND[d.kind]}
        entry = {k: list(v) if isinstance(v, tuple) else v for k, v in entry.items()}
        if not entry.get("faults"):
            entry.pop("faults", None)
        doc["devices"].append(entry)
    for o in cfg.optinc:
        doc["devices"].append({k: v for k, v in _asdict(o).items()
                               if v is not None and not (k == "phases" and not v)})
    return tomli_w.dumps(doc)


def _asdict(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


_COMMON_DEVICE_KEYS = {"id", "kind", "resource", "baud", "timeout_s", "serial", "faults"}
_DEVICE_KEYS_BY_KIND = {
    "itla": _COMMON_DEVICE_KEYS | {"power_dbm", "power_range_dbm", "lock_timeout_s",
                                   "enable_timeout_s", "startup_timeout_s"},
    "wss": _COMMON_DEVICE_KEYS | {"ports", "attenuation_range_db", "channels_allowed"},
    "powermeter": _COMMON_DEVICE_KEYS | {"channels"},
}
_DEFAULT_BAUD = {"itla": 9600, "wss": 115200, "powermeter": 0}


class _Parser:
    """Turns the TOML document into dataclasses, checking every key against its schema."""

    def __init__(self, path: str):
        self.path = path
        self.optinc: list[OptincDeviceConfig] = []

    def fail(self, key: str, problem: str, fix: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {problem}; {fix}")

    def table(self, raw: Any, key: str, spec: Mapping[str, tuple[Callable[[Any, str], Any], Any]]
              ) -> dict[str, Any]:
        """Check one table against `spec` (name → (converter, default)); reject unknown keys."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise self.fail(key, f"expected a table, got {type(raw).__name__}",
                            f"write it as [{key}] with key = value lines")
        for name in raw:
            if name not in spec:
                near = difflib.get_close_matches(name, list(spec), n=1)
                hint = f"did you mean {near[0]!r}?" if near else f"known keys: {', '.join(spec)}"
                raise self.fail(f"{key}.{name}", "unknown key", f"remove it ({hint})")
        out: dict[str, Any] = {}
        for name, (conv, default) in spec.items():
            if name in raw:
                out[name] = conv(raw[name], f"{key}.{name}")
            elif default is _REQUIRED:
                raise self.fail(f"{key}.{name}", "missing", f"add {name} = … to {key}")
            else:
                out[name] = default
        return out

    # converters -------------------------------------------------------------------------
    def num(self, lo: float | None = None, hi: float | None = None, *, positive: bool = False
            ) -> Callable[[Any, str], float]:
        def conv(v: Any, key: str) -> float:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise self.fail(key, f"expected a number, got {v!r}", "write a plain number")
            if positive and v <= 0:
                raise self.fail(key, f"must be > 0, got {v}", "use a positive value")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                raise self.fail(key, f"{v} is outside [{lo}, {hi}]", "use a value in that range")
            return float(v)
        return conv

    def integer(self, lo: int | None = None, hi: int | None = None) -> Callable[[Any, str], int]:
        def conv(v: Any, key: str) -> int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise self.fail(key, f"expected an integer, got {v!r}", "write a whole number")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                raise self.fail(key, f"{v} is outside [{lo}, {hi}]", "use a value in that range")
            return v
        return conv

    def text(self, choices: tuple[str, ...] = ()) -> Callable[[Any, str], str]:
        def conv(v: Any, key: str) -> str:
            if not isinstance(v, str):
                raise self.fail(key, f"expected a string, got {v!r}", 'quote it: key = "value"')
            if choices and v not in choices:
                raise self.fail(key, f"{v!r} is not one of {', '.join(choices)}",
                                "use one of those")
            return v
        return conv

    def pair(self, kind: type) -> Callable[[Any, str], tuple[Any, Any]]:
        def conv(v: Any, key: str) -> tuple[Any, Any]:
            ok = (isinstance(v, list) and len(v) == 2
                  and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
                  and (kind is float or all(isinstance(x, int) for x in v)))
            if not ok or v[0] > v[1]:
                raise self.fail(key, f"expected [low, high], got {v!r}",
                                "write two numbers, low first, e.g. [0, 13]")
            return (kind(v[0]), kind(v[1]))
        return conv

    def anytable(self, v: Any, key: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(key, f"expected a table, got {v!r}", "write it as an inline table {…}")
        return dict(v)

    # sections ---------------------------------------------------------------------------
    def testbed(self, doc: dict[str, Any]) -> TestbedConfig:
        sections = {"testbed", "grid", "timing", "fabric", "controller", "nodes", "devices",
                    "fibres", "security", "agent"}
        for name in doc:
            if name not in sections:
                near = difflib.get_close_matches(name, list(sections), n=1)
                hint = f"did you mean [{near[0]}]?" if near else f"sections: {', '.join(sorted(sections))}"
                raise self.fail(name, "unknown section", f"remove it ({hint})")
        head = self.table(doc.get("testbed"), "testbed", {
            "name": (self.text(), _REQUIRED), "description": (self.text(), ""),
            "seed": (self.integer(0), 0)})
        grid = GridConfig(**self.table(doc.get("grid"), "grid", {
            "first_thz": (self.num(180.0, 200.0), 193.1),
            "spacing_ghz": (self.num(positive=True), 100.0),
            "channels": (self.integer(1, 1000), 48)}))
        timing = TimingConfig(**self.table(doc.get("timing"), "timing", {
            name: (self.num(0.0), default)
            for name, default in _asdict(TimingConfig()).items()}))
        fabric = FabricConfig(**self.table(doc.get("fabric"), "fabric", {
            "line_rate_gbps": (self.num(positive=True), 10.0),
            "link": (self.text(LINK_KINDS), "fabric"),
            "address": (self.text(), ""), "listen": (self.text(), "127.0.0.1:0"),
            "transport": (self.text(TRANSPORTS), "streams"), "light_table": (self.text(), "")}))
        controller = ControllerConfig(**self.table(doc.get("controller"), "controller", {
            "listen": (self.text(), "127.0.0.1:0"), "address": (self.text(), ""),
            "heartbeat_s": (self.num(positive=True), 1.0), "state": (self.text(), ""),
            "device_check_s": (self.num(lo=0.0), 2.0)}))
        agent = AgentConfig(**self.table(doc.get("agent"), "agent", {
            "gate_priority": (self.integer(0, 99), 0), "gate_cpu": (self.integer(-1), -1)}))
        devices = self.devices(doc.get("devices"), grid)
        nodes = self.nodes(doc.get("nodes"), grid, devices)
        fibres = self.fibres(doc.get("fibres"), nodes, devices)
        security = SecurityConfig(**self.table(doc.get("security"), "security", {
            "certs": (self.text(), ""), "operator": (self.text(), "operator")}))
        if security.certs and not Path(security.certs).is_absolute():
            security = replace(security, certs=str((Path(self.path).parent / security.certs)
                                                   .resolve()))
        cfg = TestbedConfig(self.path, head["name"], grid, timing, fabric, controller,
                            nodes, devices, fibres, head["seed"], security, tuple(self.optinc),
                            agent)
        self.check_attachments(cfg)
        return cfg

    def array(self, raw: Any, key: str) -> list[dict[str, Any]]:
        if raw is None:
            return []
        if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
            raise self.fail(key, "expected an array of tables", f"write each entry as [[{key}]]")
        return raw

    def devices(self, raw: Any, grid: GridConfig) -> tuple[DeviceConfig, ...]:
        out: list[DeviceConfig] = []
        for i, entry in enumerate(self.array(raw, "devices")):
            kind = entry.get("kind")
            key = f"devices[{i}]" + (f" ({entry['id']})" if isinstance(entry.get("id"), str) else "")
            if kind not in DEVICE_KINDS:
                raise self.fail(f"{key}.kind", f"{kind!r} is not a device kind",
                                f"use one of {', '.join(DEVICE_KINDS)}")
            if kind == OPTINC:
                dev_o = self.optinc_device(entry, key)
                if any(d.id == dev_o.id for d in [*out, *self.optinc]):
                    raise self.fail(f"{key}.id", f"duplicate device id {dev_o.id!r}",
                                    "give every device its own id")
                self.optinc.append(dev_o)
                continue
            spec: dict[str, tuple[Callable[[Any, str], Any], Any]] = {
                "id": (self.text(), _REQUIRED), "kind": (self.text(DEVICE_KINDS), _REQUIRED),
                "resource": (self.text(), _REQUIRED),
                "baud": (self.integer(0), _DEFAULT_BAUD[kind]),
                "timeout_s": (self.num(positive=True), 0.5), "serial": (self.text(), ""),
                "faults": (self.anytable, {}),
                "power_dbm": (self.num(-20.0, 30.0), 10.0),
                "power_range_dbm": (self.pair(float), (0.0, 13.0)),
                "ports": (self.integer(1, 64), 4),
                "attenuation_range_db": (self.pair(float), (0.0, 25.0)),
                "channels_allowed": (self.pair(int), (1, grid.channels)),
                "channels": (self.integer(1, 16), 4),
                "lock_timeout_s": (self.num(positive=True), 5.0),
                "enable_timeout_s": (self.num(positive=True), 30.0),
                "startup_timeout_s": (self.num(positive=True), 10.0),
            }
            spec = {k: v for k, v in spec.items() if k in _DEVICE_KEYS_BY_KIND[kind]}
            values = self.table(entry, key, spec)
            dev = DeviceConfig(**values)
            if any(d.id == dev.id for d in [*out, *self.optinc]):
                raise self.fail(f"{key}.id", f"duplicate device id {dev.id!r}",
                                "give every device its own id")
            if kind == "itla" and not dev.power_range_dbm[0] <= dev.power_dbm <= dev.power_range_dbm[1]:
                raise self.fail(f"{key}.power_dbm", f"{dev.power_dbm} dBm is outside "
                                f"power_range_dbm {list(dev.power_range_dbm)}",
                                "lower the set-point or widen the safety range")
            if kind == "wss":
                lo, hi = dev.channels_allowed
                if lo < 1 or hi > grid.channels:
                    raise self.fail(f"{key}.channels_allowed", f"[{lo}, {hi}] leaves the grid "
                                    f"(channels 1..{grid.channels})", "keep it inside the grid")
            out.append(dev)
        return tuple(out)

    def optinc_device(self, entry: dict[str, Any], key: str) -> OptincDeviceConfig:
        """One `kind = "optinc"` device: keys, emulated resource, phase file for this N and b."""
        values = self.table(entry, key, {
            "id": (self.text(), _REQUIRED), "kind": (self.text(DEVICE_KINDS), _REQUIRED),
            "resource": (self.text(), _REQUIRED),
            "inputs": (self.integer(2, OPTINC_MAX_INPUTS), _REQUIRED),
            "bits": (self.integer(2, 16), _REQUIRED),
            "phases": (self.text(), ""),
            "max_elements": (self.integer(1, 1 << 36), 1 << 24),
            "noise_rad": (self.num(0.0, 1.0), None),
            "latency_us": (self.num(0.0), 1.0)})
        if values["resource"] != EMULATED:
            raise self.fail(f"{key}.resource", f"{values['resource']!r} is not an OptINC device "
                            "oddl can drive (only the emulated one exists)",
                            'set resource = "emulated"')
        if values["phases"]:
            values["phases"] = self.phase_file(values["phases"], f"{key}.phases",
                                               values["inputs"], values["bits"])
        return OptincDeviceConfig(**values)

    def phase_file(self, raw: str, key: str, inputs: int, bits: int) -> str:
        """Resolve a phase file against the testbed file's folder and check its N and b."""
        import json

        p = Path(raw)
        if not p.is_absolute():
            p = (Path(self.path).parent / p).resolve()
        train = f"oddl optinc train --nodes {inputs} --bits {bits} --out {raw}"
        try:
            with open(p, encoding="utf-8") as fh:
                doc = json.load(fh)
        except OSError as exc:
            raise self.fail(key, f"cannot read phase file {p} ({exc.strerror})",
                            f"train one (`{train}`), fix the path (relative paths are taken "
                            "from the testbed file's folder), or remove phases to let the "
                            "emulator host train one at start-up") from exc
        except ValueError as exc:
            raise self.fail(key, f"{p} is not valid JSON ({exc})",
                            f"write it with `{train}`") from exc
        if not isinstance(doc, dict) or doc.get("format") != "oddl-optinc-phases":
            raise self.fail(key, f"{p} is not an OptINC phase file", f"write it with `{train}`")
        if (doc.get("n_inputs"), doc.get("bits")) != (inputs, bits):
            raise self.fail(key, f"{p} was trained for N={doc.get('n_inputs')} inputs and "
                            f"{doc.get('bits')}-bit levels, but the device has inputs = "
                            f"{inputs} and bits = {bits}",
                            f"train phases for this device (`{train}`)")
        return str(p)

    def nodes(self, raw: Any, grid: GridConfig, devices: tuple[DeviceConfig, ...]
              ) -> tuple[NodeConfig, ...]:
        out: list[NodeConfig] = []
        entries = self.array(raw, "nodes")
        if not entries:
            raise self.fail("nodes", "no nodes", "add at least two [[nodes]] entries")
        for i, entry in enumerate(entries):
            key = f"nodes[{i}]" + (f" ({entry['id']})" if isinstance(entry.get("id"), str) else "")
            values = self.table(entry, key, {
                "id": (self.text(), _REQUIRED), "host": (self.text(), "127.0.0.1"),
                "transmitter": (self.text(), _REQUIRED),
                "rx_thz": (self.num(180.0, 200.0), None),
                "rx_channel": (self.integer(1), None),
                "data_port": (self.integer(0, 65535), 0)})
            if any(n.id == values["id"] for n in out):
                raise self.fail(f"{key}.id", f"duplicate node id {values['id']!r}",
                                "give every node its own id")
            tx = values["transmitter"]
            match = [d for d in devices if d.id == tx]
            if not match:
                raise self.fail(f"{key}.transmitter", f"names device {tx!r}, which is not defined",
                                "add a [[devices]] entry with that id and kind = \"itla\", "
                                "or fix the name")
            if match[0].kind != "itla":
                raise self.fail(f"{key}.transmitter", f"{tx!r} is a {match[0].kind}, not a "
                                "tunable transmitter", "name an itla device")
            channel = self.rx_channel(values, key, grid)
            out.append(NodeConfig(values["id"], values["host"], tx, channel, values["data_port"]))
        used: dict[str, str] = {}
        for n in out:
            if n.transmitter in used:
                raise self.fail(f"nodes ({n.id}).transmitter", f"{n.transmitter!r} is already the "
                                f"transmitter of {used[n.transmitter]}",
                                "give every node its own transmitter")
            used[n.transmitter] = n.id
        return tuple(out)

    def rx_channel(self, values: dict[str, Any], key: str, grid: GridConfig) -> int:
        thz, ch = values["rx_thz"], values["rx_channel"]
        if (thz is None) == (ch is None):
            raise self.fail(key, "needs exactly one of rx_thz or rx_channel",
                            "give the receiver's wavelength, e.g. rx_thz = 193.1")
        if ch is not None:
            if ch > grid.channels:
                raise self.fail(f"{key}.rx_channel", f"channel {ch} is off the grid "
                                f"(1..{grid.channels})", "use a channel of the [grid]")
            return ch
        found = grid.channel_of(thz)
        if found is None:
            n = min(max(round((thz - grid.first_thz) * 1000 / grid.spacing_ghz) + 1, 1),
                    grid.channels)
            raise self.fail(f"{key}.rx_thz", f"{thz} THz is off the grid ({grid.first_thz} THz + "
                            f"k × {grid.spacing_ghz} GHz, {grid.channels} channels)",
                            f"use a grid frequency, e.g. {grid.frequency_thz(n):.4f} THz "
                            f"(channel {n})")
        return found

    def endpoint(self, raw: Any, key: str, nodes: tuple[NodeConfig, ...],
                 devices: tuple[DeviceConfig, ...]) -> Endpoint:
        if not isinstance(raw, str) or "." not in raw:
            raise self.fail(key, f"{raw!r} is not an endpoint",
                            'write "node.tx", "node.rx", "wss.in", "wss.<port>" or "meter.<channel>"')
        owner, _, port = raw.rpartition(".")
        if any(n.id == owner for n in nodes):
            if port not in ("tx", "rx"):
                raise self.fail(key, f"node {owner!r} has no port {port!r}", "use .tx or .rx")
            return Endpoint(owner, port)
        dev = next((d for d in devices if d.id == owner), None)
        if dev is None and any(d.id == owner for d in self.optinc):
            raise self.fail(key, f"{owner!r} is an OptINC device; it hangs on the emulated "
                            "fabric, not on a fibre of this file", f"remove the fibre {raw!r}")
        if dev is None:
            raise self.fail(key, f"{owner!r} is neither a node nor a device",
                            "name a node or device defined in this file")
        if dev.kind == "itla":
            raise self.fail(key, f"{owner!r} is a transmitter; fibres start at its node",
                            f"write the node's .tx endpoint instead of {raw!r}")
        if dev.kind == "wss":
            if port == "in" or (port.isdigit() and 1 <= int(port) <= dev.ports):
                return Endpoint(owner, port)
            raise self.fail(key, f"{dev.id} has no port {port!r} (ports: in, 1..{dev.ports})",
                            "use an existing port or raise ports")
        if port.isdigit() and 1 <= int(port) <= dev.channels:
            return Endpoint(owner, port)
        raise self.fail(key, f"{dev.id} has no channel {port!r} (1..{dev.channels})",
                        "use an existing meter channel")

    def fibres(self, raw: Any, nodes: tuple[NodeConfig, ...], devices: tuple[DeviceConfig, ...]
               ) -> tuple[FibreConfig, ...]:
        out: list[FibreConfig] = []
        for i, entry in enumerate(self.array(raw, "fibres")):
            key = f"fibres[{i}]"
            values = self.table(entry, key, {"from": (self.text(), _REQUIRED),
                                             "to": (self.text(), _REQUIRED)})
            src = self.endpoint(values["from"], f"{key}.from", nodes, devices)
            dst = self.endpoint(values["to"], f"{key}.to", nodes, devices)
            kinds = {d.id: d.kind for d in devices}
            sk, dk = kinds.get(src.owner, "node"), kinds.get(dst.owner, "node")
            ok = ((sk == "node" and src.port == "tx" and dk == "wss" and dst.port == "in")
                  or (sk == "wss" and src.port != "in"
                      and ((dk == "node" and dst.port == "rx") or dk == "powermeter")))
            if not ok:
                raise self.fail(key, f"{src} → {dst} is not a fibre this testbed can have",
                                "connect node.tx → wss.in, wss.<port> → node.rx, or "
                                "wss.<port> → meter.<channel> (a monitor tap)")
            out.append(FibreConfig(src, dst))
        return tuple(out)

    def check_attachments(self, cfg: TestbedConfig) -> None:
        tx_to: dict[str, str] = {}
        rx_from: dict[str, tuple[str, int]] = {}
        port_used: dict[tuple[str, int], str] = {}
        for i, f in enumerate(cfg.fibres):
            if f.src.port == "tx":
                if f.src.owner in tx_to:
                    raise self.fail(f"fibres[{i}]", f"{f.src} already has a fibre",
                                    "a transmitter has one fibre; remove one of them")
                tx_to[f.src.owner] = f.dst.owner
            elif f.dst.port == "rx":
                if f.dst.owner in rx_from:
                    raise self.fail(f"fibres[{i}]", f"{f.dst} already has a fibre",
                                    "a receiver has one fibre; remove one of them")
                where = (f.src.owner, int(f.src.port))
                if where in port_used:
                    raise self.fail(f"fibres[{i}]", f"{f.src} already feeds {port_used[where]}.rx",
                                    "give every receiver its own WSS port")
                port_used[where] = f.dst.owner
                rx_from[f.dst.owner] = where
        for n in cfg.nodes:
            if n.id not in tx_to:
                raise self.fail("fibres", f"node {n.id} has no fibre from its transmitter",
                                f'add [[fibres]] from = "{n.id}.tx", to = "<wss>.in"')
            if n.id not in rx_from:
                raise self.fail("fibres", f"node {n.id} has no fibre to its receiver",
                                f'add [[fibres]] from = "<wss>.<port>", to = "{n.id}.rx"')
            if tx_to[n.id] != rx_from[n.id][0]:
                raise self.fail("fibres", f"node {n.id} transmits into {tx_to[n.id]} but receives "
                                f"from {rx_from[n.id][0]}", "attach both to the same WSS")
        by_wss: dict[tuple[str, int], str] = {}
        for n in cfg.nodes:
            key = (rx_from[n.id][0], n.rx_channel)
            if key in by_wss:
                raise self.fail(f"nodes ({n.id}).rx_channel", f"channel {n.rx_channel} is also "
                                f"the receive channel of {by_wss[key]} on {key[0]}",
                                "give every receiver on a WSS its own channel")
            by_wss[key] = n.id
            wss = cfg.device(rx_from[n.id][0])
            lo, hi = wss.channels_allowed
            if not lo <= n.rx_channel <= hi:
                raise self.fail(f"nodes ({n.id}).rx_channel", f"channel {n.rx_channel} is outside "
                                f"{wss.id}.channels_allowed [{lo}, {hi}]",
                                "pick an allowed channel or widen channels_allowed")


def _attachments(cfg: TestbedConfig) -> dict[str, Attachment]:
    out: dict[str, Attachment] = {}
    for f in cfg.fibres:
        if f.dst.port == "rx":
            out[f.dst.owner] = Attachment(f.src.owner, int(f.src.port))
    return out
