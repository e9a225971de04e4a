"""`oddl devices probe`: what is attached, what each device says it is, and whether that is what
the testbed file expects, before any job runs.

Finds serial ports (pyserial's ``list_ports``) and VISA resources (pyvisa-py), then identifies
every device of the testbed file over its own protocol: an ITLA reads its identity registers
(DevTyp, MFGR, Model, SerNo) in MSA frames at the configured baud, a WSS answers its identity
queries (SNO?, MFD?) and its grid (CHW?, checked against the channel numbering the file
gives it), a power meter ``*IDN?``. A device that does not answer is tried as the
other serial kind (a wrong port) and at the other usual baud rates (a wrong baud rate), so the
message can say which. Probing only reads: no register write, no setting, no output change
(drivers are closed, never shut down, since an ITLA shutdown switches the laser off). Queries
go only to the resources the file names: a port the scan finds that the file does not name
is reported as present, never opened (docs/how-to/bench-with-real-devices.md).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import replace

from oddl.common.config import DeviceConfig, GridConfig, TestbedConfig
from oddl.common.errors import DeviceError, OddlError
from oddl.common.file_access import permission_advice
from oddl.drivers.interfaces import DeviceIdentity
from oddl.drivers.link_errors import CannotOpen
from oddl.operator.probe_scpi import probe_circuit_switch, probe_meter
from oddl.operator.probe_verdicts import (
    CANNOT_OPEN,
    MISMATCH,
    NO_ANSWER,
    NOT_NAMED,
    OK,
    SERVICE_CANNOT_OPEN,
    SKIPPED,
    WRONG_BAUD,
    WRONG_PORT,
    DeviceProbe,
    ProbeReport,
    check_identity,
    describe_identity,
    identity_dict,
)

logger = logging.getLogger(__name__)

ITLA_BAUDS = (9600, 19200, 38400, 57600, 115200)
"""Baud rates OIF-ITLA modules are set to (MSA: 9600 after reset; IOCap selects the others)."""
WSS_BAUDS = (115200, 57600, 38400, 19200, 9600)
VISA_SCAN_TIMEOUT_S = 15.0


# ----- discovery ---------------------------------------------------------------------------

def list_serial_ports() -> list[dict[str, str]]:
    """Serial ports the OS reports (device, description, hardware id, USB serial number)."""
    from serial.tools import list_ports

    return [{"device": p.device, "description": p.description or "", "hwid": p.hwid or "",
             "serial_number": p.serial_number or ""} for p in sorted(list_ports.comports())]


def list_visa_resources(backend: str = "@py",
                        timeout_s: float = VISA_SCAN_TIMEOUT_S) -> tuple[list[str], str]:
    """VISA resources pyvisa-py finds (serial ASRL ones left to `list_serial_ports`).

    Returns (resources, note); the note says why the list may be incomplete.
    """
    found: list[str] = []
    problem: list[str] = []
    limits: list[str] = []  # what pyvisa-py warned it could not scan

    def scan() -> None:
        import pyvisa

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                rm = pyvisa.ResourceManager(backend)
                try:
                    found.extend(r for r in rm.list_resources() if not r.startswith("ASRL"))
                finally:
                    rm.close()
            limits.extend(str(w.message).split(".")[0] for w in caught
                          if issubclass(w.category, UserWarning))
        except Exception as exc:  # pyvisa-py raises plain exceptions for missing back-ends
            problem.append(f"VISA scan failed: {exc}")

    thread = threading.Thread(target=scan, name="visa-scan", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return [], f"VISA scan gave no answer within {timeout_s:g} s; resources not listed"
    if problem:
        return sorted(found), problem[0]
    note = ("pyvisa-py lists only resources it can discover (a TCPIP SOCKET meter is probed "
            "at the address the testbed file gives)")
    if limits:
        note += "; " + "; ".join(sorted(set(limits)))
    return sorted(found), note


# ----- identification, one protocol each --------------------------------------------------

def _is_serial_device(resource: str) -> bool:
    """True for a real serial port (where the baud rate matters), False for socket:// etc."""
    return "://" not in resource or resource.startswith("rfc2217://")


def identify_itla(resource: str, baud: int, timeout_s: float, name: str) -> DeviceIdentity:
    """Read an ITLA's identity registers in MSA frames (read-only)."""
    from oddl.drivers.itla import ItlaDriver
    from oddl.drivers.transport import SerialTransport

    transport = SerialTransport(resource, name=name, baudrate=baud, timeout=timeout_s)
    driver = ItlaDriver(transport, name=name, timeout_s=timeout_s, retries=0)
    try:
        return driver.identify()
    finally:
        driver.close()  # close, never shutdown(): that would switch the laser off


