"""Wire facts and the pure SCPI codec of a Polatis optical circuit switch (OCS); no I/O.

docs/reference/devices/ocs.md gives the source of each fact. In short: SCPI over TCP port
5025; ``:OXC:SWITch:CONNect:ONLY|ADD|SUBtract <ingress list>,<egress list>`` with channel
lists ``(@1,2,3)``; ``:OXC:SWITch:CONNect:STATe?`` answers ``(@1,2),(@17,18)`` (``(@),(@)``
when nothing is connected); ``:OXC:SWITch:CONNect:PORT? p`` answers the partner quoted
(``"18"``, ``""`` for none); on an N×M unit ingress ports are 1..N and egress N+1..N+M; the
model code in ``*IDN?`` carries the size (``N-OST-24x24-LA1-DMHNS``).

`OcsGeometry` checks a connection table before anything is sent (`InvalidConnectionTable`,
naming the port and the fix); the ``format_*`` functions build command lines; the ``parse_*``
functions read replies and raise `ProtocolError` for anything else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from oddl.common.errors import ProtocolError, SafetyLimitError
from oddl.drivers.interfaces import DeviceIdentity

__all__ = ["CONNECT_ADD", "CONNECT_ONLY", "CONNECT_PORT", "CONNECT_STATE", "CONNECT_SUBTRACT",
           "DISCONNECT_ALL", "ERROR_FIXES", "ERROR_NEXT", "IDN", "MAX_POWER_PORTS", "OPC",
           "POWER", "PORT_DISABLE", "PORT_ENABLE", "PORT_STATE", "SCPI_PORT", "SIZE",
           "InvalidConnectionTable", "OcsGeometry", "PortFlag", "PortState", "ScpiErrorEntry",
           "format_channel_list", "format_connections", "parse_channel_list", "parse_error",
           "parse_identity", "parse_port_flags", "parse_port_reply", "parse_powers",
           "parse_size", "parse_state", "port_state", "split_top_level"]

SCPI_PORT = 5025
"""The switch's SCPI socket port."""

# command headers as the driver sends them (short form; the switch takes any case, long or short)
IDN = "*IDN?"
OPC = "*OPC?"
ERROR_NEXT = ":SYST:ERR?"
CONNECT_ONLY = ":OXC:SWIT:CONN:ONLY"
CONNECT_ADD = ":OXC:SWIT:CONN:ADD"
CONNECT_SUBTRACT = ":OXC:SWIT:CONN:SUB"
CONNECT_PORT = ":OXC:SWIT:CONN:PORT?"
CONNECT_STATE = ":OXC:SWIT:CONN:STAT?"
DISCONNECT_ALL = ":OXC:SWIT:DISC:ALL"
SIZE = ":OXC:SWIT:SIZE?"
PORT_ENABLE = ":OXC:SWIT:PORT:ENAB"
PORT_DISABLE = ":OXC:SWIT:PORT:DIS"
PORT_STATE = ":OXC:SWIT:PORT:STAT?"
POWER = ":PMON:POW?"
MAX_POWER_PORTS = 256
"""Most ports one power query reads (a published client splits longer lists)."""

ERROR_FIXES: dict[int, str] = {
    -113: "the switch does not know this command; check its firmware and the command form",
    -221: "a port of the request is already connected (or listed twice); disconnect it first, "
          "or use apply(), which replaces the whole table",
    -222: "a port is out of range: ingress ports are 1..N and egress N+1..N+M; check the size "
          "(*IDN?) and the port map",
    -224: "the ingress and egress lists differ in length; give one egress per ingress",
    -240: "the switch reports a hardware fault on a port; read its port states "
          "(:OXC:SWIT:PORT:STAT?) and have the port serviced",
}
"""What an operator should do about the errors the switch queues."""

