"""The SCPI commands of the emulated optical circuit switch and the table that routes headers.

``OcsCommands`` works on a ``SwitchModel`` and the error queue: one handler per command the
sources name (docs/reference/devices/ocs.md): the connection commands of ``:OXC:SWITch``
(``CONNect:ONLY|ADD|SUBtract``, ``CONNect:PORT?``, ``CONNect:STATe?``, ``DISConnect:ALL``,
``SIZE?``, ``PORT:ENABle|DISable|STATe?``), the power monitors (``:PMONitor:POWer?``) and
``:SYSTem:ERRor[:NEXT]?`` / ``:SYSTem:ERRor:ALL?``. Each handler takes the unit's parameters
and returns its answer (None for a setting); bad input raises ScpiError. The emulator parses
its own channel lists here; it shares no code with the driver's codec, so a test of one
against the other checks both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from oddl.drivers.emulators.ocs_model import SwitchModel
from oddl.drivers.emulators.scpi import SCPI_ERRORS, Node, ScpiError, compile_pattern

__all__ = ["ERROR_MESSAGES", "MAX_POWER_PORTS", "OcsCommands", "Row", "format_error",
           "parse_ports", "split_parameters"]

MAX_POWER_PORTS = 256
"""Most ports one power query may name (a published client reads at most 256 at a time)."""
ERROR_MESSAGES: dict[int, str] = {0: "No error", **SCPI_ERRORS, -240: "Hardware error"}

_ITEM = re.compile(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?")

Handler = Callable[[list[str]], str | None]


@dataclass(frozen=True)
class Row:
    """One header the switch knows: its pattern, handler, and whether it is a query."""

    nodes: tuple[Node, ...]
    handler: Handler
    query: bool


def format_error(code: int) -> str:
    """An error-queue entry the SCPI-99 way: ``-222,"Data out of range"``."""
    return f'{code},"{ERROR_MESSAGES.get(code, "Device-specific error")}"'


def split_parameters(text: str) -> list[str]:
    """Parameters separated by commas outside parentheses (channel lists hold commas)."""
    if not text.strip():
        return []
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if depth != 0:
        raise ScpiError(-104)
    parts.append(text[start:].strip())
    return parts


def parse_ports(text: str, *, bare: bool = False) -> list[int]:
    """A channel list ``(@1,2,5:7)`` (spaces allowed, ``(@)`` empty), or with `bare` one port
    number (``PORT? 2``); -104 otherwise."""
    body = text.strip()
    if bare and body.isdigit():
        return [int(body)]
    if not (body.startswith("(@") and body.endswith(")")):
        raise ScpiError(-104)
    body = body[2:-1]
    if not body.strip():
        return []
    ports: list[int] = []
    for item in body.split(","):
        m = _ITEM.fullmatch(item)
        if m is None:
            raise ScpiError(-104)
        lo, hi = int(m[1]), int(m[2] or m[1])
        ports.extend(range(lo, hi + 1) if hi >= lo else range(lo, hi - 1, -1))
    return ports


def _two_lists(params: list[str]) -> tuple[list[int], list[int]]:
    """<ingress list>,<egress list>[,<mode>]: the mode one client's notes show is taken and
    ignored (no source says what it does)."""
    if len(params) < 2 or not params[0] or not params[1]:
        raise ScpiError(-109)
    if len(params) > 3:
        raise ScpiError(-108)
    return parse_ports(params[0]), parse_ports(params[1])


def _no_parameters(params: list[str]) -> None:
    if params:
        raise ScpiError(-108)


class OcsCommands:
    """The handlers over one switch and its error queue, and their header table (``table``)."""

    def __init__(self, switch: SwitchModel, errors: list[int],
                 push_error: Callable[[int], None]) -> None:
        self.switch = switch
        self.errors = errors
        self._push = push_error
        rows: list[tuple[str, Handler, bool]] = [
            ("OXC:SWITch:CONNect:ONLY", self.connect_only, False),
            ("OXC:SWITch:CONNect:ADD", self.connect_add, False),
            ("OXC:SWITch:CONNect:SUBtract", self.connect_subtract, False),
            ("OXC:SWITch:CONNect:PORT", self.connect_port, True),
            ("OXC:SWITch:CONNect:STATe", self.connect_state, True),
            ("OXC:SWITch:DISConnect:ALL", self.disconnect_all, False),
            ("OXC:SWITch:SIZE", self.size, True),
            ("OXC:SWITch:PORT:ENABle", self.port_enable, False),
            ("OXC:SWITch:PORT:DISable", self.port_disable, False),
            ("OXC:SWITch:PORT:STATe", self.port_state, True),
            ("PMONitor:POWer", self.power, True),
            ("SYSTem:ERRor:ALL", self.error_all, True),
            ("SYSTem:ERRor:[NEXT]", self.error_next, True),
        ]
        self.table = [Row(compile_pattern(p), h, q) for p, h, q in rows]

    # ----- connections --------------------------------------------------------------------

    def _queue(self, codes: list[int]) -> None:
        for code in codes:
            self._push(code)

    def connect_only(self, params: list[str]) -> str | None:
        self._queue(self.switch.only(*_two_lists(params)))
        return None

    def connect_add(self, params: list[str]) -> str | None:
        self._queue(self.switch.add(*_two_lists(params)))
        return None

    def connect_subtract(self, params: list[str]) -> str | None:
        if len(params) == 1 and params[0]:  # SUB (@1,2): break whatever those ports have
            params = [params[0], "(@)"]
        self.switch.subtract(*_two_lists(params))
        return None

    def connect_port(self, params: list[str]) -> str | None:
        if len(params) != 1 or not params[0]:
            raise ScpiError(-109 if not params or not params[0] else -108)
        ports = self.switch.check_ports(parse_ports(params[0], bare=True))
        if len(ports) != 1:
            raise ScpiError(-224)
        partner = self.switch.partner(ports[0])
        return f'"{partner}"' if partner is not None else '""'

    def connect_state(self, params: list[str]) -> str | None:
        _no_parameters(params)
        table = self.switch.connections
        ingress = ",".join(str(i) for i in table)
        egress = ",".join(str(e) for e in table.values())
        return f"(@{ingress}),(@{egress})"

    def disconnect_all(self, params: list[str]) -> str | None:
        _no_parameters(params)
        self.switch.disconnect_all()
        return None

    def size(self, params: list[str]) -> str | None:
        _no_parameters(params)
        return f"{self.switch.size},{self.switch.size}"

    # ----- ports --------------------------------------------------------------------------

    def _port_list(self, params: list[str], *, default_all: bool) -> list[int]:
        if not params and default_all:
            return list(self.switch.ports)
        if len(params) != 1 or not params[0]:
            raise ScpiError(-109 if not params or not params[0] else -108)
        return self.switch.check_ports(parse_ports(params[0]))

    def port_enable(self, params: list[str]) -> str | None:
        self.switch.set_enabled(self._port_list(params, default_all=False), True)
        return None

    def port_disable(self, params: list[str]) -> str | None:
        self.switch.set_enabled(self._port_list(params, default_all=False), False)
        return None

    def port_state(self, params: list[str]) -> str | None:
        ports = self._port_list(params, default_all=True)
        return "(" + ",".join(self.switch.flag(p) for p in ports) + ")"

    def power(self, params: list[str]) -> str | None:
        ports = self._port_list(params, default_all=False)
        if len(ports) > MAX_POWER_PORTS:
            raise ScpiError(-223)
        return "(" + ",".join(f"{self.switch.power_dbm(p):.2f}" for p in ports) + ")"

    # ----- error queue ----------------------------------------------------------------------

    def error_next(self, params: list[str]) -> str | None:
        _no_parameters(params)
        return format_error(self.errors.pop(0) if self.errors else 0)

    def error_all(self, params: list[str]) -> str | None:
        _no_parameters(params)
        if not self.errors:
            return format_error(0)
        out = ",".join(format_error(code) for code in self.errors)
        self.errors.clear()
        return out