def identify_wss(resource: str, baud: int, timeout_s: float, name: str) -> DeviceIdentity:
    """Ask a flexgrid WSS for its identity (SNO?, MFD?) and its grid (CHW?, when it knows it)."""
    from oddl.drivers.transport import SerialTransport
    from oddl.drivers.wss import FlexgridWss

    transport = SerialTransport(resource, name=name, baudrate=baud, timeout=timeout_s)
    driver = FlexgridWss(transport, name=name, timeout=timeout_s)
    try:
        identity = driver.identify()
        try:
            width = driver.channel_width()
        except DeviceError as exc:  # a module without CHW?: identified all the same
            logger.info("%s: CHW? not answered (%s); its grid is not checked", name, exc)
            return identity
        return replace(identity, extra=(*identity.extra, ("channel_width_ghz", str(width))))
    finally:
        driver.close()


Identifier = Callable[[str, int, float, str], DeviceIdentity]
SERIAL_KINDS: dict[str, tuple[Identifier, tuple[int, ...]]] = {
    "itla": (identify_itla, ITLA_BAUDS),
    "wss": (identify_wss, WSS_BAUDS),
}


def _found(base: DeviceProbe, status: str, kind: str, baud: int, found: DeviceIdentity,
           message: str) -> DeviceProbe:
    """`base` as a verdict on a device that answered as `kind` at `baud`."""
    base.status, base.found_kind, base.found_baud = status, kind, baud
    base.identity = identity_dict(found)
    base.message = message
    return base


def _attempt(kind: str, resource: str, baud: int, timeout_s: float,
             name: str) -> tuple[DeviceIdentity | None, OddlError | None]:
    identify, _ = SERIAL_KINDS[kind]
    try:
        return identify(resource, baud, timeout_s, name), None
    except OddlError as exc:
        return None, exc


def probe_serial(dev: DeviceConfig) -> DeviceProbe:
    """Identify an ITLA or WSS entry; say whether its port or baud rate is wrong."""
    expected_baud = dev.baud or SERIAL_KINDS[dev.kind][1][0]
    timeout = max(dev.timeout_s, 0.2)
    identity, error = _attempt(dev.kind, dev.resource, expected_baud, timeout, dev.id)
    base = DeviceProbe(dev.id, dev.kind, dev.resource, NO_ANSWER, "")
    if identity is not None:
        return check_identity(dev, identity, base)
    if isinstance(error, CannotOpen):
        base.status, base.message = CANNOT_OPEN, str(error)
        return base
    serial = _is_serial_device(dev.resource)
    # the same kind at the other rates first: bytes of the other protocol could leave a
    # device out of step
    if serial:
        for baud in (b for b in SERIAL_KINDS[dev.kind][1] if b != expected_baud):
            found, _ = _attempt(dev.kind, dev.resource, baud, timeout, dev.id)
            if found is not None:
                return _found(base, WRONG_BAUD, dev.kind, baud, found,
                              f"the {dev.kind.upper()} on {dev.resource} answers at {baud} "
                              f"baud, the testbed file says baud = {expected_baud}; set "
                              f"baud = {baud} for {dev.id} (or set the device back to "
                              f"{expected_baud})")
    for other in (k for k in SERIAL_KINDS if k != dev.kind):
        bauds = SERIAL_KINDS[other][1] if serial else SERIAL_KINDS[other][1][:1]
        for baud in bauds:
            found, _ = _attempt(other, dev.resource, baud, timeout, dev.id)
            if found is not None:
                return _found(base, WRONG_PORT, other, baud, found,
                              f"{dev.resource} answers as a {other.upper()} "
                              f"({describe_identity(found)}), not the {dev.kind.upper()} the testbed "
                              f"file names; point {dev.id}'s resource at the port the "
                              f"{dev.kind.upper()} is on")
    tried = "at any usual baud rate" if serial else f"at {expected_baud} baud"
    base.message = (f"{dev.resource} opened but no {dev.kind.upper()} answered {tried} "
                    f"({error}); check that it is powered and cabled, and that no other "
                    "program holds the port")
    return base


def check_service_access(result: DeviceProbe, dev: DeviceConfig, user: str,
                         group: str = "") -> DeviceProbe:
    """A serial port the service user (with the `group` its unit gives it) may not open
    fails, with its owner, group, mode and the fix, even when the probe (run as root) could
    open it."""
    if not user or not dev.resource.startswith("/") or result.status == CANNOT_OPEN:
        return result
    advice = permission_advice(dev.resource, user,
                               also_groups=frozenset({group}) if group else frozenset())
    if advice:
        result.status = SERVICE_CANNOT_OPEN
        result.message = (f"{result.message}; but the controller's service will not open "
                          f"it: {advice}").lstrip("; ")
    return result