_ERROR = re.compile(r'\s*([+-]?\d+)\s*,\s*"(.*)"\s*')
_RANGE = re.compile(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?")
_SIZE_IN_MODEL = re.compile(r"-(\d+)x(\d+)-", re.IGNORECASE)


class InvalidConnectionTable(SafetyLimitError, ValueError):
    """A connection request the switch cannot take (unknown port, wrong side, a port twice).

    Raised before anything is sent.
    """


class PortFlag(StrEnum):
    """A port's state as ``:OXC:SWITch:PORT:STATe?`` reports it."""

    ENABLED = "E"
    DISABLED = "D"
    FAILED = "F"


class PortState(StrEnum):
    """A port's operational status in SONiC's OCS model (sonic-net/SONiC doc/ocs/ocs_hld.md)."""

    BLOCKED = "blocked"
    TUNING = "tuning"
    TUNED = "tuned"
    FAILED = "failed"


@dataclass(frozen=True)
class ScpiErrorEntry:
    """One entry of the error queue: ``-222,"Data out of range"``."""

    code: int
    message: str

    def __str__(self) -> str:
        return f'{self.code},"{self.message}"'


@dataclass(frozen=True)
class OcsGeometry:
    """An N×M switch: ingress ports 1..N, egress ports N+1..N+M."""

    ingress_count: int
    egress_count: int

    def __post_init__(self) -> None:
        if self.ingress_count < 1 or self.egress_count < 1:
            raise ValueError(f"a {self.ingress_count}x{self.egress_count} switch has no ports; "
                             "use at least 1x1")

    @property
    def ingress(self) -> range:
        return range(1, self.ingress_count + 1)

    @property
    def egress(self) -> range:
        return range(self.ingress_count + 1, self.ingress_count + self.egress_count + 1)

    @property
    def ports(self) -> range:
        return range(1, self.ingress_count + self.egress_count + 1)

    def describe(self) -> str:
        """``16x16 (ingress 1..16, egress 17..32)``."""
        n, last = self.ingress_count, self.ingress_count + self.egress_count
        return f"{n}x{self.egress_count} (ingress 1..{n}, egress {n + 1}..{last})"

    def check_port(self, port: int) -> None:
        """InvalidConnectionTable unless `port` is a port of this switch."""
        if isinstance(port, bool) or not isinstance(port, int) or port not in self.ports:
            raise InvalidConnectionTable(f"port {port!r} does not exist on this "
                                         f"{self.describe()} switch; use ports 1..{self.ports[-1]}")

    def check_ingress(self, port: int) -> None:
        """InvalidConnectionTable unless `port` is an ingress port; the message says the fix."""
        self.check_port(port)
        if port not in self.ingress:
            raise InvalidConnectionTable(f"port {port} is an egress port; a connection goes from "
                                         f"an ingress port (1..{self.ingress_count}) to an egress "
                                         f"port: swap the pair")

    def check_egress(self, port: int) -> None:
        """InvalidConnectionTable unless `port` is an egress port; the message says the fix."""
        self.check_port(port)
        if port not in self.egress:
            raise InvalidConnectionTable(f"port {port} is an ingress port; the partner of an "
                                         f"ingress port is an egress port "
                                         f"({self.egress[0]}..{self.egress[-1]}): swap the pair")

    def validate_table(self, table: Mapping[int, int]) -> dict[int, int]:
        """{ingress: egress} checked: sides right, no egress twice; a sorted copy."""
        owner: dict[int, int] = {}
        for ingress, egress in sorted(table.items()):
            self.check_ingress(ingress)
            self.check_egress(egress)
            if egress in owner:
                raise InvalidConnectionTable(
                    f"egress port {egress} is given to ingress {owner[egress]} and {ingress}; an "
                    "egress port takes one ingress port: drop one of the two")
            owner[egress] = ingress
        return dict(sorted(table.items()))

    def validate_ports(self, ports: Iterable[int], *, side: str = "any") -> list[int]:
        """Ports checked (side "ingress", "egress" or "any"), each once; in the given order."""
        out: list[int] = []
        for port in ports:
            {"ingress": self.check_ingress, "egress": self.check_egress,
             "any": self.check_port}[side](port)
            if port in out:
                raise InvalidConnectionTable(f"port {port} is listed twice; list each port once")
            out.append(port)
        return out


# ----- channel lists ------------------------------------------------------------------------

def format_channel_list(ports: Iterable[int]) -> str:
    """``(@1,2,3)``; ``(@)`` for none."""
    return "(@" + ",".join(str(int(p)) for p in ports) + ")"


def parse_channel_list(text: str) -> list[int]:
    """``(@1,2,5:7)`` -> [1, 2, 5, 6, 7]; ``(@)`` -> []. ValueError for anything else.

    Ranges ``a:b`` are SCPI channel-list syntax (SCPI-99); the switch's own replies list
    every port.
    """
    body = text.strip()
    if not (body.startswith("(@") and body.endswith(")")):
        raise ValueError(f"{text!r} is not a channel list (@...)")
    body = body[2:-1]
    if not body.strip():
        return []
    ports: list[int] = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item)
        if m is None:
            raise ValueError(f"{item!r} in {text!r} is not a port or a range a:b")
        first, last = int(m[1]), int(m[2] or m[1])
        step = 1 if last >= first else -1
        ports.extend(range(first, last + step, step))
    return ports


