"""Emulator of a Finisar/II-VI flexgrid WSS on its ASCII serial protocol (see ``wss_protocol``).

Layers, innermost first:

- ``WssEmulator.handle_line(line)`` / ``handle_timed(line, now)``: the line-level core. It
  returns reply lines (without CR-LF); ``handle_timed`` also gives each line's delay after the
  command was received. State: channel plan (fixed grid or ``DCC`` slices), staged and active
  arrays, settle deadline, start-up state, behind one lock. Commands: ``wss_commands``.
- ``WssEmulator.route(frequency_thz, now)``: the physical read-out for the optical fabric.
- ``oddl.drivers.emulators.wss_serve``: the byte-stream servers (TCP, pseudo-terminal) and the
  ``oddl emulate wss`` command line (``python -m oddl.drivers.emulators.wss_serve``).

Every line is echoed first (``echo=False`` turns that off), then come its result lines and
``OK``, or one of ``CER``/``AER``/``RER``/``VER``. A line in checksum framing (``^...$XXXX``)
gets its result, ``OK`` and error lines framed too; a framed line with a wrong checksum gets
``CER`` and is not executed. An empty line gets no answer.

Factory setting: fixed 50 GHz plan, channels 0..95 from 191.350 THz (``FACTORY_PLAN``), 4
out-ports, every channel ``c,99,99.9`` (start-up state ``SAB``, all blocked). The plan,
numbering and ports are constructor arguments (the emulator host sets them from the testbed).

Fault injection (``WssFaults``), checked in this order for each received line: a pending reset
clears the arrays and the line is lost (no answer); no-answer faults drop the line (state
unchanged); garbage faults answer with one line of random non-ASCII bytes (state unchanged);
error faults answer ``VER`` (state unchanged); otherwise the line is executed. ``late_s``
delays every answer. Random faults draw from ``random.Random(seed)`` only.
"""

from __future__ import annotations

import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oddl.common.config import FixedPlan
from oddl.common.errors import ConfigError
from oddl.drivers.emulators.faults import LinkFaults
from oddl.drivers.emulators.wss_commands import Refused, execute
from oddl.drivers.interfaces import BLOCKED_DB, BLOCKED_PORT, Route
from oddl.drivers.wss_protocol import (
    FACTORY_PLAN,
    FACTORY_WINDOW_THZ,
    SLICE_GHZ,
    ChecksumError,
    WssErrorCode,
    frame,
    unframe,
)

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_LINE",
    "STARTUP_STATES",
    "WssEmulator",
    "WssFaults",
]

MAX_LINE = 8192
"""Longest command line (characters) the emulator accepts."""

STARTUP_STATES = ("SAB", "SFD", "SLS")
"""Start all blocked, start factory default, start last saved (``SUS``)."""

_PRINTABLE = re.compile(r"[^\x20-\x7e]")


@dataclass
class WssFaults(LinkFaults):
    """Faults to inject; set fields from a test (``emu.faults.no_answer = 2``) or from config.

    Counters (`no_answer`, `garbage`, `error_next`) count down one per received line. A garbage
    answer is one line of random non-ASCII bytes; a reset leaves both arrays all-blocked.
    """

    LABEL = "wss"

    error_next: int = 0
    """Answer the next k lines with ``VER`` (not executed)."""


def _check_settings(*, ports: int, channels: int, first_channel: int, spacing_ghz: float,
                    settle_s: float, restart_s: float, rra_per_line: int, max_flex_channels: int,
                    max_attenuation_db: float, startup_state: str) -> None:
    """Raise ConfigError naming the WssEmulator arguments that are out of range."""
    if (ports < 1 or ports >= BLOCKED_PORT or channels < 1 or first_channel < 0
            or spacing_ghz <= 0 or settle_s < 0 or restart_s < 0 or rra_per_line < 0
            or max_flex_channels < 1):
        raise ConfigError(
            f"WSS emulator: ports={ports}, channels={channels}, first_channel="
            f"{first_channel}, spacing_ghz={spacing_ghz}, settle_s={settle_s}, restart_s="
            f"{restart_s}, rra_per_line={rra_per_line}, max_flex_channels="
            f"{max_flex_channels}; expected 1 <= ports < {BLOCKED_PORT}, channels >= 1, "
            "first_channel >= 0, spacing > 0, times >= 0, rra_per_line >= 0")
    if not 0 <= max_attenuation_db < BLOCKED_DB:
        raise ConfigError(f"WSS emulator: max_attenuation_db={max_attenuation_db}; "
                          f"expected 0 <= max < {BLOCKED_DB}")
    if startup_state not in STARTUP_STATES:
        raise ConfigError(f"WSS emulator: startup_state={startup_state!r}; expected one "
                          f"of {', '.join(STARTUP_STATES)}")