def check_wss_grid(result: DeviceProbe, dev: DeviceConfig, grid: GridConfig) -> DeviceProbe:
    """An identified WSS on a fixed grid other than the one its channels are numbered by (the
    file's ``module_plan``, else the testbed's grid) is a mismatch: the controller's channel
    numbers would land on other frequencies."""
    text = (result.identity or {}).get("channel_width_ghz")
    if dev.kind != "wss" or result.status != OK or text is None:
        return result
    width = int(text)
    expected = dev.module_plan.spacing_ghz if dev.module_plan else grid.spacing_ghz
    if width == 0:
        result.message += ("; flexgrid mode (CHW? = 0): its channels are the ones DCC defined, "
                           "check DCC? against the testbed's grid")
    elif abs(width - expected) > 1e-6:
        source = (f"its module_plan says {expected:g} GHz" if dev.module_plan else
                  f"the testbed's grid numbers channels every {expected:g} GHz")
        result.status = MISMATCH
        result.message = (f"on a {width} GHz fixed grid (CHW? = {width}), but {source}; the "
                          "controller's channels would land on other frequencies: add "
                          f"module_plan (first_channel, first_thz, spacing_ghz = {width}, "
                          f"channels) for {dev.id} from the module's datasheet "
                          "(docs/reference/devices/wss.md), or set the module's grid")
    return result


def probe_device(dev: DeviceConfig) -> DeviceProbe:
    """Probe one device of the testbed file (emulated ones are skipped)."""
    if dev.emulated:
        return DeviceProbe(dev.id, dev.kind, dev.resource, SKIPPED,
                           "emulated: `oddl emulate testbed` serves it, nothing is attached")
    if dev.kind in SERIAL_KINDS:
        return probe_serial(dev)
    if dev.kind == "powermeter":
        return probe_meter(dev)
    if dev.kind == "ocs":
        return probe_circuit_switch(dev)
    return DeviceProbe(dev.id, dev.kind, dev.resource, SKIPPED,
                       f"no probe for kind {dev.kind!r}")


def _not_named(resource: str, what: str) -> DeviceProbe:
    """An attached port or VISA resource no device entry names: listed, never opened."""
    return DeviceProbe("", "", resource, NOT_NAMED,
                       f"present, not named by the file: {what} not opened or queried (the "
                       "probe writes only to the resources the file names); to check it, "
                       "name it as a device's resource")


def _same_port(a: str, b: str) -> bool:
    return a == b or ("://" not in a and "://" not in b
                      and os.path.realpath(a) == os.path.realpath(b))


def probe(cfg: TestbedConfig, *, scan: bool = True,
          ports: Iterable[dict[str, str]] | None = None,
          service_user: str = "", service_group: str = "") -> ProbeReport:
    """Check every device of `cfg` against what answers on its resource; with `scan`, also
    list the serial ports and VISA resources present and report those the file does not
    name (listed only: no byte goes to a resource the file does not name). With
    `service_user` (and the `service_group` its unit gives it), a serial port that user may
    not open fails its device, whoever probes."""
    report = ProbeReport()
    if scan:
        report.serial_ports = list(ports) if ports is not None else list_serial_ports()
        report.visa_resources, note = list_visa_resources()
        report.notes.append(note)
    report.devices = [check_service_access(check_wss_grid(probe_device(dev), dev, cfg.grid),
                                           dev, service_user, service_group)
                      for dev in cfg.devices]
    if scan:
        claimed = [d.resource for d in cfg.devices]
        for port in report.serial_ports:
            if not any(_same_port(port["device"], r) for r in claimed):
                report.unlisted.append(_not_named(port["device"], "serial port"))
        for resource in report.visa_resources:
            if resource not in claimed:
                report.unlisted.append(_not_named(resource, "VISA resource"))
    return report


def format_report(report: ProbeReport, source: str = "the testbed file") -> str:
    """The human-readable report."""
    lines = [f"Attached: {len(report.serial_ports)} serial port(s), "
             f"{len(report.visa_resources)} VISA resource(s)"]
    lines += [f"  {p['device']}  {p['description']}" for p in report.serial_ports]
    lines += [f"  {r}" for r in report.visa_resources]
    lines.append(f"Devices of {source}:")
    width = max((len(d.device) for d in report.devices), default=0)
    for d in report.devices:
        lines.append(f"  {d.device:<{width}}  {d.kind:<10} {d.status.upper():<12} "
                     f"{d.resource}")
        lines.append(f"  {'':<{width}}  {d.message}")
    if report.unlisted:
        lines.append("Present, not named by the testbed file (not queried):")
        lines += [f"  {d.resource}" for d in report.unlisted]
    lines += [f"note: {n}" for n in report.notes if n]
    good = sum(d.ok for d in report.devices)
    lines.append(f"{good} of {len(report.devices)} device(s) as the testbed file says"
                 + ("" if report.ok else "; fix the ones above before running a job"))
    return "\n".join(lines)
