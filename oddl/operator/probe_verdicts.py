"""What `oddl devices probe` says of a device: its status, the identity it gave, and the report
of the whole testbed; the identity checks every kind shares."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from oddl.common.config import DeviceConfig
from oddl.drivers.interfaces import DeviceIdentity

OK, MISMATCH, WRONG_PORT, WRONG_BAUD, NO_ANSWER, CANNOT_OPEN, SKIPPED, NOT_NAMED = (
    "ok", "mismatch", "wrong port", "wrong baud", "no answer", "cannot open", "skipped",
    "not named")
SERVICE_CANNOT_OPEN = "service cannot open"
"""The device answered the probe (run as root), but the service user may not open its port."""


@dataclass
class DeviceProbe:
    """The verdict on one device of the testbed file (or one attached, unlisted port)."""

    device: str
    kind: str
    resource: str
    status: str
    message: str
    identity: dict[str, Any] | None = None
    found_kind: str = ""
    found_baud: int = 0

    @property
    def ok(self) -> bool:
        """True when the device is there and is the one the testbed file names."""
        return self.status in (OK, SKIPPED)


@dataclass
class ProbeReport:
    """Everything `oddl devices probe` found."""

    serial_ports: list[dict[str, str]] = field(default_factory=list)
    visa_resources: list[str] = field(default_factory=list)
    devices: list[DeviceProbe] = field(default_factory=list)
    unlisted: list[DeviceProbe] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every device of the testbed file answered as expected."""
        return all(d.ok for d in self.devices)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the `--json` output)."""
        return {"ok": self.ok, "serial_ports": self.serial_ports,
                "visa_resources": self.visa_resources,
                "devices": [asdict(d) for d in self.devices],
                "unlisted": [asdict(d) for d in self.unlisted], "notes": self.notes}


def identity_dict(identity: DeviceIdentity) -> dict[str, Any]:
    return {"kind": identity.kind, "manufacturer": identity.manufacturer,
            "model": identity.model, "serial_number": identity.serial_number,
            **dict(identity.extra)}


def describe_identity(identity: DeviceIdentity) -> str:
    return (f"{identity.manufacturer} {identity.model} serial {identity.serial_number}"
            .strip())


def check_identity(dev: DeviceConfig, identity: DeviceIdentity,
                    probe: DeviceProbe) -> DeviceProbe:
    probe.identity = identity_dict(identity)
    probe.found_kind = dev.kind
    if dev.serial and identity.serial_number != dev.serial:
        probe.status = MISMATCH
        probe.message = (f"serial number {identity.serial_number!r}, the testbed file says "
                         f"serial = {dev.serial!r}: another unit is on {dev.resource}; swap "
                         "the cables or correct the file")
        return probe
    probe.status, probe.message = OK, f"identified: {describe_identity(identity)}"
    return probe
