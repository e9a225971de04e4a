"""Loading, validating and writing a testbed file: :func:`load_testbed`, :func:`parse_testbed`
(every error names the file, the key and the fix) and :func:`dump_testbed`."""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from oddl.common.config.device_hosts import device_hosts
from oddl.common.config.devices import DEVICE_KEYS_BY_KIND, DeviceSections
from oddl.common.config.reader import REQUIRED, TableReader
from oddl.common.config.schema import (
    LINK_KINDS,
    TRANSPORTS,
    AgentConfig,
    ControllerConfig,
    FabricConfig,
    GridConfig,
    SecurityConfig,
    TestbedConfig,
    TimingConfig,
    as_table,
)
from oddl.common.config.wiring import WiringSections
from oddl.common.errors import ConfigError


def load_testbed(path: str | Path) -> TestbedConfig:
    """Read and validate a testbed file; raise ConfigError naming the file, key and fix."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the testbed file ({exc.strerror}); "
                          "check the path (examples: `oddl config example`)") from exc
    return parse_testbed(text, str(p))


def parse_testbed(text: str, path: str = "<testbed>") -> TestbedConfig:
    """Validate the text of a testbed file."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax at that line") from exc
    return TestbedParser(path).testbed(doc)


def dump_testbed(cfg: TestbedConfig) -> str:
    """Serialise a testbed back to TOML (used to write a resolved copy for emulated runs)."""
    import tomli_w

    doc: dict[str, Any] = {
        "testbed": {"name": cfg.name, "seed": cfg.seed},
        "grid": as_table(cfg.grid),
        "timing": as_table(cfg.timing),
        "fabric": as_table(cfg.fabric),
        "controller": as_table(cfg.controller),
        "nodes": [{k: v for k, v in as_table(n).items()
                   if not (k in ("transmitter", "rx_channel", "ports") and not v)}
                  for n in cfg.nodes],
        "devices": [],
        "fibres": [{"from": str(f.src), "to": str(f.dst)} for f in cfg.fibres],
        "security": as_table(cfg.security),
        "agent": as_table(cfg.agent),
    }
    if cfg.device_hosts:
        doc["device_hosts"] = [{"id": h.id, "address": h.address, "devices": list(h.devices)}
                               for h in cfg.device_hosts]
    for d in cfg.devices:
        entry = {k: v for k, v in as_table(d).items() if k in DEVICE_KEYS_BY_KIND[d.kind]}
        entry = {k: list(v) if isinstance(v, tuple) else v for k, v in entry.items()}
        if not entry.get("faults"):
            entry.pop("faults", None)
        if "module_plan" in entry:
            plan = entry.pop("module_plan")
            if plan is not None:
                entry["module_plan"] = as_table(plan)
        doc["devices"].append(entry)
    for o in cfg.optinc:
        doc["devices"].append({k: v for k, v in as_table(o).items()
                               if v is not None and not (k == "phases" and not v)})
    return tomli_w.dumps(doc)


class TestbedParser:
    """Turns the TOML document of the file at `path` into dataclasses, checking every key
    against its schema: the top sections here, ``[[devices]]`` in `DeviceSections`, the nodes
    and fibres in `WiringSections`, all through one `TableReader`."""

    __test__ = False  # not a pytest test class

    def __init__(self, path: str):
        self.read = TableReader(path)
        self.path = path
        self.device_sections = DeviceSections(self.read)
        self.wiring = WiringSections(self.read)

    def testbed(self, doc: dict[str, Any]) -> TestbedConfig:
        """The whole document: its sections, in the order they depend on each other."""
        sections = {"testbed", "grid", "timing", "fabric", "controller", "nodes", "devices",
                    "fibres", "security", "agent", "device_hosts"}
        for name in doc:
            if name not in sections:
                near = difflib.get_close_matches(name, list(sections), n=1)
                hint = f"did you mean [{near[0]}]?" if near else f"sections: {', '.join(sorted(sections))}"
                raise self.read.fail(name, "unknown section", f"remove it ({hint})")
        head = self.read.table(doc.get("testbed"), "testbed", {
            "name": (self.read.text(), REQUIRED), "description": (self.read.text(), ""),
            "seed": (self.read.integer(0), 0)})
        grid = GridConfig(**self.read.table(doc.get("grid"), "grid", {
            "first_thz": (self.read.num(180.0, 200.0), 193.1),
            "spacing_ghz": (self.read.num(positive=True), 100.0),
            "channels": (self.read.integer(1, 1000), 48)}))
        timing = TimingConfig(**self.read.table(doc.get("timing"), "timing", {
            name: (self.read.num(0.0), default)
            for name, default in as_table(TimingConfig()).items()}))
        fabric = FabricConfig(**self.read.table(doc.get("fabric"), "fabric", {
            "line_rate_gbps": (self.read.num(positive=True), 10.0),
            "link": (self.read.text(LINK_KINDS), "fabric"),
            "address": (self.read.text(), ""), "listen": (self.read.text(), "127.0.0.1:0"),
            "transport": (self.read.text(TRANSPORTS), "streams"),
            "light_table": (self.read.text(), "")}))
        controller = ControllerConfig(**self.read.table(doc.get("controller"), "controller", {
            "listen": (self.read.text(), "127.0.0.1:0"), "address": (self.read.text(), ""),
            "heartbeat_s": (self.read.num(positive=True), 1.0), "state": (self.read.text(), ""),
            "device_check_s": (self.read.num(lo=0.0), 2.0)}))
        agent = AgentConfig(**self.read.table(doc.get("agent"), "agent", {
            "gate_priority": (self.read.integer(0, 99), 0),
            "gate_cpu": (self.read.integer(-1), -1)}))
        devices = self.device_sections.devices(doc.get("devices"), grid)
        nodes = self.wiring.nodes(doc.get("nodes"), grid, devices)
        fibres = self.wiring.fibres(doc.get("fibres"), nodes, devices,
                                    self.device_sections.optinc)
        security = SecurityConfig(**self.read.table(doc.get("security"), "security", {
            "certs": (self.read.text(), ""), "operator": (self.read.text(), "operator")}))
        if security.certs and not Path(security.certs).is_absolute():
            security = replace(security, certs=str((Path(self.path).parent / security.certs)
                                                   .resolve()))
        cfg = TestbedConfig(self.path, head["name"], grid, timing, fabric, controller,
                            nodes, devices, fibres, head["seed"], security,
                            tuple(self.device_sections.optinc),
                            agent, device_hosts(self.read, doc.get("device_hosts"), devices))
        self.wiring.check_attachments(cfg)
        return cfg