def split_top_level(text: str) -> list[str]:
    """Split at commas outside parentheses: ``(@1,2),(@3,4)`` -> ['(@1,2)', '(@3,4)']."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def format_connections(header: str, table: Mapping[int, int]) -> str:
    """``:OXC:SWIT:CONN:ADD (@1,2),(@17,18)`` from {ingress: egress}, by ingress."""
    pairs = sorted(table.items())
    return (f"{header} {format_channel_list(i for i, _ in pairs)},"
            f"{format_channel_list(e for _, e in pairs)}")


# ----- replies --------------------------------------------------------------------------------

def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1].strip()
    return text


def parse_state(reply: str, *, device: str = "") -> dict[int, int]:
    """``(@1,2),(@19,18)`` -> {1: 19, 2: 18}; ``(@),(@)`` -> {}."""
    parts = split_top_level(reply.strip())
    try:
        if len(parts) != 2:
            raise ValueError("expected two channel lists")
        ingress, egress = (parse_channel_list(p) for p in parts)
    except ValueError as exc:
        raise ProtocolError(f"connection state {reply!r} is not '(@ingress...),(@egress...)' "
                            f"({exc})", device=device) from None
    if len(ingress) != len(egress) or len(set(ingress)) != len(ingress):
        raise ProtocolError(f"connection state {reply!r} does not pair each ingress port with "
                            "one egress port", device=device)
    return dict(zip(ingress, egress, strict=True))


def parse_port_reply(reply: str, *, device: str = "") -> int | None:
    """The partner in a ``PORT?`` reply: ``"18"`` -> 18; ``""``, ``"0"`` or empty -> None."""
    text = _unquote(reply)
    if not text:
        return None
    if text.startswith("(@") and text.endswith(")"):  # tolerate a channel-list answer
        try:
            ports = parse_channel_list(text)
        except ValueError:
            ports = [-1, -1]
        if len(ports) > 1:
            raise ProtocolError(f"PORT? answered {reply!r}; expected one port", device=device)
        return ports[0] if ports and ports[0] > 0 else None
    if not text.isdigit():
        raise ProtocolError(f"PORT? answered {reply!r}; expected a port number in quotes",
                            device=device)
    return int(text) or None


def parse_error(reply: str, *, device: str = "") -> ScpiErrorEntry:
    """``-222,"Data out of range"`` (a space or a sign allowed) -> ScpiErrorEntry."""
    m = _ERROR.fullmatch(reply)
    if m is None:
        raise ProtocolError(f'SYST:ERR? answered {reply!r}; expected <code>,"<message>"',
                            device=device)
    return ScpiErrorEntry(int(m[1]), m[2])


def parse_size(reply: str, *, device: str = "") -> OcsGeometry:
    """``16,16`` (ingress, egress) -> OcsGeometry."""
    parts = [p.strip() for p in reply.split(",")]
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ProtocolError(f"SIZE? answered {reply!r}; expected '<ingress>,<egress>'",
                            device=device)
    return OcsGeometry(int(parts[0]), int(parts[1]))


def parse_identity(reply: str, *, device: str = "") -> tuple[DeviceIdentity, OcsGeometry | None]:
    """``Polatis,N-OST-24x24-LA1-DMHNS,002414,6.5.2.18`` -> identity, and the size when the
    model code carries it (``-<N>x<M>-``)."""
    fields = [f.strip() for f in reply.split(",")]
    if len(fields) < 4 or not fields[0] or not fields[1]:
        raise ProtocolError(f"*IDN? answered {reply!r}; expected "
                            "'<maker>,<model>,<serial>,<firmware>'", device=device)
    maker, model, serial = fields[:3]
    firmware = ",".join(fields[3:])
    m = _SIZE_IN_MODEL.search(model)
    geometry = OcsGeometry(int(m[1]), int(m[2])) if m and int(m[1]) and int(m[2]) else None
    identity = DeviceIdentity(kind="ocs", manufacturer=maker, model=model,
                              serial_number=serial, extra=(("firmware", firmware),))
    return identity, geometry


def _list_body(reply: str) -> list[str]:
    text = reply.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return [p.strip() for p in text.split(",")] if text.strip() else []


def parse_powers(reply: str, count: int, *, device: str = "") -> list[float]:
    """``(-3.50,-60.00)`` (parentheses optional) -> dBm values, exactly `count` of them."""
    try:
        values = [float(p) for p in _list_body(reply)]
    except ValueError:
        values = []
    if len(values) != count or not all(math.isfinite(v) for v in values):
        raise ProtocolError(f"PMON:POW? answered {reply!r}; expected {count} power reading(s) "
                            "in dBm", device=device)
    return values


def parse_port_flags(reply: str, count: int, *, device: str = "") -> list[PortFlag]:
    """``(E,D,F)`` -> [ENABLED, DISABLED, FAILED], exactly `count` of them."""
    flags = [p.upper() for p in _list_body(reply)]
    if len(flags) != count or any(f not in ("E", "D", "F") for f in flags):
        raise ProtocolError(f"PORT:STAT? answered {reply!r}; expected {count} of E, D, F",
                            device=device)
    return [PortFlag(f) for f in flags]


def port_state(flag: PortFlag, connected: bool) -> PortState:
    """SONiC's status of a port from its flag and whether it has a connection.

    A failed port is failed, a disabled port blocked (SONiC's ``force_blocked``), an enabled
    one tuned when connected, else blocked. SCPI shows no switching in progress, so a read
    never gives ``tuning``.
    """
    if flag is PortFlag.FAILED:
        return PortState.FAILED
    if flag is PortFlag.DISABLED or not connected:
        return PortState.BLOCKED
    return PortState.TUNED
