"""Driver for a flexgrid wavelength-selective switch speaking the Finisar/II-VI ASCII protocol.

Documented facts (testbed research notes, devices.md §3 and §6):

- Link 115200 8N1, lines terminated by CR-LF.
- ``SNO?`` serial number, ``MFD?`` manufacture date, ``RRA?`` read the active array,
  ``URA ch,port,att;ch,port,att;...`` stage entries, ``RSW`` make the staged array active.
- Attenuation 99.9 dB means blocked. ``URA`` changes only the staged array; after ``RSW`` the
  optics settle for a while (~100 ms on LCoS) and the output is undefined meanwhile.

Reconstruction (not documented; chosen here, mirrored by ``wss_emulator``; check against the
vendor manual before trusting it on hardware):

- Every reply starts with an echo of the command line. A query (``SNO?``, ``MFD?``, ``RRA?``)
  then sends one result line. A successful command ends with ``OK``. This matches the public
  automation script the notes cite (one read for the echo, one for the result, one for ``OK``).
- A refused command ends with one error line instead of ``OK``: ``ERR <code> <text>``. The
  parser also accepts ``ERROR``, a missing code and ``:``/``,`` separators. Codes used by the
  emulator: 1 unknown command, 2 syntax, 3 channel out of range, 4 port out of range,
  5 attenuation out of range or off the 0.1 dB grid, 6 channel listed twice, 7 device fault.
- The settle time shows on the wire as the delay of ``RSW``'s ``OK``: the echo comes at once,
  and ``OK`` only when the new array is optically active. ``apply()`` therefore waits for ``OK``
  with the settle timeout and records the time it took in ``last_settle_s``.
- ``RRA?`` lists every channel as ``ch,port,att`` joined by ``;``; port 0 means "no out-port"
  (blocked, as on the WaveShaper), which is also the power-up state.
- Attenuations go on the wire with one decimal; values off the 0.1 dB grid are refused before
  sending rather than rounded, so a read-back always equals what was staged.

Recovery: a timeout or a garbled reply leaves unknown bytes in flight, so the next exchange
first drains the input (discard what is buffered, then wait for a short quiet period). A reply
that is later still (say, RSW's ``OK`` after ``apply()`` gave up) shows up before the next echo;
in the first exchange after a drain, up to 8 printable lines before the echo are dropped and
logged. Non-ASCII bytes are always a ProtocolError.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

from oddl.drivers.interfaces import BLOCKED_DB, DeviceIdentity, Route
from oddl.drivers.transport import Transport
from oddl.errors import DeviceError, DeviceTimeout, ProtocolError, SafetyLimitError

logger = logging.getLogger(__name__)

__all__ = [
    "ATTENUATION_STEP_DB",
    "ERROR_FIXES",
    "FlexgridWss",
    "InvalidRouteTable",
    "WssCommandError",
    "WssErrorReply",
    "WssLimits",
    "format_attenuation",
    "format_table",
    "format_ura",
    "parse_error_line",
    "parse_rra",
]

ATTENUATION_STEP_DB = 0.1
"""Resolution of the attenuation field on the wire (dB)."""

TERMINATOR = "\r\n"

CMD_SERIAL = "SNO?"
CMD_DATE = "MFD?"
CMD_READ_ACTIVE = "RRA?"
CMD_STAGE = "URA"
CMD_SWITCH = "RSW"

ERROR_FIXES: dict[int, str] = {
    1: "the module does not know this command; check it runs the flexgrid ASCII firmware",
    2: "the command is malformed; this is a driver/firmware mismatch, report it with the log",
    3: "use channel numbers the module supports (channels= in the testbed file)",
    4: "use out-ports that exist on this module (ports= in the testbed file)",
    5: "keep attenuation within the module's range on the 0.1 dB grid, or 99.9 to block",
    6: "list each channel once per table",
    7: "the module reports an internal fault; read RRA? and power-cycle it if it persists",
}
"""What an operator should do about each (reconstructed) error code."""

_MAX_STALE_LINES = 8
"""Printable lines tolerated before the echo in the first exchange after a resync."""

_GENERIC_FIX = "check the command against the module manual and the module's front-panel status"


class InvalidRouteTable(SafetyLimitError, ValueError):
    """A route table the WSS cannot take (empty, unknown channel or port, bad attenuation).

    Raised before anything is sent.
    """


class WssCommandError(DeviceError):
    """The WSS answered a command with an error line; the link is still in step."""

    def __init__(self, message: str, *, device: str = "", command: str = "",
                 code: int | None = None) -> None:
        super().__init__(message, device=device)
        self.command = command
        self.code = code


@dataclass(frozen=True)
class WssErrorReply:
    """A parsed error line: numeric code (None when the device gave none) and its text."""

    code: int | None
    text: str


@dataclass(frozen=True)
class WssLimits:
    """What one WSS module accepts; a table outside these limits is refused before sending."""

    channels: int = 48
    ports: int = 4
    max_attenuation_db: float = 25.0

    def validate(self, table: Mapping[int, Route]) -> None:
        """Raise InvalidRouteTable naming the first entry this module cannot take."""
        if not table:
            raise InvalidRouteTable("empty route table: stage at least one channel")
        for channel, route in table.items():
            if isinstance(channel, bool) or not isinstance(channel, int):
                raise InvalidRouteTable(f"channel {channel!r} is not an integer")
            if not 1 <= channel <= self.channels:
                raise InvalidRouteTable(
                    f"channel {channel} is outside 1..{self.channels}; use a channel this WSS has")
            if not isinstance(route, Route):
                raise InvalidRouteTable(f"channel {channel}: {route!r} is not a Route")
            port = route.port
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= self.ports:
                raise InvalidRouteTable(
                    f"channel {channel}: out-port {port!r} is outside 0..{self.ports} "
                    "(0 = no out-port)")
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


def format_ura(table: Mapping[int, Route]) -> str:
    """Return the ``URA`` command line (without terminator) that stages `table`."""
    return f"{CMD_STAGE} {format_table(table)}"


_ENTRY = re.compile(r"([0-9]+),([0-9]+),([0-9]+(?:\.[0-9]+)?)")


def parse_rra(line: str, *, device: str = "") -> dict[int, Route]:
    """Parse an ``RRA?`` result line into {channel: Route}; raise ProtocolError if malformed."""
    body = line.strip()
    if body.endswith(";"):
        body = body[:-1]
    if not body:
        raise ProtocolError(f"empty RRA? result {line!r}", device=device)
    table: dict[int, Route] = {}
    for entry in body.split(";"):
        m = _ENTRY.fullmatch(entry.strip())
        if m is None:
            raise ProtocolError(f"RRA? entry {entry!r} is not 'ch,port,att' in {line!r}",
                                device=device)
        channel, port = int(m.group(1)), int(m.group(2))
        if channel < 1:
            raise ProtocolError(f"RRA? lists channel {channel} (channels start at 1)",
                                device=device)
        if channel in table:
            raise ProtocolError(f"RRA? lists channel {channel} twice", device=device)
        table[channel] = Route(port, float(m.group(3)))
    return table


_ERROR = re.compile(r"ERR(?:OR)?(?![A-Z])[\s:,]*([0-9]+)?[\s:,-]*(.*)", re.IGNORECASE)


def parse_error_line(line: str) -> WssErrorReply | None:
    """Parse an error line (``ERR 3 channel out of range``); None if `line` is not one."""
    m = _ERROR.fullmatch(line.strip())
    if m is None:
        return None
    code = int(m.group(1)) if m.group(1) is not None else None
    return WssErrorReply(code, m.group(2).strip())


def _describe(command: str) -> str:
    """Short name of a command for messages: a URA with many entries is summarised."""
    if command.startswith(CMD_STAGE + " "):
        n = command.count(";") + 1
        return f"{CMD_STAGE} ({n} channel{'s' if n != 1 else ''})"
    return command


# --- driver -------------------------------------------------------------------------------------

class FlexgridWss:
    """A flexgrid WSS on an ASCII serial link (any Transport: serial port, socket://, fake).

    Implements ``oddl.drivers.interfaces.WavelengthSelectiveSwitch``. Every exchange holds a
    lock, so one driver may be shared between threads. Times are in seconds.
    """

    def __init__(self, transport: Transport, name: str = "wss", *,
                 settle_timeout: float = 5.0, timeout: float = 1.0,
                 limits: WssLimits | None = None, resync_quiet: float = 0.05) -> None:
        self.name = name
        self.limits = limits or WssLimits()
        self.settle_timeout = settle_timeout
        self.timeout = timeout
        self.resync_quiet = resync_quiet
        self.last_settle_s: float | None = None
        """How long the last ``apply()`` waited for the switch to settle (s)."""
        self._transport = transport
        self._lock = threading.RLock()
        self._dirty = False
        self._after_resync = False
        self._closed = False
        self._last_port: dict[int, int] = {}

    # context manager ---------------------------------------------------------------------------
    def __enter__(self) -> FlexgridWss:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Release the link; the optical state is left as it is."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._transport.close()
                logger.debug("%s: link closed", self.name)

    # operations --------------------------------------------------------------------------------
    def identify(self) -> DeviceIdentity:
        """Read the serial number (SNO?) and manufacture date (MFD?)."""
        with self._lock:
            serial = self._query(CMD_SERIAL)
            date = self._query(CMD_DATE)
        return DeviceIdentity(kind="wss", manufacturer="Finisar/II-VI",
                              model="flexgrid WSS (ASCII serial)", serial_number=serial,
                              extra=(("manufacture_date", date),))

    def stage(self, table: Mapping[int, Route]) -> None:
        """Load `table` ({channel: Route(port, dB)}) as the staged array with URA.

        The active optics do not change until ``apply()``. Raises InvalidRouteTable (nothing
        sent) for an empty table, an unknown channel or port, or a bad attenuation.
        """
        self.limits.validate(table)
        with self._lock:
            self._command(format_ura(table))
            self._last_port.update({ch: r.port for ch, r in table.items()})

    def apply(self, timeout: float | None = None) -> None:
        """Make the staged array active (RSW) and wait until the switch has settled.

        `timeout` (s, default ``settle_timeout``) bounds the wait for the settled ``OK``;
        DeviceTimeout if it does not come.
        """
        wait = self.settle_timeout if timeout is None else timeout
        with self._lock:
            t0 = time.monotonic()
            self._command(CMD_SWITCH, final_timeout=wait)
            self.last_settle_s = time.monotonic() - t0
        logger.debug("%s: switched and settled in %.1f ms", self.name, self.last_settle_s * 1e3)

    def read_active(self) -> dict[int, Route]:
        """Read the active array (RRA?) as {channel: Route}; 99.9 dB means blocked."""
        with self._lock:
            return parse_rra(self._query(CMD_READ_ACTIVE), device=self.name)

    def block(self, channel: int, timeout: float | None = None) -> None:
        """Block `channel` (stage it at 99.9 dB, then apply and wait for the settle).

        The out-port is the one this driver last staged for the channel (1 if none), so a block
        never moves light to another port.
        """
        with self._lock:
            port = self._last_port.get(channel, 1) or 1
            self.stage({channel: Route(port, BLOCKED_DB)})
            self.apply(timeout)

    # wire --------------------------------------------------------------------------------------
    def _query(self, command: str) -> str:
        result = self._exchange(command, expect_result=True, final_timeout=self.timeout)
        return "" if result is None else result

    def _command(self, command: str, final_timeout: float | None = None) -> None:
        self._exchange(command, expect_result=False,
                       final_timeout=self.timeout if final_timeout is None else final_timeout)

    def _exchange(self, command: str, *, expect_result: bool, final_timeout: float) -> str | None:
        with self._lock:
            if self._closed:
                raise DeviceError(f"{_describe(command)}: the driver is closed; open a new one",
                                  device=self.name)
            if self._dirty:
                self._resync()
            try:
                return self._exchange_in_step(command, expect_result, final_timeout)
            except (DeviceTimeout, ProtocolError):
                self._dirty = True
                raise
            except WssCommandError:
                raise
            except DeviceError:
                self._dirty = True
                raise

    def _exchange_in_step(self, command: str, expect_result: bool,
                          final_timeout: float) -> str | None:
        what = _describe(command)
        stale_allowed = _MAX_STALE_LINES if self._after_resync else 0
        self._after_resync = False
        self._transport.write((command + TERMINATOR).encode("ascii"))
        while (echo := self._read_line(what, self.timeout, "echo")) != command and stale_allowed:
            stale_allowed -= 1  # the tail of a reply that came after the resync drained
            logger.info("%s: %s: dropped late line %r before the echo", self.name, what, echo)
        if echo != command:
            self._raise_if_error(what, echo)
            raise ProtocolError(f"{what}: expected the echo of the command, got {echo!r}; "
                                "the link was out of step and is being resynchronised",
                                device=self.name)
        result: str | None = None
        if expect_result:
            result = self._read_line(what, self.timeout, "result line")
            self._raise_if_error(what, result)
            if result == "OK":
                raise ProtocolError(f"{what}: 'OK' came without a result line", device=self.name)
        final = self._read_line(what, final_timeout,
                                "'OK' (switch settled)" if command == CMD_SWITCH else "'OK'")
        if final == "OK":
            return result
        self._raise_if_error(what, final)
        raise ProtocolError(f"{what}: expected 'OK', got {final!r}", device=self.name)

    def _read_line(self, what: str, timeout: float, expected: str) -> str:
        try:
            raw = self._transport.read_line(timeout, b"\n")
        except DeviceTimeout as exc:
            raise DeviceTimeout(f"{what}: no {expected}: {_strip_device(exc, self._transport.name)}",
                                device=self.name) from exc
        body = raw.rstrip(b"\r\n")
        if any(b < 0x20 or b > 0x7E for b in body):
            raise ProtocolError(f"{what}: garbled reply {raw!r} (non-ASCII bytes); check the "
                                "baud rate (115200 8N1) and cabling; resynchronising",
                                device=self.name)
        return body.decode("ascii")

    def _raise_if_error(self, what: str, line: str) -> None:
        err = parse_error_line(line)
        if err is None:
            return
        fix = ERROR_FIXES.get(err.code, _GENERIC_FIX) if err.code is not None else _GENERIC_FIX
        code = f" {err.code}" if err.code is not None else ""
        raise WssCommandError(f"{what} refused (ERR{code}: {err.text or 'no reason given'}); "
                              f"{fix}", device=self.name, command=what, code=err.code)

    def _resync(self) -> None:
        """Drop whatever is in flight: buffered input, then lines until a quiet period."""
        self._transport.reset_input()
        deadline = time.monotonic() + max(1.0, 20 * self.resync_quiet)
        dropped = 0
        while time.monotonic() < deadline:
            try:
                line = self._transport.read_line(self.resync_quiet, b"\n")
            except DeviceTimeout:
                break
            dropped += 1
            logger.debug("%s: resync dropped %r", self.name, line)
        self._dirty = False
        self._after_resync = True
        logger.info("%s: link resynchronised (%d stale line(s) dropped)", self.name, dropped)


def _strip_device(exc: DeviceError, transport_name: str) -> str:
    """The message of `exc` without the transport's name prefix (the driver adds its own)."""
    text = str(exc)
    prefix = f"{exc.device}: " if exc.device else ""
    if prefix and text.startswith(prefix):
        text = text[len(prefix):]
    elif transport_name and text.startswith(f"{transport_name}: "):
        text = text[len(transport_name) + 2:]
    return text
