"""Pure line codec of the flexgrid WSS driver: route tables, RRA? and error replies, limits.

No I/O; ``oddl.drivers.wss`` uses it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from oddl.common.errors import ProtocolError, SafetyLimitError
from oddl.drivers.interfaces import BLOCKED_DB, BLOCKED_PORT, Route
from oddl.drivers.wss_protocol import (
    ERROR_MEANINGS,
    FACTORY_PLAN,
    ChecksumError,
    WssErrorCode,
    unframe,
)

__all__ = [
    "ATTENUATION_STEP_DB",
    "InvalidRouteTable",
    "WssErrorReply",
    "WssLimits",
    "describe",
    "format_attenuation",
    "format_table",
    "format_ura",
    "parse_error_line",
    "parse_rra",
]

ATTENUATION_STEP_DB = 0.1
"""Resolution of the attenuation field on the wire (dB)."""

class InvalidRouteTable(SafetyLimitError, ValueError):
    """A route table the WSS cannot take (empty, unknown channel or port, bad attenuation).

    Raised before anything is sent.
    """


@dataclass(frozen=True)
class WssErrorReply:
    """A parsed error reply: its code and what the code means."""

    code: WssErrorCode
    text: str


@dataclass(frozen=True)
class WssLimits:
    """What one WSS module accepts; a table outside these limits is refused before sending.

    Channels are ``first_channel .. first_channel + channels - 1`` (the factory fixed grid
    numbers them from 0: ``WssLimits.factory()``); ports are ``1..ports`` and 99 (blocked).
    """

    channels: int = 48
    ports: int = 4
    max_attenuation_db: float = 25.0
    first_channel: int = 1

    @classmethod
    def factory(cls, ports: int = 4, max_attenuation_db: float = 25.0) -> WssLimits:
        """Limits of a module in its factory 50 GHz plan (channels 0..95)."""
        return cls(channels=FACTORY_PLAN.channels, ports=ports,
                   max_attenuation_db=max_attenuation_db,
                   first_channel=FACTORY_PLAN.first_channel)

    def validate(self, table: Mapping[int, Route]) -> None:
        """Raise InvalidRouteTable naming the first entry this module cannot take."""
        if not table:
            raise InvalidRouteTable("empty route table: stage at least one channel")
        last = self.first_channel + self.channels - 1
        for channel, route in table.items():
            if isinstance(channel, bool) or not isinstance(channel, int):
                raise InvalidRouteTable(f"channel {channel!r} is not an integer")
            if not self.first_channel <= channel <= last:
                raise InvalidRouteTable(f"channel {channel} is outside {self.first_channel}.."
                                        f"{last}; use a channel of this WSS's plan")
            if not isinstance(route, Route):
                raise InvalidRouteTable(f"channel {channel}: {route!r} is not a Route")
            port = route.port
            if (isinstance(port, bool) or not isinstance(port, int)
                    or not (1 <= port <= self.ports or port == BLOCKED_PORT)):
                raise InvalidRouteTable(
                    f"channel {channel}: out-port {port!r} is outside 1..{self.ports}; use "
                    f"{BLOCKED_PORT} to block by port")
            att = route.attenuation_db
            if isinstance(att, bool) or not isinstance(att, (int, float)) or not math.isfinite(att):
                raise InvalidRouteTable(f"channel {channel}: attenuation {att!r} is not a number")
            if att == BLOCKED_DB:
                continue
            if not 0.0 <= att <= self.max_attenuation_db:
                raise InvalidRouteTable(
                    f"channel {channel}: attenuation {att} dB is outside "
                    f"0..{self.max_attenuation_db} dB (use {BLOCKED_DB} to block)")
            steps = att / ATTENUATION_STEP_DB
            if abs(steps - round(steps)) > 1e-6:
                raise InvalidRouteTable(
                    f"channel {channel}: attenuation {att} dB is not on the "
                    f"{ATTENUATION_STEP_DB} dB grid; round it before staging")


# --- pure line codec --------------------------------------------------------------------------

def format_attenuation(attenuation_db: float) -> str:
    """Format an attenuation (dB) as the wire field: one decimal, e.g. ``99.9``."""
    return f"{attenuation_db:.1f}"


def format_table(table: Mapping[int, Route]) -> str:
    """Format a table as ``ch,port,att;...`` in channel order (no validation)."""
    return ";".join(f"{ch},{table[ch].port},{format_attenuation(table[ch].attenuation_db)}"
                    for ch in sorted(table))


def format_ura(table: Mapping[int, Route], command: str = "URA") -> str:
    """Return the ``URA`` (or ``UCA``) command line (without terminator) for `table`."""
    return f"{command} {format_table(table)}"


_ENTRY = re.compile(r"([0-9]+),([0-9]+),([0-9]+(?:\.[0-9]+)?)")


def parse_rra(lines: str | Sequence[str], *, device: str = "") -> dict[int, Route]:
    """Parse the ``RRA?`` result (one line, or several to be joined) into {channel: Route}."""
    parts = [lines] if isinstance(lines, str) else list(lines)
    table: dict[int, Route] = {}
    for line in parts:
        body = line.strip().removesuffix(";")
        if not body:
            raise ProtocolError(f"empty RRA? result line {line!r}", device=device)
        for entry in body.split(";"):
            m = _ENTRY.fullmatch(entry.strip())
            if m is None:
                raise ProtocolError(f"RRA? entry {entry!r} is not 'ch,port,att' in {line!r}",
                                    device=device)
            channel = int(m.group(1))
            if channel in table:
                raise ProtocolError(f"RRA? lists channel {channel} twice", device=device)
            table[channel] = Route(int(m.group(2)), float(m.group(3)))
    return table


def parse_error_line(line: str) -> WssErrorReply | None:
    """Parse an error reply (``CER``, ``^RER$FF25`` ...); None if `line` is not one."""
    try:
        text, _ = unframe(line.strip())
    except ChecksumError:
        return None
    try:
        code = WssErrorCode(text.strip().upper())
    except ValueError:
        return None
    return WssErrorReply(code, ERROR_MEANINGS[code])


def describe(command: str) -> str:
    """Short name of a command for messages: a long table is summarised."""
    word, _, args = command.partition(" ")
    if word in ("URA", "UCA", "DCC") and args:
        n = args.rstrip(";").count(";") + 1
        return f"{word} ({n} channel{'s' if n != 1 else ''})"
    return command
