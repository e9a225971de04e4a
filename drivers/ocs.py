"""Driver for a Polatis optical circuit switch (OCS) on SCPI over TCP (``PolatisOcs``).

The switch connects ingress ports 1..N to egress ports N+1..N+M, one to one. Its connection
table is {ingress: egress}. Wire facts, with their sources, are in
docs/reference/devices/ocs.md; the codec is `oddl.drivers.ocs_protocol`, the SCPI session
`oddl.drivers.ocs_link`.

- Requests are checked against the switch's size before anything is sent
  (`InvalidConnectionTable`, naming the port and the fix).
- Every setting waits for ``*OPC?`` (the switching time: tens of ms per connection) and
  reads the error queue; an error raises `OcsCommandError` naming the command and the fix.
- ``apply_verified`` is a transaction: it records the table, applies the new one
  (``CONNect:ONLY``), reads it back and, on any failure or mismatch, restores the recorded
  table and raises `OcsTransactionError` naming the port and the fix.
- No answer in time raises ``DeviceTimeout`` naming the switch and what to check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Protocol, Self, runtime_checkable

from oddl.common.errors import ConfigError, DeviceError, OddlError
from oddl.drivers.interfaces import DeviceIdentity
from oddl.drivers.ocs_link import OcsCommandError, OcsLink
from oddl.drivers.ocs_protocol import (
    CONNECT_ADD,
    CONNECT_ONLY,
    CONNECT_PORT,
    CONNECT_STATE,
    CONNECT_SUBTRACT,
    DISCONNECT_ALL,
    IDN,
    MAX_POWER_PORTS,
    PORT_DISABLE,
    PORT_ENABLE,
    PORT_STATE,
    POWER,
    SCPI_PORT,
    SIZE,
    OcsGeometry,
    PortFlag,
    PortState,
    format_channel_list,
    format_connections,
    parse_identity,
    parse_port_flags,
    parse_port_reply,
    parse_powers,
    parse_size,
    parse_state,
    port_state,
)
from oddl.drivers.transport import SerialTransport, Transport

logger = logging.getLogger(__name__)

__all__ = ["OcsCommandError", "OcsTransactionError", "OpticalCircuitSwitch", "PolatisOcs",
           "socket_url"]

Mismatches = dict[int, tuple[int | None, int | None]]
"""{ingress: (expected egress, egress read back)}; None = not connected."""


@runtime_checkable
class OpticalCircuitSwitch(Protocol):
    """What the controller needs from an optical circuit switch, whatever its wire protocol."""

    name: str

    def identify(self) -> DeviceIdentity:
        """Read the identity strings."""

    def connections(self) -> dict[int, int]:
        """Read the connection table back: {ingress: egress}."""

    def apply_verified(self, table: Mapping[int, int]) -> dict[int, int]:
        """Make `table` the whole connection table, verified; restore the old one on failure."""

    def port_power(self, ports: Iterable[int]) -> dict[int, float]:
        """Read the power monitors of `ports` (dBm)."""

    def close(self) -> None:
        """Release the link; the connections stay as they are."""


class OcsTransactionError(DeviceError):
    """A verified transaction failed; the switch was restored to the recorded table (or
    `restored` is False and `report` says why not)."""

    def __init__(self, message: str, *, device: str, mismatches: Mismatches,
                 report: list[str], restored: bool) -> None:
        super().__init__(message + ("\n  " + "\n  ".join(report) if report else ""),
                         device=device)
        self.mismatches = mismatches
        self.report = report
        self.restored = restored


def socket_url(resource: str) -> str:
    """A pyserial URL for the switch's SCPI socket from ``TCPIP0::host::5025::SOCKET``,
    ``host:port``, ``host`` (port 5025) or ``socket://host:port``; ConfigError otherwise."""
    text = resource.strip()
    if text.startswith("socket://"):
        return text
    parts = text.split("::")
    if len(parts) > 1:
        if (len(parts) == 4 and parts[0].upper().startswith("TCPIP")
                and parts[3].upper() == "SOCKET" and parts[2].isdigit()):
            return f"socket://{parts[1]}:{parts[2]}"
        raise ConfigError(f"resource {resource!r}: the switch speaks SCPI on a raw socket; "
                          f"write TCPIP0::<host>::{SCPI_PORT}::SOCKET")
    host, sep, port = text.rpartition(":")
    if sep and host and port.isdigit():
        return f"socket://{host}:{port}"
    if text and ":" not in text:
        return f"socket://{text}:{SCPI_PORT}"
    raise ConfigError(f"resource {resource!r}: expected TCPIP0::<host>::{SCPI_PORT}::SOCKET "
                      "or <host>:<port>")


