"""The SCPI session with an optical circuit switch over a byte transport (``OcsLink``).

Lines go out ending in LF and come back ending in CR-LF (LF alone is taken too). A setting
produces no answer, so the link follows it on the same write with ``*OPC?`` (answered once
the switch has finished, i.e. after the switching time) and ``:SYST:ERR?``; a query is
followed by ``:SYST:ERR?``. One round trip therefore carries a command, its completion and
its errors; further errors are drained one ``:SYST:ERR?`` at a time. A queued error raises
`OcsCommandError` naming the command, the error and the fix.

After a timeout or a reply that makes no sense the link is out of step: the next exchange
first reconnects (a link opened from an address: answers still in flight go to the old
connection) or drains the input until it stays quiet. Every exchange goes through the
command trace (`oddl.drivers.command_trace.traced`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError
from oddl.common.tracing import TRACE
from oddl.drivers.command_trace import traced
from oddl.drivers.ocs_protocol import ERROR_FIXES, ERROR_NEXT, OPC, ScpiErrorEntry, parse_error
from oddl.drivers.transport import OwnedTransport, Transport

logger = logging.getLogger(__name__)

__all__ = ["MAX_ERRORS_DRAINED", "OcsCommandError", "OcsLink"]

MAX_ERRORS_DRAINED = 64
_MAX_STALE_LINES = 64


class OcsCommandError(DeviceError):
    """The switch queued errors for a command (``:SYST:ERR?``); the link is still in step."""

    def __init__(self, message: str, *, device: str = "", command: str = "",
                 errors: tuple[ScpiErrorEntry, ...] = ()) -> None:
        super().__init__(message, device=device)
        self.command = command
        self.errors = errors


def describe_errors(errors: tuple[ScpiErrorEntry, ...] | list[ScpiErrorEntry]) -> str:
    """``-221,"Settings conflict"`` entries and, for known codes, what to do."""
    text = "; ".join(str(e) for e in errors)
    fixes = [ERROR_FIXES[e.code] for e in errors if e.code in ERROR_FIXES]
    return text + (f" ({'; '.join(dict.fromkeys(fixes))})" if fixes else "")


class OcsLink:
    """One SCPI session: `query`, `command` and `errors` over a `Transport`.

    `reconnect` (given for a link opened from an address) returns a fresh transport; the link
    then reconnects instead of draining to get back in step. `timeout` bounds every answer
    but ``*OPC?``, which a command waits for as long as its caller says.
    """

    def __init__(self, transport: Transport, name: str, *, timeout: float = 2.0,
                 resync_quiet: float = 0.05, where: str = "",
                 reconnect: Callable[[], Transport] | None = None) -> None:
        self.name = name
        self.timeout = timeout
        self.resync_quiet = resync_quiet
        self.where = where or transport.name
        self.port = OwnedTransport(transport, name)
        self._reconnect = reconnect
        self._dirty = False
        self._fresh = True  # errors left by an earlier session are drained before the first

    def close(self) -> None:
        """Release the transport (the switch keeps its connections). Safe to call twice."""
        self.port.close()

    # ----- exchanges ------------------------------------------------------------------------

    def query(self, command: str) -> str:
        """Send a query; its one answer line (stripped). OcsCommandError when refused."""
        if not TRACE.on:
            return self._query(command)
        return traced(self.name, f"ocs {command}", lambda: self._query(command))

    def command(self, command: str, *, complete_within: float | None = None) -> float:
        """Send a setting and wait until the switch has finished it (``*OPC?``, at most
        `complete_within` s); the seconds it took. OcsCommandError when refused."""
        wait = self.timeout if complete_within is None else complete_within
        if not TRACE.on:
            return self._command(command, wait)
        return traced(self.name, f"ocs {command}", lambda: self._command(command, wait),
                      lambda s: f"done in {s * 1e3:.1f} ms")

    def errors(self) -> list[ScpiErrorEntry]:
        """Drain the error queue (``:SYST:ERR?``); oldest first, empty when none."""
        if not TRACE.on:
            return self._drain_errors()
        return traced(self.name, f"ocs {ERROR_NEXT} (drain)", self._drain_errors,
                      lambda found: describe_errors(found) or "no error")

    def _drain_errors(self) -> list[ScpiErrorEntry]:
        with self.port.lock:
            found: list[ScpiErrorEntry] = []
            for _ in range(MAX_ERRORS_DRAINED):
                entry = self._error_line(self._exchange(ERROR_NEXT, 1, self.timeout, "error")[0])
                if entry.code == 0:
                    return found
                found.append(entry)
            self._dirty = True
            raise ProtocolError(f"the error queue is still not empty after {MAX_ERRORS_DRAINED} "
                                "reads", device=self.name)

    def _query(self, command: str) -> str:
        with self.port.lock:
            self._drain_stale_errors()
            lines = self._exchange(f"{command}\n{ERROR_NEXT}", 2, self.timeout, "answer",
                                   marker=True)
            *answer, status = lines
            self._raise_if_refused(command, status)
            if len(answer) != 1:
                self._dirty = True
                raise ProtocolError(f"{command!r} answered {len(answer)} lines {answer!r}; "
                                    "expected one", device=self.name)
            return answer[0]

    def _command(self, command: str, wait: float) -> float:
        with self.port.lock:
            self._drain_stale_errors()
            t0 = time.monotonic()
            done, status = self._exchange(f"{command}\n{OPC}\n{ERROR_NEXT}", 2, self.timeout,
                                          "completion (*OPC?)", first_timeout=wait)
            took = time.monotonic() - t0
            if done.lstrip("+") != "1":
                self._dirty = True
                raise ProtocolError(f"*OPC? after {command!r} answered {done!r}; expected 1",
                                    device=self.name)
            self._raise_if_refused(command, status)
            return took

    def _raise_if_refused(self, command: str, status_line: str) -> None:
        first = self._error_line(status_line)
        if first.code == 0:
            return
        errors = (first, *self._drain_errors())
        raise OcsCommandError(f"{command!r} refused: {describe_errors(errors)}",
                              device=self.name, command=command, errors=errors)

    def _error_line(self, line: str) -> ScpiErrorEntry:
        try:
            return parse_error(line, device=self.name)
        except ProtocolError:
            self._dirty = True
            raise

    def _drain_stale_errors(self) -> None:
        if self._fresh:
            self._fresh = False
            stale = self._drain_errors()
            if stale:
                logger.info("%s: errors left from before this session: %s", self.name,
                            describe_errors(stale))

    # ----- the wire ---------------------------------------------------------------------------

    def _exchange(self, text: str, lines: int, timeout: float, expected: str, *,
                  marker: bool = False, first_timeout: float | None = None) -> list[str]:
        """Write `text` (one or more lines) and read `lines` answer lines. With `marker`, the
        last line is the error queue's: answer lines stop at the first line that reads as an
        error entry, so a refused query (no answer) comes back as just the status line."""
        with self.port.held():
            if self._dirty:
                self._resync()
            transport = self.port.transport  # a new one after a reconnect
            try:
                transport.write((text + "\n").encode("ascii"))
                out: list[str] = []
                while len(out) < lines:
                    wait = first_timeout if (first_timeout is not None and not out) else timeout
                    line = self._read_line(transport, text, wait, expected)
                    out.append(line)
                    if marker and _is_error_entry(line):
                        break
                return out
            except DeviceError:
                self._dirty = True
                raise

    def _read_line(self, transport: Transport, sent: str, timeout: float, expected: str) -> str:
        what = sent.split("\n", 1)[0]
        try:
            raw = transport.read_line(timeout, b"\n")
        except DeviceTimeout as exc:
            raise DeviceTimeout(f"{what!r}: no {expected} within {timeout:g} s; check that the "
                                f"switch (or its emulator) is on and reachable at {self.where} "
                                "and that its SCPI port is the one configured", device=self.name
                                ) from exc
        body = raw.rstrip(b"\r\n")
        if any(b < 0x20 or b > 0x7E for b in body):
            raise ProtocolError(f"{what!r}: garbled answer {raw!r}; resynchronising",
                                device=self.name)
        return body.decode("ascii").strip()

    def _resync(self) -> None:
        """Get back in step: reconnect when possible, else drain until the link is quiet."""
        if self._reconnect is not None:
            logger.warning("%s: reconnecting to drop late answers", self.name)
            try:
                self.port.transport.close()
            except DeviceError:
                pass
            self.port.transport = self._reconnect()  # CannotOpen leaves the link dirty
            self._dirty = False
            return
        self._dirty = False
        transport = self.port.transport
        transport.reset_input()
        dropped = 0
        for _ in range(_MAX_STALE_LINES):
            try:
                line = transport.read_line(self.resync_quiet, b"\n")
            except DeviceTimeout:
                break
            dropped += 1
            logger.debug("%s: resync dropped %r", self.name, line)
        logger.info("%s: link resynchronised (%d stale line(s) dropped)", self.name, dropped)


def _is_error_entry(line: str) -> bool:
    try:
        parse_error(line)
    except ProtocolError:
        return False
    return True
