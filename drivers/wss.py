"""Driver for a Finisar/II-VI flexgrid WSS on its ASCII serial protocol.

Wire facts (``oddl.drivers.wss_protocol``, sources in docs/reference/devices/wss.md): 115200 8N1; a
command line, its echo, zero or more result lines, then ``OK`` or one of ``CER`` (command),
``AER`` (argument), ``RER`` (range), ``VER`` (validation error); optional checksum framing
``^text$XXXX`` on every line (``checksum=True``). ``URA`` stages routes, ``RSW`` switches the
staged array in, ``UCA`` updates and switches at once, ``RRA?`` reads the active array (one or
more lines, joined), ``CHW`` sets the grid (0 = flexgrid, 50/100 GHz fixed), ``DCC`` defines
flexgrid channels over 6.25 GHz slices, ``RES`` restarts. Port 99 means blocked by port, 99.9
dB blocked by attenuation; both are accepted on write and come back on read-back.

Settling shows on the wire as the delay of ``OK`` after ``RSW``/``UCA``/``CHW``; ``apply()``
waits for it with the settle timeout and records the time in ``last_settle_s``.

Recovery: a timeout or a garbled or badly framed reply leaves unknown bytes in flight, so the
next exchange first drains the input (discard what is buffered, then wait for a quiet period).
A reply later still shows up before the next echo; in the first exchange after a drain, up to
8 printable lines before the echo are dropped and logged.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Self

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError
from oddl.common.tracing import TRACE
from oddl.drivers.command_trace import traced
from oddl.drivers.interfaces import BLOCKED_DB, BLOCKED_PORT, DeviceIdentity, Route
from oddl.drivers.transport import OwnedTransport, Transport
from oddl.drivers.wss_channels import ChannelNumbering
from oddl.drivers.wss_codec import (
    InvalidRouteTable,
    WssLimits,
    describe,
    format_ura,
    parse_error_line,
    parse_rra,
)
from oddl.drivers.wss_protocol import ChecksumError, WssErrorCode, frame, unframe

logger = logging.getLogger(__name__)

__all__ = ["ERROR_FIXES", "FlexgridWss", "WssCommandError"]

TERMINATOR = "\r\n"
_SWITCHING = ("RSW", "UCA", "CHW")  # commands whose OK comes when the optics have settled

ERROR_FIXES: dict[WssErrorCode, str] = {
    WssErrorCode.CER: "the module does not know this command, or a framed command's checksum "
                      "was wrong; check the firmware (FWR?) and the checksum setting",
    WssErrorCode.AER: "an argument is malformed (a driver/firmware mismatch); report it with "
                      "the debug log",
    WssErrorCode.RER: "a value is out of range: use channels of the module's channel plan "
                      "(first channel and count in the testbed file), ports 1..P or 99, and "
                      "attenuations 0..max or 99.9",
    WssErrorCode.VER: "the module refused it in its present state (channel listed twice, a "
                      "flexgrid channel DCC has not defined, overlapping slices, DCC outside "
                      "flexgrid mode); read RRA? / DCC? / CHW? and fix the request",
}
"""What an operator should do about each error reply."""

_MAX_STALE_LINES = 8
_MAX_RESULT_LINES = 512


class WssCommandError(DeviceError):
    """The WSS answered a command with an error reply; the link is still in step."""

    def __init__(self, message: str, *, device: str = "", command: str = "",
                 code: WssErrorCode | None = None) -> None:
        super().__init__(message, device=device)
        self.command = command
        self.code = code


# --- driver -------------------------------------------------------------------------------------

class FlexgridWss:
    """A flexgrid WSS on an ASCII serial link (any Transport: serial port, socket://, fake).

    Implements ``oddl.drivers.interfaces.WavelengthSelectiveSwitch``. Every exchange holds a
    lock, so one driver may be shared between threads. Times are in seconds. `checksum`
    frames every command and requires framed replies; `echo` is whether the module echoes.
    `channel_map` ({testbed channel: module channel}, from the testbed file's
    ``module_plan``) makes every route table, block and read-back speak the testbed's channel
    numbers while the wire carries the module's.
    """

    def __init__(self, transport: Transport, name: str = "wss", *,
                 settle_timeout: float = 5.0, timeout: float = 1.0,
                 limits: WssLimits | None = None, resync_quiet: float = 0.05,
                 checksum: bool = False, echo: bool = True,
                 channel_map: Mapping[int, int] | None = None) -> None:
        self.name = name
        self.limits = limits or WssLimits()
        self._fixed_limits = self.limits  # the configured (fixed-grid) limits, for CHW 50/100
        self.settle_timeout = settle_timeout
        self.timeout = timeout
        self.resync_quiet = resync_quiet
        self.checksum = checksum
        self.echo = echo
        self.last_settle_s: float | None = None
        """How long the last switching command waited for the optics to settle (s)."""
        self._port = OwnedTransport(transport, name)
        self._dirty = False
        self._after_resync = False
        self._last_port: dict[int, int] = {}
        self.numbering = ChannelNumbering(name, channel_map)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the link; the optical state is left as it is. Safe to call twice."""
        self._port.close()

    # operations --------------------------------------------------------------------------------
    def identify(self) -> DeviceIdentity:
        """Read the serial number (SNO?) and manufacture date (MFD?)."""
        with self._port.lock:
            serial = self._query_one("SNO?")
            date = self._query_one("MFD?")
        return DeviceIdentity(kind="wss", manufacturer="Finisar/II-VI",
                              model="flexgrid WSS (ASCII serial)", serial_number=serial,
                              extra=(("manufacture_date", date),))

    def stage(self, table: Mapping[int, Route]) -> None:
        """Load `table` ({channel: Route(port, dB)}) as the staged array with URA.

        The active optics do not change until ``apply()``. Raises InvalidRouteTable (nothing
        sent) for an empty table, an unknown channel or port, or a bad attenuation.
        """
        self.limits.validate(table)
        wire = self.numbering.to_module(table)
        with self._port.lock:
            self._exchange(format_ura(wire))
            self._last_port.update({ch: r.port for ch, r in table.items()})

    def apply(self, timeout: float | None = None) -> None:
        """Make the staged array active (RSW) and wait until the switch has settled."""
        self._switch("RSW", timeout)

    def update_and_switch(self, table: Mapping[int, Route], timeout: float | None = None
                          ) -> None:
        """Route the channels of `table` at once (UCA) and wait until they have settled."""
        self.limits.validate(table)
        wire = self.numbering.to_module(table)
        with self._port.lock:
            self._switch(format_ura(wire, "UCA"), timeout)
            self._last_port.update({ch: r.port for ch, r in table.items()})

    def read_active(self) -> dict[int, Route]:
        """Read the active array (RRA?) as {channel: Route}; 99 / 99.9 dB mean blocked."""
        with self._port.lock:
            lines = self._exchange("RRA?", results=_MAX_RESULT_LINES)
        active = parse_rra(lines, device=self.name) if lines else {}
        return self.numbering.from_module(active)

    def block(self, channel: int, timeout: float | None = None) -> None:
        """Block `channel` at 99.9 dB (on its last staged port, or 99), apply and settle."""
        with self._port.lock:
            port = self._last_port.get(channel, BLOCKED_PORT)
            self.stage({channel: Route(port, BLOCKED_DB)})
            self.apply(timeout)

    def channel_width(self) -> int:
        """Read the grid mode (CHW?): 0 = flexgrid, else the fixed spacing in GHz."""
        text = self._query_one("CHW?")
        try:
            return int(float(text))
        except ValueError:
            raise ProtocolError(f"CHW? answered {text!r}, not a number", device=self.name
                                ) from None

    def set_channel_width(self, ghz: int, timeout: float | None = None) -> None:
        """Switch the grid (CHW): 0 = flexgrid (then define channels), 50 or 100 GHz fixed.

        Back on a fixed grid the driver's limits are the configured ones again.
        """
        self.numbering.refuse_plan_change("CHW")
        with self._port.lock:
            self._switch(f"CHW {int(ghz)}", timeout)
            if ghz:
                self.limits = self._fixed_limits

    def define_channels(self, plan: Mapping[int, tuple[int, int]]) -> None:
        """Define flexgrid channels (DCC): {channel: (first slice, last slice)}, slices from 1.

        The module must be in flexgrid mode (``set_channel_width(0)``). The driver's limits
        then cover the defined channel numbers.
        """
        self.numbering.refuse_plan_change("DCC")
        if not plan:
            raise InvalidRouteTable("empty channel plan: define at least one channel")
        for ch, (s0, s1) in plan.items():
            if ch < 1 or s0 < 1 or s1 < s0:
                raise InvalidRouteTable(f"channel {ch} = slices {s0}:{s1}: channels and "
                                        "slices start at 1, first <= last")
        line = "DCC " + ";".join(f"{ch}={s0}:{s1}" for ch, (s0, s1) in sorted(plan.items()))
        with self._port.lock:
            self._exchange(line)
            lo, hi = min(plan), max(plan)
            self.limits = replace(self.limits, first_channel=lo, channels=hi - lo + 1)

    def read_channel_plan(self) -> dict[int, tuple[int, int]]:
        """Read the flexgrid plan (DCC?) as {channel: (first slice, last slice)}."""
        lines = self._exchange("DCC?", results=1)
        plan: dict[int, tuple[int, int]] = {}
        for entry in (lines[0].strip().removesuffix(";").split(";") if lines else []):
            m = re.fullmatch(r"([0-9]+)=([0-9]+):([0-9]+)", entry.strip())
            if m is None:
                raise ProtocolError(f"DCC? entry {entry!r} is not 'ch=first:last'",
                                    device=self.name)
            plan[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
        return plan

    def restart(self, timeout: float = 30.0) -> None:
        """Restart the module (RES) and wait until it answers SNO? again.

        A module that restarts before its ``OK`` is out is fine: the missing reply is drained.
        """
        with self._port.lock:
            deadline = time.monotonic() + timeout
            try:
                self._exchange("RES")
            except DeviceTimeout:
                logger.info("%s: no OK to RES; waiting for the module to come back", self.name)
            while True:
                try:
                    self._query_one("SNO?")
                    return
                except (DeviceTimeout, ProtocolError):
                    if time.monotonic() > deadline:
                        raise DeviceTimeout(f"RES: the module did not answer again within "
                                            f"{timeout:g} s; check its power and cabling",
                                            device=self.name) from None

    # wire --------------------------------------------------------------------------------------
    def _query_one(self, command: str) -> str:
        lines = self._exchange(command, results=1)
        if len(lines) != 1:
            raise ProtocolError(f"{command}: 'OK' came without a result line", device=self.name)
        return lines[0]

    def _switch(self, command: str, timeout: float | None) -> None:
        wait = self.settle_timeout if timeout is None else timeout
        with self._port.lock:
            t0 = time.monotonic()
            self._exchange(command, final_timeout=wait)
            self.last_settle_s = time.monotonic() - t0
        logger.debug("%s: %s settled in %.1f ms", self.name, describe(command),
                     self.last_settle_s * 1e3)

    def _exchange(self, command: str, *, results: int = 0,
                  final_timeout: float | None = None) -> list[str]:
        """Send `command`; return its result lines (at most `results`) once 'OK' came (on
        the trace when it records: `oddl.drivers.command_trace`)."""
        if not TRACE.on:
            return self._exchange_once(command, results, final_timeout)
        return traced(self.name, f"wss {describe(command)}",
                      lambda: self._exchange_once(command, results, final_timeout),
                      lambda lines: "; ".join(lines) or "OK")

    def _exchange_once(self, command: str, results: int, final_timeout: float | None
                       ) -> list[str]:
        with self._port.lock:
            if self._port.closed:
                raise DeviceError(f"{describe(command)}: the driver is closed; open a new one",
                                  device=self.name)
            if self._dirty:
                self._resync()
            try:
                return self._exchange_in_step(
                    command, results, self.timeout if final_timeout is None else final_timeout)
            except WssCommandError:
                raise
            except DeviceError:
                self._dirty = True
                raise

    def _exchange_in_step(self, command: str, results: int, final_timeout: float) -> list[str]:
        what = describe(command)
        sent = frame(command) if self.checksum else command
        stale_allowed = _MAX_STALE_LINES if self._after_resync else 0
        self._after_resync = False
        self._port.transport.write((sent + TERMINATOR).encode("ascii"))
        if self.echo:
            while (echo := self._read_raw(what, self.timeout, "echo")) != sent and stale_allowed:
                stale_allowed -= 1  # the tail of a reply that came after the resync drained
                logger.info("%s: %s: dropped late line %r before the echo", self.name, what, echo)
            if echo != sent:
                self._raise_if_error(what, echo)
                raise ProtocolError(f"{what}: expected the echo of the command, got {echo!r}; "
                                    "the link was out of step and is being resynchronised",
                                    device=self.name)
        lines: list[str] = []
        switching = command.split(" ", 1)[0] in _SWITCHING
        while True:
            wait = final_timeout if switching else self.timeout
            expected = "'OK' (switch settled)" if switching else "'OK'"
            text = self._read_text(what, wait, expected if len(lines) >= results else "reply")
            if text == "OK":
                return lines
            self._raise_if_error(what, text)
            if len(lines) >= results:
                raise ProtocolError(f"{what}: expected 'OK', got {text!r}", device=self.name)
            lines.append(text)

    def _read_raw(self, what: str, timeout: float, expected: str) -> str:
        try:
            raw = self._port.transport.read_line(timeout, b"\n")
        except DeviceTimeout as exc:
            raise DeviceTimeout(f"{what}: no {expected}: {_strip_device(exc, self._port.transport.name)}",
                                device=self.name) from exc
        body = raw.rstrip(b"\r\n")
        if any(b < 0x20 or b > 0x7E for b in body):
            raise ProtocolError(f"{what}: garbled reply {raw!r} (non-ASCII bytes); check the "
                                "baud rate (115200 8N1) and cabling; resynchronising",
                                device=self.name)
        return body.decode("ascii")

    def _read_text(self, what: str, timeout: float, expected: str) -> str:
        """Read one reply line and remove (and check) its checksum framing."""
        line = self._read_raw(what, timeout, expected)
        try:
            text, framed = unframe(line)
        except ChecksumError as exc:
            raise ProtocolError(f"{what}: {exc}; resynchronising", device=self.name) from None
        if self.checksum and not framed:
            raise ProtocolError(f"{what}: reply {line!r} is not framed although checksum "
                                "framing is on; check the module's settings", device=self.name)
        return text

    def _raise_if_error(self, what: str, line: str) -> None:
        err = parse_error_line(line)
        if err is None:
            return
        raise WssCommandError(f"{what} refused ({err.code.value}, {err.text}); "
                              f"{ERROR_FIXES[err.code]}", device=self.name, command=what,
                              code=err.code)

    def _resync(self) -> None:
        """Drop whatever is in flight: buffered input, then lines until a quiet period."""
        self._port.transport.reset_input()
        deadline = time.monotonic() + max(1.0, 20 * self.resync_quiet)
        dropped = 0
        while time.monotonic() < deadline:
            try:
                line = self._port.transport.read_line(self.resync_quiet, b"\n")
            except DeviceTimeout:
                break
            dropped += 1
            logger.debug("%s: resync dropped %r", self.name, line)
        self._dirty = False
        self._after_resync = self.echo
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
