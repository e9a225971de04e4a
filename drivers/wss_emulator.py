"""Emulator of a flexgrid WSS speaking the Finisar/II-VI ASCII protocol (see ``oddl.drivers.wss``).

Layers, innermost first:

- ``WssEmulator.handle_line(line)`` / ``handle_timed(line, now)``: the line-level core. It
  returns reply lines (without CR-LF); ``handle_timed`` also gives each line's delay after the
  command was received. State: a staged array, an active array and a settle deadline, behind
  one lock.
- ``WssEmulator.route(frequency_thz, now)``: the physical read-out for the optical fabric.
- ``wss_connection_handler(emulator)``: serves the core over a byte stream (TcpEmulatorServer).
- ``add_arguments(parser)`` / ``run(args)``: the ``oddl emulate wss`` hooks.

Reconstruction (undocumented behaviour, chosen here and mirrored by the driver):

- Replies: echo of the command line, one result line for queries, then ``OK``; a refused
  command gets the echo and then ``ERR <code> <text>`` instead of ``OK``. Codes: 1 unknown
  command, 2 syntax (also empty or over-long lines), 3 channel out of range, 4 port out of
  range, 5 attenuation out of range or off the 0.1 dB grid, 6 channel listed twice, 7 device
  fault (only by fault injection). The echo replaces non-printable characters with ``?``, so
  apart from injected garbage the emulator only ever sends printable ASCII.
- Grammar: ``WORD`` (ASCII, case-insensitive) then, for ``URA`` only, one or more blanks and
  ``ch,port,att`` entries joined by ``;`` (a trailing ``;`` is allowed, no blanks inside).
  Blanks are spaces and tabs; leading and trailing blanks are ignored.
  Integers and attenuations are ASCII decimals; attenuation is ``0..max_attenuation_db`` on the
  0.1 dB grid, or exactly 99.9 (blocked). Port 0 means "no out-port" (blocked).
- ``URA`` updates the listed channels of the staged array and is atomic: one bad entry and
  nothing changes. ``RSW`` copies the staged array to the active one and starts a settle
  period of ``settle_s``; its echo is sent at once and its ``OK`` when the settle period ends
  (so the settle time is visible on the wire as the delay of ``OK``). During the settle period
  ``route()`` returns None (light undefined) and ``RRA?`` already returns the new array. A
  second ``RSW`` restarts the period. Power-up and reset: every channel ``ch,0,99.9``.

Fault injection (``WssFaults``), checked in this order for each received line:
a pending reset clears both arrays and the line is lost (no answer); no-answer faults drop the
line (state unchanged); garbage faults answer with one line of random non-ASCII bytes (state
unchanged); error faults answer ``ERR 7`` (state unchanged); otherwise the line is executed.
``late_s`` delays every answer. Random faults draw from ``random.Random(seed)`` only.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from decimal import Decimal, InvalidOperation
from typing import Any

from oddl.drivers.emulator_cli import (
    listen_arg,
    milliseconds_arg,
    positive_int_arg,
    serve_until_signal,
    start_server,
)
from oddl.drivers.faults import FaultSettings
from oddl.drivers.interfaces import BLOCKED_DB, Route
from oddl.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_LINE",
    "WssEmulator",
    "WssFaults",
    "add_arguments",
    "main",
    "run",
    "wss_connection_handler",
]

MAX_LINE = 8192
"""Longest command line (characters) the emulator accepts."""

_BLOCKED_TEXT = "99.9"
_INT = re.compile(r"[0-9]+")
_ATT = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_PRINTABLE = re.compile(r"[^\x20-\x7e]")
_COMMAND = re.compile(r"([^ \t]+)(?:[ \t]+(.*))?", re.DOTALL)


@dataclass
class WssFaults(FaultSettings):
    """Faults to inject; set fields from a test (``emu.faults.no_answer = 2``) or from config.

    Counters (`no_answer`, `garbage`, `error_next`) count down one per received line.
    """

    LABEL = "wss"

    no_answer: int = 0
    """Drop the answers to the next k lines (the lines are not executed)."""
    no_answer_always: bool = False
    """Never answer (a dead or unplugged module)."""
    late_s: float = 0.0
    """Delay every answer by this many seconds."""
    garbage: int = 0
    """Answer the next k lines with one line of random non-ASCII bytes."""
    error_next: int = 0
    """Answer the next k lines with ``ERR 7 device fault`` (not executed)."""
    reset_next: bool = False
    """On the next line, reset (both arrays all-blocked); that line gets no answer."""
    drop_probability: float = 0.0
    """Chance (seeded) that any line goes unanswered."""
    garbage_probability: float = 0.0
    """Chance (seeded) that any line is answered with garbage."""

    def __post_init__(self) -> None:
        self.validate()




class _Refused(Exception):
    """A command the emulated module refuses: becomes an ERR line."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class WssEmulator:
    """A 1xK flexgrid WSS: staged and active arrays, settle period, faults. Thread-safe."""

    def __init__(self, *, ports: int = 4, first_thz: float = 193.1, spacing_ghz: float = 100.0,
                 channels: int = 48, settle_s: float = 0.1, serial_number: str = "WSS-EMU-0001",
                 clock: Callable[[], float] = time.monotonic, seed: int = 0,
                 manufacture_date: str = "2024-01-01", max_attenuation_db: float = 25.0,
                 faults: WssFaults | None = None) -> None:
        if ports < 1 or channels < 1 or spacing_ghz <= 0 or settle_s < 0:
            raise ConfigError(f"WSS emulator: ports={ports}, channels={channels}, "
                              f"spacing_ghz={spacing_ghz}, settle_s={settle_s}; expected "
                              "ports >= 1, channels >= 1, spacing > 0, settle >= 0")
        if not 0 <= max_attenuation_db < BLOCKED_DB:
            raise ConfigError(f"WSS emulator: max_attenuation_db={max_attenuation_db}; "
                              f"expected 0 <= max < {BLOCKED_DB}")
        self.ports = ports
        self.channels = channels
        self.first_thz = first_thz
        self.spacing_ghz = spacing_ghz
        self.settle_s = settle_s
        self.serial_number = serial_number
        self.manufacture_date = manufacture_date
        self.max_attenuation_db = max_attenuation_db
        self.faults = faults if faults is not None else WssFaults()
        self._clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._staged = self._all_blocked()
        self._active = self._all_blocked()
        self._settle_until = -math.inf
        self.on_change: Callable[[], None] | None = None
        """Called after every command (the emulated fabric recomputes where light goes)."""

    # state ---------------------------------------------------------------------------------------
    def _all_blocked(self) -> dict[int, Route]:
        return {ch: Route(0, BLOCKED_DB) for ch in range(1, self.channels + 1)}

    def active_table(self) -> dict[int, Route]:
        """A copy of the active array {channel: Route}."""
        with self._lock:
            return dict(self._active)

    def staged_table(self) -> dict[int, Route]:
        """A copy of the staged array {channel: Route}."""
        with self._lock:
            return dict(self._staged)

    def settling(self, now: float | None = None) -> bool:
        """True while the optics settle after RSW (output undefined)."""
        t = self._clock() if now is None else now
        with self._lock:
            return t < self._settle_until

    def reset(self) -> None:
        """Power-cycle: both arrays all-blocked, no settle period pending."""
        with self._lock:
            self._staged = self._all_blocked()
            self._active = self._all_blocked()
            self._settle_until = -math.inf
        logger.info("WSS emulator %s: reset, all channels blocked", self.serial_number)

    def inject(self, **changes: object) -> None:
        """Set fault fields by name (ConfigError for unknown names or bad values)."""
        with self._lock:
            merged = {f.name: getattr(self.faults, f.name) for f in fields(WssFaults)}
            unknown = sorted(set(changes) - set(merged))
            if unknown:
                raise ConfigError(f"wss faults: unknown key(s) {', '.join(unknown)}")
            merged.update(changes)
            self.faults = WssFaults.from_mapping(merged)

    def channel_at(self, frequency_thz: float) -> int | None:
        """The channel whose passband [centre - spacing/2, centre + spacing/2) holds the frequency."""
        if not math.isfinite(frequency_thz):
            return None
        offset = (frequency_thz - self.first_thz) * 1000.0 / self.spacing_ghz
        channel = math.floor(offset + 0.5) + 1
        return channel if 1 <= channel <= self.channels else None

    def centre_thz(self, channel: int) -> float:
        """Centre frequency (THz) of `channel`."""
        return self.first_thz + (channel - 1) * self.spacing_ghz / 1000.0

    def route(self, frequency_thz: float, now: float | None = None) -> Route | None:
        """Out-port and attenuation for light at `frequency_thz` through the common in-port.

        None when the channel is blocked, the frequency is in no channel's passband, or the
        switch is settling after RSW at time `now` (default: the emulator clock).
        """
        channel = self.channel_at(frequency_thz)
        if channel is None:
            return None
        t = self._clock() if now is None else now
        with self._lock:
            if t < self._settle_until:
                return None
            r = self._active[channel]
        return None if r.blocked else r

    # line core -----------------------------------------------------------------------------------
    def handle_line(self, line: str) -> list[str]:
        """Execute one command line; return the reply lines (no CR-LF), timing ignored."""
        return [text for _, text in self.handle_timed(line)]

    def handle_timed(self, line: str, now: float | None = None) -> list[tuple[float, str]]:
        """Execute one command line at `now`; return (delay after receipt in s, line) pairs."""
        if self.on_change is None:
            return self._handle_timed(line, now)
        before = self._light_state()
        try:
            return self._handle_timed(line, now)
        finally:
            if self._light_state() != before:
                self.on_change()

    def _light_state(self) -> tuple[Any, ...]:
        """What the routed light depends on (RSW and reset replace the active array)."""
        with self._lock:
            return (self._active, self._settle_until)

    def transitions(self, now: float) -> list[float]:
        """Future instants at which the light changes by itself (the end of a settle)."""
        with self._lock:
            return [self._settle_until] if self._settle_until > now else []

    def _handle_timed(self, line: str, now: float | None = None) -> list[tuple[float, str]]:
        t = self._clock() if now is None else now
        line = line.removesuffix("\n").removesuffix("\r")
        with self._lock:
            f = self.faults
            if f.reset_next:
                f.reset_next = False
                self.reset()
                logger.debug("WSS emulator: %r lost in reset", line)
                return []
            if f.no_answer_always or f.no_answer > 0 or self._roll(f.drop_probability):
                if f.no_answer > 0:
                    f.no_answer -= 1
                logger.debug("WSS emulator: not answering %r", line)
                return []
            if f.garbage > 0 or self._roll(f.garbage_probability):
                if f.garbage > 0:
                    f.garbage -= 1
                return [(f.late_s, self._garbage())]
            echo = _PRINTABLE.sub("?", line)
            if f.error_next > 0:
                f.error_next -= 1
                return [(f.late_s, echo), (f.late_s, "ERR 7 device fault (injected)")]
            try:
                lines = self._execute(line, t)
            except _Refused as exc:
                logger.debug("WSS emulator: %r refused: %d %s", line, exc.code, exc.text)
                return [(f.late_s, echo), (f.late_s, f"ERR {exc.code} {exc.text}")]
            return [(f.late_s, echo)] + [(f.late_s + d, text) for d, text in lines]

    def _roll(self, probability: float) -> bool:
        return probability > 0 and self._rng.random() < probability

    def _garbage(self) -> str:
        n = self._rng.randint(1, 24)
        chars = [chr(self._rng.randint(0x80, 0xFF))]
        chars += [chr(self._rng.choice([*range(0x01, 0x0A), *range(0x0B, 0x0D),
                                        *range(0x0E, 0x100)])) for _ in range(n)]
        self._rng.shuffle(chars)
        return "".join(chars)

    def _execute(self, line: str, now: float) -> list[tuple[float, str]]:
        """Run a command; return (delay, line) for the result and OK lines (echo excluded)."""
        if len(line) > MAX_LINE:
            raise _Refused(2, f"line longer than {MAX_LINE} characters")
        if "\r" in line or "\n" in line:
            raise _Refused(2, "line break inside the command")
        text = line.strip(" \t")
        if not text:
            raise _Refused(2, "empty command")
        m = _COMMAND.fullmatch(text)
        assert m is not None  # text is non-empty and starts with a non-blank
        word, args = m.group(1), (m.group(2) or "")
        word = word.upper() if word.isascii() else word
        if word not in ("SNO?", "MFD?", "RRA?", "URA", "RSW"):
            raise _Refused(1, f"unknown command {_PRINTABLE.sub('?', word[:20])}")
        if word != "URA" and args:
            raise _Refused(2, f"{word} takes no parameters")
        if word == "SNO?":
            return [(0.0, self.serial_number), (0.0, "OK")]
        if word == "MFD?":
            return [(0.0, self.manufacture_date), (0.0, "OK")]
        if word == "RRA?":
            return [(0.0, self._format_active()), (0.0, "OK")]
        if word == "URA":
            self._staged.update(self._parse_ura(args))
            return [(0.0, "OK")]
        # RSW
        self._active = dict(self._staged)
        self._settle_until = now + self.settle_s
        logger.debug("WSS emulator: switching, settled at %.6f", self._settle_until)
        return [(self.settle_s, "OK")]

    def _format_active(self) -> str:
        return ";".join(f"{ch},{r.port},{r.attenuation_db:.1f}"
                        for ch, r in sorted(self._active.items()))

    def _parse_ura(self, args: str) -> dict[int, Route]:
        """Parse and check every entry; raise _Refused on the first bad one (atomic)."""
        if not args:
            raise _Refused(2, "URA needs ch,port,att entries")
        body = args[:-1] if args.endswith(";") else args
        updates: dict[int, Route] = {}
        for entry in body.split(";"):
            parts = entry.split(",")
            shown = _PRINTABLE.sub("?", entry[:40])
            if (len(parts) != 3 or not _INT.fullmatch(parts[0]) or not _INT.fullmatch(parts[1])
                    or not _ATT.fullmatch(parts[2])):
                raise _Refused(2, f"bad entry '{shown}', expected ch,port,att")
            channel, port = int(parts[0]), int(parts[1])
            if not 1 <= channel <= self.channels:
                raise _Refused(3, f"channel {channel} out of range 1-{self.channels}")
            if not 0 <= port <= self.ports:
                raise _Refused(4, f"port {port} out of range 0-{self.ports}")
            updates_att = self._parse_attenuation(parts[2])
            if channel in updates:
                raise _Refused(6, f"channel {channel} listed twice")
            updates[channel] = Route(port, updates_att)
        return updates

    def _parse_attenuation(self, text: str) -> float:
        try:
            value = Decimal(text)
        except InvalidOperation:  # pragma: no cover - the regex admits only decimals
            raise _Refused(2, f"bad attenuation '{text[:20]}'") from None
        if value == Decimal(_BLOCKED_TEXT):
            return BLOCKED_DB
        if value > Decimal(str(self.max_attenuation_db)):
            raise _Refused(5, f"attenuation {text[:20]} out of range 0-"
                              f"{self.max_attenuation_db:.1f} or {_BLOCKED_TEXT}")
        if text.partition(".")[2][1:].strip("0"):
            raise _Refused(5, f"attenuation {text[:20]} not on the 0.1 dB grid")
        return float(value)


