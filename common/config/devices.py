"""The ``[[devices]]`` of a testbed file: the driven devices (ITLA lasers, WSSs, power meters,
optical circuit switches)
and the OptINC devices of the emulated fabric, with the keys each kind takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oddl.common.config.channel_plan import FixedPlan, channel_map
from oddl.common.config.reader import REQUIRED, Spec, TableReader
from oddl.common.config.schema import (
    DEVICE_KINDS,
    EMULATED,
    OPTINC,
    OPTINC_MAX_INPUTS,
    DeviceConfig,
    GridConfig,
    OptincDeviceConfig,
)

_COMMON_DEVICE_KEYS = {"id", "kind", "resource", "baud", "timeout_s", "serial", "faults"}
DEVICE_KEYS_BY_KIND = {
    "itla": _COMMON_DEVICE_KEYS | {"power_dbm", "power_range_dbm", "lock_timeout_s",
                                   "enable_timeout_s", "startup_timeout_s"},
    "wss": _COMMON_DEVICE_KEYS | {"ports", "attenuation_range_db", "channels_allowed",
                                  "module_plan"},
    "powermeter": _COMMON_DEVICE_KEYS | {"channels"},
    "ocs": _COMMON_DEVICE_KEYS | {"size", "switch_ms"},
}
_DEFAULT_BAUD = {"itla": 9600, "wss": 115200, "powermeter": 0, "ocs": 0}
_DEFAULT_TIMEOUT_S = {"ocs": 5.0}
"""A switch answers a command once every connection in it has switched (25–50 ms each)."""
MAX_OCS_SIZE = 384
"""The largest Polatis unit is 384×384."""


class DeviceSections:
    """Reads ``[[devices]]`` with `read`; the OptINC devices it meets are kept apart in
    `optinc`."""

    def __init__(self, read: TableReader):
        self.read = read
        self.optinc: list[OptincDeviceConfig] = []

    def devices(self, raw: Any, grid: GridConfig) -> tuple[DeviceConfig, ...]:
        """The driven devices, in file order (OptINC devices go to `optinc`)."""
        out: list[DeviceConfig] = []
        for i, entry in enumerate(self.read.array(raw, "devices")):
            kind = entry.get("kind")
            key = self.read.entry_key("devices", i, entry)
            if kind not in DEVICE_KINDS:
                raise self.read.fail(f"{key}.kind", f"{kind!r} is not a device kind",
                                     f"use one of {', '.join(DEVICE_KINDS)}")
            dev = (self.optinc_device(entry, key) if kind == OPTINC
                   else DeviceConfig(**self.read.table(entry, key, self.device_spec(kind, grid))))
            if any(d.id == dev.id for d in out) or any(d.id == dev.id for d in self.optinc):
                raise self.read.fail(f"{key}.id", f"duplicate device id {dev.id!r}",
                                     "give every device its own id")
            if isinstance(dev, OptincDeviceConfig):
                self.optinc.append(dev)
                continue
            self.check_limits(dev, key, grid)
            out.append(dev)
        return tuple(out)

    def device_spec(self, kind: str, grid: GridConfig) -> Spec:
        """The keys a driven device of `kind` takes, with their converters and defaults."""
        spec: Spec = {
            "id": (self.read.text(), REQUIRED), "kind": (self.read.text(DEVICE_KINDS), REQUIRED),
            "resource": (self.read.text(), REQUIRED),
            "baud": (self.read.integer(0), _DEFAULT_BAUD[kind]),
            "timeout_s": (self.read.num(positive=True), _DEFAULT_TIMEOUT_S.get(kind, 0.5)),
            "serial": (self.read.text(), ""),
            "faults": (self.read.anytable, {}),
            "power_dbm": (self.read.num(-20.0, 30.0), 10.0),
            "power_range_dbm": (self.read.pair(float), (0.0, 13.0)),
            "ports": (self.read.integer(1, 64), 4),
            "attenuation_range_db": (self.read.pair(float), (0.0, 25.0)),
            "channels_allowed": (self.read.pair(int), (1, grid.channels)),
            "channels": (self.read.integer(1, 16), 4),
            "lock_timeout_s": (self.read.num(positive=True), 5.0),
            "enable_timeout_s": (self.read.num(positive=True), 30.0),
            "startup_timeout_s": (self.read.num(positive=True), 10.0),
            "module_plan": (self.module_plan, None),
            "size": (self.read.integer(1, MAX_OCS_SIZE), REQUIRED),
            "switch_ms": (self.read.num(0.0, 10_000.0), 25.0),
        }
        return {k: v for k, v in spec.items() if k in DEVICE_KEYS_BY_KIND[kind]}

    def check_limits(self, dev: DeviceConfig, key: str, grid: GridConfig) -> None:
        """An ITLA's set-point inside its safety range, a WSS's channels inside the grid."""
        if dev.kind == "itla" and not dev.power_range_dbm[0] <= dev.power_dbm <= dev.power_range_dbm[1]:
            raise self.read.fail(f"{key}.power_dbm", f"{dev.power_dbm} dBm is outside "
                                 f"power_range_dbm {list(dev.power_range_dbm)}",
                                 "lower the set-point or widen the safety range")
        if dev.kind == "wss":
            lo, hi = dev.channels_allowed
            if lo < 1 or hi > grid.channels:
                raise self.read.fail(f"{key}.channels_allowed", f"[{lo}, {hi}] leaves the grid "
                                     f"(channels 1..{grid.channels})", "keep it inside the grid")
            if dev.module_plan is not None:
                self.check_module_plan(dev, dev.module_plan, key, grid)

    def module_plan(self, v: Any, key: str) -> FixedPlan:
        """Converter of a WSS's ``module_plan = {first_channel, first_thz, spacing_ghz, channels}``."""
        values = self.read.table(self.read.anytable(v, key), key, {
            "first_channel": (self.read.integer(0, 9999), REQUIRED),
            "first_thz": (self.read.num(150.0, 250.0), REQUIRED),
            "spacing_ghz": (self.read.num(1.0, 400.0), REQUIRED),
            "channels": (self.read.integer(1, 9999), REQUIRED)})
        return FixedPlan(**values)

    def check_module_plan(self, dev: DeviceConfig, plan: FixedPlan, key: str,
                          grid: GridConfig) -> None:
        """Every allowed testbed channel must be the centre of one of the module's channels."""
        lo, hi = dev.channels_allowed
        mapped, missing = channel_map(grid.plan, dev.channels_allowed, plan)
        if missing:
            first = missing[0]
            have = sorted(mapped)
            fix = (f"narrow channels_allowed to channels the module has (e.g. [{have[0]}, "
                   f"{_run_end(have)}]) or correct module_plan from the module's datasheet"
                   if have else "correct module_plan from the module's datasheet")
            raise self.read.fail(f"{key}.module_plan", f"testbed channel {first.channel} "
                                 f"({first.thz:.4f} THz) is the centre of no module channel "
                                 f"({plan.describe()}; {len(missing)} channel(s) of "
                                 f"channels_allowed [{lo}, {hi}] are not)", fix)

    def optinc_device(self, entry: dict[str, Any], key: str) -> OptincDeviceConfig:
        """One `kind = "optinc"` device: keys, emulated resource, phase file for this N and b."""
        values = self.read.table(entry, key, {
            "id": (self.read.text(), REQUIRED), "kind": (self.read.text(DEVICE_KINDS), REQUIRED),
            "resource": (self.read.text(), REQUIRED),
            "inputs": (self.read.integer(2, OPTINC_MAX_INPUTS), REQUIRED),
            "bits": (self.read.integer(2, 16), REQUIRED),
            "phases": (self.read.text(), ""),
            "max_elements": (self.read.integer(1, 1 << 36), 1 << 24),
            "noise_rad": (self.read.num(0.0, 1.0), None),
            "latency_us": (self.read.num(0.0), 1.0)})
        if values["resource"] != EMULATED:
            raise self.read.fail(f"{key}.resource",
                                 f"{values['resource']!r} is not an OptINC device "
                                 "oddl can drive (only the emulated one exists)",
                                 'set resource = "emulated"')
        if values["phases"]:
            values["phases"] = self.phase_file(values["phases"], f"{key}.phases",
                                               values["inputs"], values["bits"])
        return OptincDeviceConfig(**values)

    def phase_file(self, raw: str, key: str, inputs: int, bits: int) -> str:
        """Resolve a phase file against the testbed file's folder and check its N and b."""
        p = Path(raw)
        if not p.is_absolute():
            p = (Path(self.read.path).parent / p).resolve()
        train = f"oddl optinc train --nodes {inputs} --bits {bits} --out {raw}"
        try:
            with open(p, encoding="utf-8") as fh:
                doc = json.load(fh)
        except OSError as exc:
            raise self.read.fail(key, f"cannot read phase file {p} ({exc.strerror})",
                                 f"train one (`{train}`), fix the path (relative paths are taken "
                                 "from the testbed file's folder), or remove phases to let the "
                                 "emulator host train one at start-up") from exc
        except ValueError as exc:
            raise self.read.fail(key, f"{p} is not valid JSON ({exc})",
                                 f"write it with `{train}`") from exc
        if not isinstance(doc, dict) or doc.get("format") != "oddl-optinc-phases":
            raise self.read.fail(key,
                                 f"{p} is not an OptINC phase file", f"write it with `{train}`")
        if (doc.get("n_inputs"), doc.get("bits")) != (inputs, bits):
            raise self.read.fail(key, f"{p} was trained for N={doc.get('n_inputs')} inputs and "
                                 f"{doc.get('bits')}-bit levels, but the device has inputs = "
                                 f"{inputs} and bits = {bits}",
                                 f"train phases for this device (`{train}`)")
        return str(p)


def _run_end(channels: list[int]) -> int:
    """The last channel of the unbroken run that starts `channels`."""
    end = channels[0]
    for c in channels[1:]:
        if c != end + 1:
            break
        end = c
    return end
