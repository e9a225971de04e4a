"""`oddl devices probe` for the devices on the LAN that speak SCPI on a socket: a power meter
(``*IDN?``, its model and channel count) and an optical circuit switch (``*IDN?``, its size
against the file's ``size``)."""

from __future__ import annotations

from oddl.common.config import DeviceConfig
from oddl.common.errors import DeviceError, OddlError
from oddl.drivers.interfaces import DeviceIdentity
from oddl.drivers.link_errors import CannotOpen, NoConnection
from oddl.operator.probe_verdicts import (
    CANNOT_OPEN,
    MISMATCH,
    NO_ANSWER,
    OK,
    DeviceProbe,
    check_identity,
    describe_identity,
)


def identify_meter(resource: str, timeout_s: float, name: str) -> DeviceIdentity:
    """Ask a SCPI power meter for *IDN?."""
    from oddl.drivers.powermeter import PowerMeter

    with PowerMeter(resource, name=name, timeout_s=timeout_s, channels=8) as meter:
        return meter.identify()


def probe_meter(dev: DeviceConfig) -> DeviceProbe:
    """Identify a power meter entry with *IDN?."""
    base = DeviceProbe(dev.id, dev.kind, dev.resource, NO_ANSWER, "")
    try:
        identity = identify_meter(dev.resource, max(dev.timeout_s, 1.0), dev.id)
    except DeviceError as exc:
        base.status = CANNOT_OPEN if isinstance(exc, CannotOpen | NoConnection) else NO_ANSWER
        base.message = str(exc)
        return base
    probe = check_identity(dev, identity, base)
    model = identity.model.upper()
    if probe.status == OK and not model.startswith("N774"):
        probe.status = MISMATCH
        probe.message = (f"{dev.resource} is a {describe_identity(identity)}, not an N7744A/N7745A "
                         f"power meter; point {dev.id}'s resource at the meter")
    elif probe.status == OK and dev.channels > (8 if model.startswith("N7745") else 4):
        probe.status = MISMATCH
        probe.message = (f"{identity.model} has {8 if model.startswith('N7745') else 4} "
                         f"channels, the testbed file says channels = {dev.channels}")
    return probe


def probe_circuit_switch(dev: DeviceConfig) -> DeviceProbe:
    """Identify an optical circuit switch with *IDN? and check its size against ``size``."""
    from oddl.drivers.ocs import PolatisOcs

    base = DeviceProbe(dev.id, dev.kind, dev.resource, NO_ANSWER, "")
    try:
        with PolatisOcs.open(dev.resource, name=dev.id, timeout=dev.timeout_s) as switch:
            identity = switch.identify()
            size = switch.size
    except DeviceError as exc:
        base.status = CANNOT_OPEN if isinstance(exc, CannotOpen | NoConnection) else NO_ANSWER
        base.message = str(exc)
        return base
    except OddlError as exc:  # a resource the switch's socket cannot be
        base.status, base.message = CANNOT_OPEN, str(exc)
        return base
    probe = check_identity(dev, identity, base)
    if probe.status == OK and size != dev.size:
        probe.status = MISMATCH
        probe.message = (f"{identity.model} is a {size}x{size} switch, the testbed file says "
                         f"size = {dev.size}; correct size (and the fibres) or point "
                         f"{dev.id}'s resource at the other unit")
    return probe