# --- byte stream ----------------------------------------------------------------------------------

def wss_connection_handler(emulator: WssEmulator) -> Callable[[socket.socket], None]:
    """A TcpEmulatorServer handler: LF or CR-LF lines in, CR-LF lines out, timing honoured."""

    def handle(conn: socket.socket) -> None:
        conn.settimeout(None)
        buf = bytearray()
        while True:
            data = conn.recv(4096)
            if not data:
                return
            buf += data
            while (i := buf.find(b"\n")) >= 0:
                raw = bytes(buf[:i])
                del buf[:i + 1]
                if not _answer(conn, emulator, raw.decode("latin-1")):
                    return
            if len(buf) > MAX_LINE:
                buf.clear()  # an endless line: answer as over-long, keep the connection
                if not _answer(conn, emulator, "?" * (MAX_LINE + 1)):
                    return

    return handle


def _answer(conn: socket.socket, emulator: WssEmulator, line: str) -> bool:
    """Send the replies to one line at their due times; False when the connection is gone."""
    received = time.monotonic()
    for delay, text in emulator.handle_timed(line):
        due = received + delay
        while (wait := due - time.monotonic()) > 0:
            if conn.fileno() == -1:
                return False
            time.sleep(min(wait, 0.05))
        conn.sendall(text.encode("latin-1", "replace") + b"\r\n")
    return True