class WssEmulator:
    """A 1xK flexgrid WSS: channel plan, staged and active arrays, settle period, faults.

    Thread-safe. Frequencies in THz, times in seconds, attenuations in dB.
    """

    def __init__(self, *, ports: int = 4, first_channel: int = FACTORY_PLAN.first_channel,
                 first_thz: float = FACTORY_PLAN.first_thz,
                 spacing_ghz: float = FACTORY_PLAN.spacing_ghz,
                 channels: int = FACTORY_PLAN.channels,
                 window_thz: tuple[float, float] | None = None, settle_s: float = 0.1,
                 serial_number: str = "SN000001", manufacture_date: str = "2024-01-01",
                 firmware: str = "1.0.0", hardware: str = "1.0.0",
                 max_attenuation_db: float = 25.0, echo: bool = True, rra_per_line: int = 0,
                 max_flex_channels: int = 96, startup_state: str = "SAB",
                 restart_s: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 seed: int = 0, faults: WssFaults | None = None) -> None:
        _check_settings(ports=ports, channels=channels, first_channel=first_channel,
                        spacing_ghz=spacing_ghz, settle_s=settle_s, restart_s=restart_s,
                        rra_per_line=rra_per_line, max_flex_channels=max_flex_channels,
                        max_attenuation_db=max_attenuation_db, startup_state=startup_state)
        self.factory_plan = FixedPlan(first_channel, first_thz, spacing_ghz, channels)
        if window_thz is None:
            window_thz = (FACTORY_WINDOW_THZ if self.factory_plan == FACTORY_PLAN
                          else self.factory_plan.window_thz())
        lo, hi = window_thz
        if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
            raise ConfigError(f"WSS emulator: window_thz={window_thz}; expected low < high")
        self.window_thz = (lo, hi)
        self.slices = int((hi - lo) * 1000.0 / SLICE_GHZ + 1e-6)
        self.ports = ports
        self.settle_s = settle_s
        self.restart_s = restart_s
        self.serial_number: str = serial_number
        self.manufacture_date: str = manufacture_date
        self.firmware: str = firmware
        self.hardware: str = hardware
        self.max_attenuation_db = max_attenuation_db
        self.echo = echo
        self.rra_per_line = rra_per_line
        self.max_flex_channels = max_flex_channels
        self.startup_state = startup_state
        self.faults = faults if faults is not None else WssFaults()
        self._clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self.mode_ghz = int(spacing_ghz) if float(spacing_ghz).is_integer() else spacing_ghz
        """Grid mode: 0 = flexgrid (``DCC`` plan), else the fixed spacing in GHz (``CHW``)."""
        self.plan = self.factory_plan
        """The fixed-grid plan in force when ``mode_ghz`` is not 0."""
        self.flex: dict[int, tuple[int, int]] = {}
        """Flexgrid plan: channel -> (first slice, last slice), from ``DCC``."""
        self.staged: dict[int, Route] = self._all_blocked()
        self.active: dict[int, Route] = self._all_blocked()
        self.settle_until = -math.inf
        self.restart_until = -math.inf
        self.on_change: Callable[[], None] | None = None
        """Called after every command that changes where light goes (the emulated fabric)."""

    # state ---------------------------------------------------------------------------------------
    def channel_numbers(self) -> list[int]:
        """The channels of the plan in force, ascending."""
        if self.mode_ghz == 0:
            return sorted(self.flex)
        return list(range(self.plan.first_channel, self.plan.last_channel + 1))

    def _all_blocked(self) -> dict[int, Route]:
        return {ch: Route(BLOCKED_PORT, BLOCKED_DB) for ch in self.channel_numbers()}

    def active_table(self) -> dict[int, Route]:
        """A copy of the active array {channel: Route}."""
        with self._lock:
            return dict(self.active)

    def staged_table(self) -> dict[int, Route]:
        """A copy of the staged array {channel: Route}."""
        with self._lock:
            return dict(self.staged)

    def settling(self, now: float | None = None) -> bool:
        """True while the optics settle after RSW or UCA (output undefined)."""
        t = self._clock() if now is None else now
        with self._lock:
            return t < self.settle_until

    def reset(self) -> None:
        """Power-cycle: come up in the start-up state (``SUS``), no settle pending."""
        with self._lock:
            if self.startup_state == "SFD":
                self.mode_ghz, self.plan, self.flex = self._factory_mode(), self.factory_plan, {}
            if self.startup_state != "SLS":
                self.active = self._all_blocked()
            self.staged = dict(self.active)
            self.settle_until = -math.inf
        logger.info("WSS emulator %s: reset (%s)", self.serial_number, self.startup_state)

    def _factory_mode(self) -> float:
        s = self.factory_plan.spacing_ghz
        return int(s) if float(s).is_integer() else s

    def inject(self, **changes: object) -> None:
        """Set fault fields by name (ConfigError for unknown names or bad values)."""
        with self._lock:
            self.faults = self.faults.merged(changes)

    def slice_range_thz(self, first: int, last: int) -> tuple[float, float]:
        """Low and high edge (THz) of flexgrid slices first..last."""
        lo = self.window_thz[0]
        return lo + (first - 1) * SLICE_GHZ / 1000.0, lo + last * SLICE_GHZ / 1000.0

    def channel_at(self, frequency_thz: float) -> int | None:
        """The channel whose passband holds the frequency (None outside every channel)."""
        if not math.isfinite(frequency_thz):
            return None
        with self._lock:
            if self.mode_ghz == 0:
                for ch, (s0, s1) in self.flex.items():
                    lo, hi = self.slice_range_thz(s0, s1)
                    if lo <= frequency_thz < hi:
                        return ch
                return None
            p = self.plan
            offset = (frequency_thz - p.first_thz) * 1000.0 / p.spacing_ghz
            channel = math.floor(offset + 0.5) + p.first_channel
            return channel if p.contains(channel) else None

    def centre_thz(self, channel: int) -> float:
        """Centre frequency (THz) of `channel` in the plan in force."""
        with self._lock:
            if self.mode_ghz == 0:
                lo, hi = self.slice_range_thz(*self.flex[channel])
                return (lo + hi) / 2
            return self.plan.centre_thz(channel)

    def route(self, frequency_thz: float, now: float | None = None) -> Route | None:
        """Out-port and attenuation for light at `frequency_thz` through the common in-port.

        None when the channel is blocked (port 99 or 99.9 dB), the frequency is in no
        channel's passband, or the switch is settling at time `now` (default: the clock).
        """
        t = self._clock() if now is None else now
        with self._lock:
            channel = self.channel_at(frequency_thz)
            if channel is None or t < self.settle_until:
                return None
            r = self.active.get(channel)
        if r is None or r.port == BLOCKED_PORT or r.blocked:
            return None
        return r

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
        """What the routed light depends on (plan, active array, settle)."""
        with self._lock:
            return (self.mode_ghz, self.plan, dict(self.flex), self.active, self.settle_until)

    def transitions(self, now: float) -> list[float]:
        """Future instants at which the light changes by itself (the end of a settle)."""
        with self._lock:
            return [self.settle_until] if self.settle_until > now else []

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
            if t < self.restart_until:
                logger.debug("WSS emulator: %r lost while restarting", line)
                return []
            if f.drop_answer(self._rng):
                logger.debug("WSS emulator: not answering %r", line)
                return []
            if f.garble_answer(self._rng):
                return [(f.late_s, self._garbage())]
            if not line.strip(" \t"):
                return []
            echo = [(f.late_s, _PRINTABLE.sub("?", line[:MAX_LINE]))] if self.echo else []
            try:
                text, framed = unframe(line.strip(" \t"))
            except ChecksumError as exc:
                logger.debug("WSS emulator: %s", exc)
                return echo + [(f.late_s, frame(WssErrorCode.CER.value))]
            out = (lambda s: frame(s)) if framed else (lambda s: s)
            if f.error_next > 0:
                f.error_next -= 1
                return echo + [(f.late_s, out(WssErrorCode.VER.value))]
            try:
                if len(line) > MAX_LINE or "\r" in text or "\n" in text:
                    raise Refused(WssErrorCode.AER, "over-long line or a line break inside it")
                lines = execute(self, text, t)
            except Refused as exc:
                logger.debug("WSS emulator: %r refused: %s %s", line[:80], exc.code.value,
                             exc.reason)
                return echo + [(f.late_s, out(exc.code.value))]
            return echo + [(f.late_s + d, out(s)) for d, s in lines]

    def _roll(self, probability: float) -> bool:
        return probability > 0 and self._rng.random() < probability

    def _garbage(self) -> str:
        n = self._rng.randint(1, 24)
        chars = [chr(self._rng.randint(0x80, 0xFF))]
        chars += [chr(self._rng.choice([*range(0x01, 0x0A), *range(0x0B, 0x0D),
                                        *range(0x0E, 0x100)])) for _ in range(n)]
        self._rng.shuffle(chars)
        return "".join(chars)



if __name__ == "__main__":  # the command line is wss_serve's
    raise SystemExit("the wss emulator's command is `python -m oddl.drivers.emulators.wss_serve` "
                     "(or `oddl emulate wss`)")