def _diff(expected: Mapping[int, int], actual: Mapping[int, int]) -> Mismatches:
    return {i: (expected.get(i), actual.get(i)) for i in sorted(set(expected) | set(actual))
            if expected.get(i) != actual.get(i)}


def _message(exc: OddlError) -> str:
    """The message of `exc` without the device-name prefix (the caller adds its own)."""
    text = str(exc)
    device = getattr(exc, "device", "")
    return text.removeprefix(f"{device}: ") if device else text


def _describe_mismatch(ingress: int, want: int | None, got: int | None) -> str:
    have = f"connected to {got}" if got is not None else "not connected"
    need = f"to {want}" if want is not None else "unconnected"
    return f"ingress port {ingress} reads back {have}, expected {need}"


class PolatisOcs:
    """A Polatis-style N×M optical circuit switch on SCPI (any Transport: socket://, fake).

    `geometry` is the switch's size as the testbed file states it; without it the driver
    reads it (the model code of ``*IDN?``, else ``:OXC:SWIT:SIZE?``). Every exchange holds
    the link's lock, so one driver may be shared between threads. `switch_s` is the
    switching time allowed per connection on top of `timeout` (sources give 25-50 ms).
    """

    def __init__(self, transport: Transport, name: str = "ocs", *,
                 geometry: OcsGeometry | None = None, timeout: float = 2.0,
                 switch_s: float = 0.1, resync_quiet: float = 0.05, where: str = "",
                 reconnect_url: str | None = None) -> None:
        self.name = name
        self.timeout = timeout
        self.switch_s = switch_s
        self.last_switch_s: float | None = None
        """How long the last setting took until the switch reported it complete (s)."""
        self._configured = geometry
        self._geometry = geometry
        reconnect = None
        if reconnect_url is not None:
            url = reconnect_url

            def reconnect() -> Transport:
                return SerialTransport(url, name=name, timeout=timeout)

        self.link = OcsLink(transport, name, timeout=timeout, resync_quiet=resync_quiet,
                            where=where or (reconnect_url or ""), reconnect=reconnect)

    @classmethod
    def open(cls, resource: str, *, name: str = "ocs", size: int | None = None,
             timeout: float = 2.0, switch_s: float = 0.1) -> PolatisOcs:
        """Open the switch at `resource` (``TCPIP0::host::5025::SOCKET``, ``host:port``);
        `size` N states an N×N switch (checked against the switch on `identify`)."""
        url = socket_url(resource)
        geometry = OcsGeometry(size, size) if size is not None else None
        transport = SerialTransport(url, name=name, timeout=timeout)
        return cls(transport, name, geometry=geometry, timeout=timeout, switch_s=switch_s,
                   where=url.removeprefix("socket://"), reconnect_url=url)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the link; the connections stay as they are. Safe to call twice."""
        self.link.close()

    # ----- identity and size ----------------------------------------------------------------

    def identify(self) -> DeviceIdentity:
        """Read ``*IDN?``; DeviceError when the size the model code states differs from the
        configured one."""
        identity, geometry = parse_identity(self.link.query(IDN), device=self.name)
        if geometry is not None and self._configured not in (None, geometry):
            assert self._configured is not None
            raise DeviceError(f"the testbed file gives a {self._configured.describe()} switch, "
                              f"but it reports {identity.model} ({geometry.describe()}); fix "
                              "the size in the testbed file", device=self.name)
        if self._geometry is None and geometry is not None:
            self._geometry = geometry
        size = self.geometry
        return DeviceIdentity(kind=identity.kind, manufacturer=identity.manufacturer,
                              model=identity.model, serial_number=identity.serial_number,
                              extra=(*identity.extra,
                                     ("size", f"{size.ingress_count}x{size.egress_count}")))

    @property
    def geometry(self) -> OcsGeometry:
        """The switch's size: configured, or read once (``*IDN?`` model code, else SIZE?)."""
        if self._geometry is None:
            _, geometry = parse_identity(self.link.query(IDN), device=self.name)
            if geometry is None:
                geometry = parse_size(self.link.query(SIZE), device=self.name)
            self._geometry = geometry
        return self._geometry

    @property
    def size(self) -> int:
        """N: the number of ingress ports (an N×N switch has N egress ports too)."""
        return self.geometry.ingress_count

    # ----- connections ------------------------------------------------------------------------

    def connections(self) -> dict[int, int]:
        """The connection table read back (``CONNect:STATe?``): {ingress: egress}."""
        return dict(sorted(parse_state(self.link.query(CONNECT_STATE), device=self.name).items()))

    def partner(self, port: int) -> int | None:
        """The port `port` is connected to (``CONNect:PORT?``), or None."""
        self.geometry.check_port(port)
        return parse_port_reply(self.link.query(f"{CONNECT_PORT} {port}"), device=self.name)

    def connect(self, pairs: Mapping[int, int]) -> None:
        """Add connections {ingress: egress} (``CONNect:ADD``), leaving the others.

        OcsCommandError when one of the ports is already connected.
        """
        table = self.geometry.validate_table(pairs)
        if table:
            self._set(format_connections(CONNECT_ADD, table), len(table))

    def disconnect(self, ingress_ports: Iterable[int]) -> None:
        """Remove the connections of `ingress_ports` (``CONNect:SUBtract (@i...),(@)``)."""
        ports = self.geometry.validate_ports(ingress_ports, side="ingress")
        if ports:
            self._set(f"{CONNECT_SUBTRACT} {format_channel_list(ports)},(@)", len(ports))

    def disconnect_all(self) -> None:
        """Remove every connection (``:OXC:SWIT:DISC:ALL``)."""
        self._set(DISCONNECT_ALL, self.geometry.ingress_count)

    def apply(self, table: Mapping[int, int]) -> None:
        """Make `table` the whole connection table (``CONNect:ONLY``); an empty table
        disconnects everything. Not verified: see `apply_verified`."""
        checked = self.geometry.validate_table(table)
        if not checked:
            self.disconnect_all()
            return
        self._set(format_connections(CONNECT_ONLY, checked), self.geometry.ingress_count)

    def apply_verified(self, table: Mapping[int, int]) -> dict[int, int]:
        """Apply `table` as one transaction and return the table read back (equal to it).

        Records the current table, applies, reads back; on an error, a timeout or a
        mismatch, restores the recorded table, reads it back and raises
        OcsTransactionError naming the first wrong port and what to do.
        """
        target = self.geometry.validate_table(table)
        with self.link.port.lock:
            before = self.connections()
            failure: OddlError | None = None
            try:
                self.apply(target)
            except OddlError as exc:
                failure = exc
            try:
                after: dict[int, int] | None = self.connections()
            except OddlError as exc:
                failure, after = failure or exc, None
            if failure is None and after == target:
                return after
            mismatches = _diff(target, after) if after is not None else {}
            report = self._restore(before)
        raise self._transaction_error(target, failure, mismatches, report)

    def _restore(self, before: dict[int, int]) -> list[str]:
        """Apply the recorded table again and read it back: one line for the report."""
        problem: OddlError | None = None
        try:
            self.apply(before)
        except OddlError as exc:
            problem = exc
        try:
            back = self.connections()
        except OddlError as exc:
            return [f"COULD NOT RESTORE the previous table ({_message(problem or exc)}); read "
                    "the switch's table (:OXC:SWIT:CONN:STAT?) and repair it by hand"]
        wrong = _diff(before, back)
        if not wrong:
            return [f"restored the previous table ({len(before)} connection(s)), read back equal"]
        ingress, (want, got) = next(iter(wrong.items()))
        why = f" ({_message(problem)})" if problem is not None else ""
        return [f"COULD NOT RESTORE the previous table: {_describe_mismatch(ingress, want, got)}"
                f"{why}; the rest of it is back; repair that connection by hand"]

    def _transaction_error(self, target: dict[int, int], failure: OddlError | None,
                           mismatches: Mismatches, report: list[str]) -> OcsTransactionError:
        restored = report[-1].startswith("restored")
        if mismatches:
            ingress, (want, got) = next(iter(mismatches.items()))
            problem = _describe_mismatch(ingress, want, got)
            if failure is not None:
                problem = f"{problem} after: {_message(failure)}"
            problem += "; " + self._diagnose([p for p in (ingress, want, got) if p is not None])
        else:  # the error's own message says what to check
            problem = _message(failure) if failure is not None else "no read-back"
        head = f"connection table of {len(target)} connection(s) not applied: {problem}"
        return OcsTransactionError(head, device=self.name, mismatches=mismatches,
                                   report=report, restored=restored)

    def _diagnose(self, ports: list[int]) -> str:
        """What to do about the ports of a mismatch, from their flags when they can be read."""
        try:
            flags = self.port_flags(ports)
        except OddlError:
            return f"check ports {', '.join(map(str, ports))}"
        fixes = {PortFlag.FAILED: "is failed: have it serviced or re-patch around it",
                 PortFlag.DISABLED: "is disabled: enable it (enable_ports) if it should carry "
                                    "light"}
        bad = [f"port {p} {fixes[f]}" for p, f in flags.items() if f is not PortFlag.ENABLED]
        if bad:
            return "; ".join(bad)
        return (f"ports {', '.join(map(str, ports))} are enabled; read the switch's error log "
                "and retry")

    # ----- ports ------------------------------------------------------------------------------

    def port_power(self, ports: Iterable[int]) -> dict[int, float]:
        """Power at each port's monitor in dBm (``:PMON:POW?``, at most 256 ports a query)."""
        checked = self.geometry.validate_ports(ports)
        out: dict[int, float] = {}
        for i in range(0, len(checked), MAX_POWER_PORTS):
            chunk = checked[i:i + MAX_POWER_PORTS]
            reply = self.link.query(f"{POWER} {format_channel_list(chunk)}")
            out.update(zip(chunk, parse_powers(reply, len(chunk), device=self.name),
                           strict=True))
        return out

    def port_flags(self, ports: Iterable[int] | None = None) -> dict[int, PortFlag]:
        """Each port's flag (``:OXC:SWIT:PORT:STAT?``): enabled, disabled or failed."""
        checked = (list(self.geometry.ports) if ports is None
                   else self.geometry.validate_ports(ports))
        reply = self.link.query(f"{PORT_STATE} {format_channel_list(checked)}")
        return dict(zip(checked, parse_port_flags(reply, len(checked), device=self.name),
                        strict=True))

    def port_states(self, ports: Iterable[int] | None = None) -> dict[int, PortState]:
        """Each port's status in SONiC's terms (blocked, tuned, failed) from its flag and the
        connection table."""
        flags = self.port_flags(ports)
        table = self.connections()
        connected = set(table) | set(table.values())
        return {p: port_state(f, p in connected) for p, f in flags.items()}

    def enable_ports(self, ports: Iterable[int]) -> None:
        """Let light through `ports` again (``:OXC:SWIT:PORT:ENAB``)."""
        checked = self.geometry.validate_ports(ports)
        if checked:
            self._set(f"{PORT_ENABLE} {format_channel_list(checked)}", 0)

    def disable_ports(self, ports: Iterable[int]) -> None:
        """Block light at `ports` (``:OXC:SWIT:PORT:DIS``); their connections stay."""
        checked = self.geometry.validate_ports(ports)
        if checked:
            self._set(f"{PORT_DISABLE} {format_channel_list(checked)}", 0)

    def errors(self) -> list[str]:
        """Drain the switch's error queue; the entries as ``code,"message"``."""
        return [str(e) for e in self.link.errors()]

    def _set(self, command: str, connections: int) -> None:
        self.last_switch_s = self.link.command(
            command, complete_within=self.timeout + self.switch_s * connections)
        logger.debug("%s: %s done in %.1f ms", self.name, command.split(" ", 1)[0],
                     self.last_switch_s * 1e3)