# --- command line ---------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``oddl emulate wss`` options to `parser`."""
    parser.add_argument("--listen", default="127.0.0.1:0", type=listen_arg,
                        metavar="HOST:PORT", help="address to serve on (port 0: any free port)")
    parser.add_argument("--ports", default=4, type=positive_int_arg,
                        help="number of out-ports (default 4)")
    parser.add_argument("--settle-ms", default=100.0, type=milliseconds_arg,
                        help="settle time after RSW in ms (default 100)")
    parser.add_argument("--serial", default="WSS-EMU-0001", help="serial number SNO? reports")
    parser.add_argument("--seed", default=0, type=int, help="seed for injected random faults")


def run(args: argparse.Namespace) -> int:
    """Serve one emulated WSS; print its ``socket://`` URL once; stop on SIGINT/SIGTERM."""
    emulator = WssEmulator(ports=args.ports, settle_s=args.settle_ms / 1000.0,
                           serial_number=args.serial, seed=args.seed)
    server = start_server(wss_connection_handler(emulator), args.listen, "wss-emulator")
    logger.info("WSS emulator %s serving on %s", args.serial, server.url)
    return serve_until_signal(server, lambda s: s.url)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m oddl.drivers.wss_emulator [options]``."""
    parser = argparse.ArgumentParser(prog="wss_emulator", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
