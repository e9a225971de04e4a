"""Emulator of an OIF-ITLA-MSA tunable laser, byte for byte the protocol of ``drivers.itla``.

Layers, innermost first:

- ``ItlaEmulator.respond(frame)`` / ``handle_frame(frame)``: the frame-level core. It takes one
  4-byte request and returns the 4-byte reply (None: no answer); ``respond`` also returns the
  delay before the reply goes out. State lives behind one lock; time comes from the injected
  ``clock``.
- ``ItlaEmulator.optical_output(now)``: the physical read-out for the optical fabric.
- ``itla_connection_handler(emulator)``: serves the core over TCP (``TcpEmulatorServer``).
- ``serve_pty(emulator)``: serves it on a pseudo-terminal any serial-port software can open.
- ``add_arguments(parser)`` / ``run(args)``: the ``oddl emulate itla`` hooks.

Behaviour taken from the MSA: frame layout and BIP-4 checksum; statuses OK/XE/AEA/CP; NOP
error codes; strings served through AEA (the read returns AEA and the byte count, EAR returns
two bytes per read, reading past the end is XE with ERE); FCF/GRID writes with the output on are
XE with CIE; a request with a bad checksum is not executed and is answered with the CE flag; a
request with the LstRsp bit gets the previous reply again without executing anything. Frames
are found by counting bytes only (no inter-byte timeout): a lost byte shifts the frames until
the host sends single NOP bytes. After power-up and MR, for ``startup_s``, every command but a
NOP read is XE with CII (NOP's MRDY reads 0). Currents (0x57) and Temps (0x58) are AEA words.
See docs/devices/itla.md for each rule, its source and where published clients disagree.

Reconstruction (chosen here where the MSA text was not at hand; the driver does not depend on
the details beyond what it checks):

- CE reply: status OK, CE set, register byte echoed, data 0; the previous reply stays the
  "last response"; CEL is latched in StatusF/StatusW. Nothing else changes.
- XE replies carry data 0. The NOP error field holds the error of the last command other than
  NOP (0 after a success); reading NOP does not clear it.
- NOP: pending flags in bits 15-8 (bit 8 output enable, bit 9 channel tune, bit 10 fine tune),
  MRDY (bit 4) when nothing is pending, error field in bits 3-0. While an operation is pending a
  NOP read answers with status CP (so hosts that poll until CP ends and hosts that poll until
  ``NOP & 0xFF00`` is 0 both work); otherwise OK.
- Pending: enabling the output (ResEna SENA 0 -> 1), a Channel write and an FTF write *while the
  output is on* answer CP and stay pending for ``time_to_lock_s + U(0, lock_jitter_s)``. With
  the output off, Channel/FCF/GRID/FTF writes complete at once (OK): there is no light to tune,
  and the new frequency is acquired during the next enable. While pending, every write except
  NOP and ResEna is refused with XE/CIP; reads are served. Writing ResEna without SENA switches
  the output off and aborts the pending operation; SR (bit 1) does the same and ends any AEA
  read; MR (bit 0) answers OK and then restores the power-on state.
- ChannelH is stored when written and takes effect with the next Channel write (which tunes to
  ChannelH:Channel); reading ChannelH returns the value written.
- Enabling with the current channel outside LFL..LFH (after an FCF/GRID change) is XE/IVC.
- Ranges (RVE): Channel >= 1 with FCF + (ch - 1) x GRID inside LFL..LFH; PWR inside OPSL..OPSH;
  FCF1 inside the THz parts of LFL..LFH; FCF2 <= 9999; FCF3 <= 99; |GRID2| <= 99; |FTF| <= FTFR;
  GRID must be able to reach LGrid (|GRID| x 100 + 99 >= LGrid in MHz) and |GRID| <= 10000.
- Writes to read-only registers: RNW; to EAR: ERO. Unknown registers: RNI (implemented: those
  listed in ``_IMPLEMENTED``).
- StatusF/StatusW: DIS (bit 12) while the output is off; FPWR/FFREQ (F) and WPWR/WFREQ (W) and
  ALM while an operation is pending with the output on (not locked); latched MRL after power-up
  and resets, CEL after a bad checksum, XEL after any XE; writing 1 to a latched bit clears it.
- OOP reads the power set-point when light is out, otherwise -40.00 dBm (``DARK_DBM``). LF1-3
  always read the target frequency of the current channel (plus FTF).
- LstResp (0x13) reads the data word of the reply sent before it, echoing register 0x13, and
  leaves that reply as the last response. Temps: [chip 35.00 degC, case 25.00 degC];
  Currents: [TEC 150.0 mA, diode 0 without light, else 30 mA + 4 mA per mW].

Fault injection (``ItlaFaults``), checked in this order for each received frame:
a pending reset (``reset_next``) restores the power-on state and the frame is lost; no-answer
faults drop the frame unexecuted; otherwise the frame is executed, and then garbage faults
replace the reply with four random bytes with a wrong checksum (the real reply stays the "last
response", so LstRsp recovers it), truncation faults send only the first two bytes, and error
faults (``error_next_write``) turn the next valid writes into XE/EXF. ``late_s`` delays every
reply; ``late_next`` delays only the next k replies by ``late_next_s``. ``stuck_pending`` keeps
pending operations from ever finishing. ``lose_byte`` drops the second byte of the next k
chunks received from the host (before framing). Random draws come from ``random.Random(seed)``
only.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from common.errors import ConfigError
from drivers.emulators.cli import (
    listen_arg,
    milliseconds_arg,
    serve_pty_until_signal,
    serve_until_signal,
    start_server,
)
from drivers.emulators.faults import FaultSettings
from drivers.emulators.ptyserve import Pty
from drivers.itla_frames import (
    NOP_MRDY,
    RESENA_MR,
    RESENA_SR,
    SENA,
    Status,
    checksum_ok,
    decode_request,
    encode_reply,
    split_mhz,
)
from drivers.itla_registers import DIS_BIT, FREQ_BIT, PWR_BIT

logger = logging.getLogger(__name__)

__all__ = [
    "DARK_DBM",
    "ItlaEmulator",
    "ItlaFaults",
    "OpticalOutput",
    "add_arguments",
    "itla_connection_handler",
    "main",
    "run",
    "serve_pty",
]

DARK_DBM = -40.0
"""What OOP reports when no light is out (output off, tuning, after a reset)."""
IDLE_POLL_S = 0.5
"""How long the TCP handler blocks in one recv before it loops (framing never times out)."""

PENDING_ENABLE = 0x01
PENDING_TUNE = 0x02
PENDING_FINE = 0x04

ALM_BIT = 1 << 14
MRL_BIT = 1 << 5
CEL_BIT = 1 << 6
XEL_BIT = 1 << 7

RNI, RNW, RVE, CIP, CII, ERE, ERO, EXF, CIE, IVC = (0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x8, 0x9,
                                                     0xA)

_STRINGS = {0x01: "devtyp", 0x02: "mfgr", 0x03: "model", 0x04: "serno", 0x05: "mfgdate",
            0x06: "release", 0x07: "relback"}
_MONITORS = {0x57: "currents", 0x58: "temps"}
"""AEA monitor registers: Currents (0.1 mA words) and Temps (0.01 degC words)."""
_READ_ONLY = {0x09, 0x0A, 0x13, 0x40, 0x41, 0x42, 0x43, 0x4F, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55,
              0x56, 0x68, 0x69, 0x6A, 0x6B} | set(_STRINGS) | set(_MONITORS)
_PLAIN_RW = {0x08: 0x0000, 0x0D: 0x0000, 0x22: 200, 0x23: 100, 0x24: 50, 0x25: 20, 0x26: 500,
             0x27: 300, 0x28: 0x0000, 0x29: 0x0000, 0x2A: 0x0D0F, 0x33: 0x0004}
"""Registers stored as written (GenCfg, IOCap, thresholds, triggers, MCB) with power-on values."""
_TUNING = {0x30, 0x31, 0x32, 0x34, 0x35, 0x36, 0x62, 0x65, 0x66, 0x67}
_IMPLEMENTED = ({0x00, 0x0B, 0x20, 0x21} | _READ_ONLY | set(_PLAIN_RW) | _TUNING)
_CIE_REGISTERS = {0x34, 0x35, 0x36, 0x66, 0x67}
"""FCF1/2/3 and GRID/GRID2: refused with CIE while the output is on."""


def _signed(word: int) -> int:
    return word - 0x10000 if word & 0x8000 else word


@dataclass(frozen=True)
class OpticalOutput:
    """The light leaving the laser: frequency (THz) and power (dBm)."""

    frequency_thz: float
    power_dbm: float


@dataclass
class ItlaFaults(FaultSettings):
    """Faults to inject; set fields from a test (``emu.faults.no_answer = 2``) or from config.

    Counters count down by one per received frame (``error_next_write`` per valid write).
    """

    LABEL = "itla"

    no_answer: int = 0
    """Drop the next k frames unexecuted (no answer)."""
    no_answer_always: bool = False
    """Never answer (a dead or unplugged module)."""
    late_s: float = 0.0
    """Delay every answer by this many seconds."""
    late_next: int = 0
    """Delay only the next k answers, by ``late_next_s``."""
    late_next_s: float = 0.0
    """Delay used by ``late_next``."""
    garbage: int = 0
    """Execute the next k frames but answer with four random bytes (bad checksum)."""
    truncate: int = 0
    """Execute the next k frames but send only the first two bytes of the answer."""
    lose_byte: int = 0
    """Lose one byte (the second) of each of the next k chunks received from the host: the
    module's frame boundary slips until the host resynchronises (MSA: single NOP bytes)."""
    error_next_write: int = 0
    """Refuse the next k otherwise valid writes with XE / EXF (execution failure)."""
    reset_next: bool = False
    """On the next frame, reset to the power-on state (output off); that frame is lost."""
    stuck_pending: bool = False
    """Pending operations never finish (until this is cleared, or a reset / output off)."""
    drop_probability: float = 0.0
    """Chance (seeded) that any frame goes unanswered."""
    garbage_probability: float = 0.0
    """Chance (seeded) that any answer is garbage."""

    def __post_init__(self) -> None:
        self.validate()




@dataclass
class _Pending:
    flag: int
    until: float


class ItlaEmulator:
    """An emulated ITLA: a 4-byte frame in, a 4-byte reply out, with timed tuning.

    The laser covers ``channels`` channels from ``first_thz`` at ``spacing_ghz`` (that is its
    LFL..LFH range); the grid registers start on that grid, channel 1, output off.

    Timing, all from the caller's configuration: ``time_to_lock_s`` (a channel or fine-tune
    change with the output on), ``enable_time_s`` (output enable to stable light; default: the
    same as ``time_to_lock_s``), both plus ``U(0, lock_jitter_s)``, and ``startup_s``, the
    initialisation window after power-up or a module reset (MR) during which every command but
    a NOP read is refused with XE / CII. Real modules take seconds for each; the emulated
    testbed uses milliseconds and no start-up window.
    """

    def __init__(self, *, serial_number: str = "EMU-0001", first_thz: float = 193.1,
                 spacing_ghz: float = 100.0, channels: int = 48, time_to_lock_s: float = 0.001,
                 lock_jitter_s: float = 0.0, enable_time_s: float | None = None,
                 startup_s: float = 0.0, seed: int = 0, power_dbm: float = 10.0,
                 power_range_dbm: tuple[float, float] = (6.0, 13.5),
                 min_grid_ghz: float = 6.25, fine_tune_mhz: int = 6000,
                 manufacturer: str = "oddl emulated photonics", model: str = "ITLA-EMU-1",
                 clock: Callable[[], float] = time.monotonic,
                 faults: ItlaFaults | None = None) -> None:
        enable = time_to_lock_s if enable_time_s is None else enable_time_s
        times = {"time_to_lock_s": time_to_lock_s, "lock_jitter_s": lock_jitter_s,
                 "enable_time_s": enable, "startup_s": startup_s}
        bad = [f"{k}={v}" for k, v in times.items() if not (math.isfinite(v) and v >= 0)]
        if channels < 1 or spacing_ghz == 0 or bad:
            raise ConfigError(f"ITLA emulator: channels={channels}, spacing_ghz={spacing_ghz}"
                              f"{', ' if bad else ''}{', '.join(bad)}; expected channels >= 1, "
                              "a non-zero spacing and times >= 0 s")
        low_dbm, high_dbm = power_range_dbm
        if not low_dbm <= power_dbm <= high_dbm:
            raise ConfigError(f"ITLA emulator: power_dbm={power_dbm} is outside "
                              f"power_range_dbm={power_range_dbm}")
        first = round(first_thz * 1e6)
        last = first + (channels - 1) * round(spacing_ghz * 1e3)
        self.serial_number = serial_number
        self.time_to_lock_s = time_to_lock_s
        self.lock_jitter_s = lock_jitter_s
        self.enable_time_s = enable
        self.startup_s = startup_s
        self.faults = faults if faults is not None else ItlaFaults()
        self._clock = clock
        self.on_change: Callable[[], None] | None = None
        """Called after every request (the emulated fabric recomputes where light goes)."""
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._lfl = min(first, last)
        self._lfh = max(first, last)
        self._opsl = round(low_dbm * 100)
        self._opsh = round(high_dbm * 100)
        self._lgrid = round(min_grid_ghz * 1e3)
        self._ftfr = fine_tune_mhz
        self._defaults = (first, round(spacing_ghz * 1e3), round(power_dbm * 100))
        self._strings = {"devtyp": "CW ITLA", "mfgr": manufacturer, "model": model,
                         "serno": serial_number, "mfgdate": "2024-01-01", "release": "1.3.0",
                         "relback": "1.0.0"}
        self._power_on()

    # -- state --

    def _power_on(self) -> None:
        first, spacing, power = self._defaults
        self._sena = False
        self._pending: _Pending | None = None
        self._channel = 1  # the channel in use (32 bits), set by a Channel write
        self._channel_h = 0  # ChannelH as written; it takes effect at the next Channel write
        self._pwr = power
        self._fcf1, self._fcf2, self._fcf3 = split_mhz(first)
        self._grid = int(math.copysign(abs(spacing) // 100, spacing))
        self._grid2 = spacing - self._grid * 100
        self._ftf = 0
        self._regs = dict(_PLAIN_RW)
        self._latch_f = MRL_BIT
        self._latch_w = MRL_BIT
        self._last_error = 0
        self._aea: bytes | None = None
        self._aea_pos = 0
        self._last_reply = encode_reply(0x00, NOP_MRDY)
        self._ready_at = self._clock() + self.startup_s

    def reset(self) -> None:
        """Power-cycle: every register back to its power-on value, output off, MRL latched."""
        with self._lock:
            self._power_on()
        logger.info("ITLA emulator %s: reset", self.serial_number)

    def inject(self, **changes: object) -> None:
        """Set fault fields by name (ConfigError for unknown names or bad values)."""
        with self._lock:
            merged = {f.name: getattr(self.faults, f.name) for f in fields(ItlaFaults)}
            unknown = sorted(set(changes) - set(merged))
            if unknown:
                raise ConfigError(f"itla faults: unknown key(s) {', '.join(unknown)}")
            merged.update(changes)
            self.faults = ItlaFaults.from_mapping(merged)

    def _fcf_mhz(self) -> int:
        return self._fcf1 * 1_000_000 + self._fcf2 * 100 + self._fcf3

    def _grid_mhz(self) -> int:
        return self._grid * 100 + self._grid2

    def _channel_mhz(self, channel: int) -> int:
        return self._fcf_mhz() + (channel - 1) * self._grid_mhz()

    def _full_channel(self) -> int:
        return self._channel

    def _in_range(self, mhz: int) -> bool:
        return self._lfl <= mhz <= self._lfh

    def _settle(self, now: float) -> None:
        if (self._pending is not None and not self.faults.stuck_pending
                and now >= self._pending.until):
            self._pending = None

    def _emitting(self, now: float) -> bool:
        if not self._sena:
            return False
        p = self._pending
        return p is None or (not self.faults.stuck_pending and now >= p.until)

    def _start_pending(self, flag: int, now: float) -> None:
        delay = self.enable_time_s if flag == PENDING_ENABLE else self.time_to_lock_s
        if self.lock_jitter_s > 0:
            delay += self._rng.uniform(0.0, self.lock_jitter_s)
        self._pending = _Pending(flag, now + delay)

    # -- physical read-out and inspection --

    def optical_output(self, now: float | None = None) -> OpticalOutput | None:
        """The light out at `now` (default: the clock), or None when dark (off, pending, reset)."""
        with self._lock:
            t = self._clock() if now is None else now
            if not self._emitting(t):
                return None
            mhz = self._channel_mhz(self._full_channel()) + self._ftf
            return OpticalOutput(mhz / 1e6, self._pwr / 100)

    def snapshot(self) -> dict[str, Any]:
        """The emulated state as plain values (for tests and logs)."""
        with self._lock:
            self._settle(self._clock())
            return {"output_enabled": self._sena, "pending": self._pending is not None,
                    "channel": self._full_channel(), "power_dbm": self._pwr / 100,
                    "first_mhz": self._fcf_mhz(), "grid_mhz": self._grid_mhz(),
                    "ftf_mhz": self._ftf, "regs": dict(self._regs),
                    "aea": (self._aea, self._aea_pos)}

    # -- frames --

    def handle_frame(self, frame: bytes) -> bytes | None:
        """Answer one 4-byte request (None: no answer). Any reply delay is ignored here."""
        return self.respond(frame)[0]

    def respond(self, frame: bytes) -> tuple[bytes | None, float]:
        """Answer one 4-byte request: (reply or None, seconds to wait before sending it)."""
        if self.on_change is None:
            return self._respond(frame)
        before = self._light_state()
        try:
            return self._respond(frame)
        finally:
            if self._light_state() != before:
                self.on_change()

    def _light_state(self) -> tuple[Any, ...]:
        """What the emitted light depends on (compared around a request: reads change none)."""
        with self._lock:
            return (self._sena, self._pending, self._channel, self._ftf, self._pwr,
                    self._fcf_mhz(), self._grid_mhz())

    def transitions(self, now: float) -> list[float]:
        """Future instants at which the light changes by itself (the end of a tuning)."""
        with self._lock:
            p = self._pending
            if p is None or self.faults.stuck_pending or p.until <= now:
                return []
            return [p.until]

    def _respond(self, frame: bytes) -> tuple[bytes | None, float]:
        if len(frame) != 4:
            raise ValueError(f"ITLA frames are 4 bytes, got {len(frame)}")
        with self._lock:
            f = self.faults
            delay = f.late_s
            if f.late_next > 0:
                f.late_next -= 1
                delay += f.late_next_s
            if f.reset_next:
                f.reset_next = False
                self._power_on()
                logger.info("ITLA emulator %s: injected reset", self.serial_number)
                return None, 0.0
            if f.no_answer_always:
                return None, 0.0
            if f.no_answer > 0:
                f.no_answer -= 1
                return None, 0.0
            if f.drop_probability and self._rng.random() < f.drop_probability:
                return None, 0.0
            reply = self._execute(frame, self._clock())
            if f.garbage > 0 or (f.garbage_probability
                                 and self._rng.random() < f.garbage_probability):
                f.garbage = max(0, f.garbage - 1)
                return self._garbage(), delay
            if f.truncate > 0:
                f.truncate -= 1
                return reply[:2], delay
            return reply, delay

    def lose_bytes(self, data: bytes) -> bytes:
        """What of `data` reaches the module's UART (the ``lose_byte`` fault drops one byte)."""
        with self._lock:
            if self.faults.lose_byte > 0 and len(data) >= 2:
                self.faults.lose_byte -= 1
                logger.info("ITLA emulator %s: lost byte %02X of %s", self.serial_number,
                            data[1], data.hex(" "))
                return data[:1] + data[2:]
        return data

    def _garbage(self) -> bytes:
        raw = bytearray(self._rng.randbytes(4))
        if checksum_ok(bytes(raw)):
            raw[0] ^= 0x10  # make sure the checksum nibble is wrong
        return bytes(raw)

    def _execute(self, frame: bytes, now: float) -> bytes:
        if not checksum_ok(frame):
            self._latch_f |= CEL_BIT
            self._latch_w |= CEL_BIT
            return encode_reply(frame[1], 0, Status.OK, ce=True)
        req = decode_request(frame)
        if req.last_response:
            return self._last_reply
        self._settle(now)
        if now < self._ready_at and req.register != 0x00:
            # Initialising after power-up or MR: only NOP is served (its MRDY bit reads 0).
            reply = self._xe(req.register, CII)
        elif req.register == 0x13 and not req.write:
            # LstResp: the data word of the reply sent before this one; like the LstRsp bit,
            # reading it leaves that reply as the "last response".
            return self._ok(0x13, int.from_bytes(self._last_reply[2:], "big"))
        elif req.write:
            reply = self._write(req.register, req.data, now)
        else:
            reply = self._read(req.register, now)
        self._last_reply = reply
        return reply

    def _ok(self, register: int, data: int, status: Status = Status.OK) -> bytes:
        if register != 0x00:
            self._last_error = 0
        return encode_reply(register, data, status)

    def _xe(self, register: int, code: int) -> bytes:
        self._last_error = code
        self._latch_f |= XEL_BIT
        self._latch_w |= XEL_BIT
        return encode_reply(register, 0, Status.XE)

    def _nop_word(self) -> int:
        if self._pending is not None:
            return self._pending.flag << 8 | self._last_error
        if self._clock() < self._ready_at:
            return self._last_error
        return NOP_MRDY | self._last_error

    def _monitor_words(self, name: str, now: float) -> list[int]:
        """Currents (0.1 mA) or Temps (0.01 degC), technology 1 order (see docs/devices/itla.md).

        Temps: [laser chip, case]; the TEC holds the chip at 35.00 degC. Currents: [TEC, laser
        diode]; the diode current is 0 without light, else 30 mA threshold plus 4 mA per mW
        (a simple model, not any vendor's calibration).
        """
        if name == "temps":
            return [3500, 2500]
        diode = 0
        if self._emitting(now):
            diode = round((30.0 + 4.0 * 10 ** (self._pwr / 1000)) * 10)
        return [1500, diode]

    def _status_word(self, latch: int) -> int:
        word = latch & 0xFF
        if not self._sena:
            word |= DIS_BIT
        elif self._pending is not None:
            word |= FREQ_BIT | PWR_BIT | ALM_BIT
        return word

    # -- reads --

    def _read(self, reg: int, now: float) -> bytes:
        if reg == 0x00:
            status = Status.CP if self._pending is not None else Status.OK
            return encode_reply(reg, self._nop_word(), status)
        if reg in _STRINGS:
            self._aea = self._strings[_STRINGS[reg]].encode("ascii", "replace") + b"\0"
            self._aea_pos = 0
            return self._ok(reg, len(self._aea), Status.AEA)
        if reg in _MONITORS:
            words = self._monitor_words(_MONITORS[reg], now)
            self._aea = b"".join((w & 0xFFFF).to_bytes(2, "big") for w in words)
            self._aea_pos = 0
            return self._ok(reg, len(self._aea), Status.AEA)
        if reg == 0x0B:
            if self._aea is None or self._aea_pos >= len(self._aea):
                self._aea = None
                return self._xe(reg, ERE)
            chunk = self._aea[self._aea_pos:self._aea_pos + 2].ljust(2, b"\0")
            self._aea_pos += 2
            return self._ok(reg, int.from_bytes(chunk, "big"))
        value = self._register_value(reg, now)
        if value is None:
            return self._xe(reg, RNI)
        return self._ok(reg, value & 0xFFFF)

    def _register_value(self, reg: int, now: float) -> int | None:
        lf = split_mhz(min(max(0, self._channel_mhz(self._full_channel()) + self._ftf),
                           65_535_999_999))
        lfl, lfh = split_mhz(self._lfl), split_mhz(self._lfh)
        values: dict[int, int] = {
            0x09: 0, 0x0A: self._aea_pos,
            0x20: self._status_word(self._latch_f), 0x21: self._status_word(self._latch_w),
            0x30: self._channel & 0xFFFF, 0x31: self._pwr, 0x32: SENA if self._sena else 0,
            0x34: self._grid, 0x35: self._fcf1, 0x36: self._fcf2,
            0x40: lf[0], 0x41: lf[1], 0x68: lf[2],
            0x42: self._pwr if self._emitting(now) else round(DARK_DBM * 100),
            0x43: 2500, 0x4F: self._ftfr, 0x50: self._opsl, 0x51: self._opsh,
            0x52: lfl[0], 0x53: lfl[1], 0x69: lfl[2], 0x54: lfh[0], 0x55: lfh[1], 0x6A: lfh[2],
            0x56: self._lgrid // 100, 0x6B: self._lgrid % 100,
            0x62: self._ftf, 0x65: self._channel_h, 0x66: self._grid2, 0x67: self._fcf3,
        }
        if reg in values:
            return values[reg]
        return self._regs.get(reg)

    # -- writes --

    def _write(self, reg: int, data: int, now: float) -> bytes:
        if reg == 0x00:
            return self._read(reg, now)
        if reg not in _IMPLEMENTED:
            return self._xe(reg, RNI)
        if reg == 0x0B:
            return self._xe(reg, ERO)
        if reg in _READ_ONLY:
            return self._xe(reg, RNW)
        if self._pending is not None and reg != 0x32:
            return self._xe(reg, CIP)
        if self.faults.error_next_write > 0:
            self.faults.error_next_write -= 1
            return self._xe(reg, EXF)
        if reg in _CIE_REGISTERS and self._sena:
            return self._xe(reg, CIE)
        value = _signed(data)
        if reg == 0x20 or reg == 0x21:
            if reg == 0x20:
                self._latch_f &= ~(data & 0xFF)
            else:
                self._latch_w &= ~(data & 0xFF)
            return self._ok(reg, data)
        if reg in self._regs:
            self._regs[reg] = data
            return self._ok(reg, data)
        if reg == 0x32:
            return self._write_resena(data, now)
        if reg == 0x30:
            channel = self._channel_h << 16 | data
            if channel < 1 or not self._in_range(self._channel_mhz(channel)):
                return self._xe(reg, RVE)
            self._channel = channel
            if self._sena:
                self._start_pending(PENDING_TUNE, now)
                return self._ok(reg, data, Status.CP)
            return self._ok(reg, data)
        if reg == 0x65:
            self._channel_h = data
            return self._ok(reg, data)
        if reg == 0x31:
            if not self._opsl <= value <= self._opsh:
                return self._xe(reg, RVE)
            self._pwr = value
            return self._ok(reg, data)
        if reg == 0x62:
            if abs(value) > self._ftfr:
                return self._xe(reg, RVE)
            self._ftf = value
            if self._sena:
                self._start_pending(PENDING_FINE, now)
                return self._ok(reg, data, Status.CP)
            return self._ok(reg, data)
        return self._write_grid(reg, data, value)

    def _write_grid(self, reg: int, data: int, value: int) -> bytes:
        if reg == 0x35:
            if not self._lfl // 1_000_000 <= data <= self._lfh // 1_000_000:
                return self._xe(reg, RVE)
            self._fcf1 = data
        elif reg == 0x36:
            if data > 9999:
                return self._xe(reg, RVE)
            self._fcf2 = data
        elif reg == 0x67:
            if data > 99:
                return self._xe(reg, RVE)
            self._fcf3 = data
        elif reg == 0x34:
            if abs(value) * 100 + 99 < self._lgrid or abs(value) > 10000:
                return self._xe(reg, RVE)
            self._grid = value
        else:  # 0x66 GRID2
            if abs(value) > 99:
                return self._xe(reg, RVE)
            self._grid2 = value
        return self._ok(reg, data)

    def _write_resena(self, data: int, now: float) -> bytes:
        if data & RESENA_MR:
            reply = self._ok(0x32, data)
            self._power_on()
            logger.info("ITLA emulator %s: module reset (MR)", self.serial_number)
            return reply
        if data & RESENA_SR:
            self._sena = False
            self._pending = None
            self._aea = None
            return self._ok(0x32, data)
        if not data & SENA:
            self._sena = False
            self._pending = None
            return self._ok(0x32, data)
        if self._sena:
            if self._pending is not None:
                return self._xe(0x32, CIP)
            return self._ok(0x32, data)
        if not self._in_range(self._channel_mhz(self._full_channel())):
            return self._xe(0x32, IVC)
        self._sena = True
        self._start_pending(PENDING_ENABLE, now)
        return self._ok(0x32, data, Status.CP)


# --- byte-stream servers -------------------------------------------------------------------------

class _FrameServer:
    """Cuts a byte stream into 4-byte frames and sends the emulator's replies on time.

    Framing is by byte count only, as on the module's UART: there is no inter-byte timeout, so
    a byte lost on the way in shifts every later frame until the host resynchronises by sending
    single NOP (0x00) bytes until a 4-byte reply comes back (see docs/devices/itla.md).
    """

    def __init__(self, emulator: ItlaEmulator, send: Callable[[bytes], None]) -> None:
        self._emulator = emulator
        self._send = send
        self._buf = bytearray()

    def feed(self, data: bytes, stop: threading.Event | None = None) -> None:
        self._buf += self._emulator.lose_bytes(data)
        while len(self._buf) >= 4:
            frame = bytes(self._buf[:4])
            del self._buf[:4]
            reply, delay = self._emulator.respond(frame)
            if delay > 0:
                if stop is not None:
                    if stop.wait(delay):
                        return
                else:
                    time.sleep(delay)
            if reply:
                self._send(reply)


def itla_connection_handler(emulator: ItlaEmulator) -> Callable[[socket.socket], None]:
    """A TcpEmulatorServer handler: 4-byte requests in, 4-byte replies out, delays honoured."""

    def handle(conn: socket.socket) -> None:
        conn.settimeout(IDLE_POLL_S)
        frames = _FrameServer(emulator, conn.sendall)
        while True:
            try:
                data = conn.recv(256)
            except TimeoutError:
                continue
            if not data:
                return
            frames.feed(data)

    return handle


def serve_pty(emulator: ItlaEmulator) -> tuple[str, Callable[[], None]]:
    """Serve `emulator` on a new pseudo-terminal; return (slave device path, stop function).

    Open the path with any serial-port software (pyserial: ``serial.Serial(path)``); the baud
    rate is ignored. The stop function ends the server thread and closes the terminal.
    """
    pty = Pty()
    master, path, stop, send = pty.master, pty.path, pty.stop, pty.send

    frames = _FrameServer(emulator, send)

    def loop() -> None:
        while not stop.is_set():
            try:
                ready, _, _ = select.select([master], [], [], 0.1)
                if not ready:
                    continue
                data = os.read(master, 256)
            except OSError:  # closed under us, or no reader on the slave side
                if stop.wait(0.05):
                    return
                continue
            if data:
                frames.feed(data, stop)

    stop_serving = pty.start(loop, name=f"itla-pty-{emulator.serial_number}")

    logger.info("ITLA emulator %s serving on %s", emulator.serial_number, path)
    return path, stop_serving


# --- command line --------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``oddl emulate itla`` options to `parser`."""
    parser.add_argument("--listen", default="127.0.0.1:0", type=listen_arg,
                        metavar="HOST:PORT", help="TCP address to serve on (port 0: any free "
                        "port; default 127.0.0.1:0)")
    parser.add_argument("--pty", action="store_true",
                        help="serve on a pseudo-terminal instead of TCP and print its path")
    parser.add_argument("--time-to-lock-ms", default=1.0, type=milliseconds_arg,
                        help="time from a channel write (output on) to lock, in ms (default 1; "
                        "real modules: seconds)")
    parser.add_argument("--enable-ms", default=None, type=milliseconds_arg,
                        help="time from output enable to stable, locked light, in ms (default: "
                        "the time to lock; real modules: seconds)")
    parser.add_argument("--startup-ms", default=0.0, type=milliseconds_arg,
                        help="initialisation window after power-up or a module reset, in ms: "
                        "commands other than NOP get XE / CII meanwhile (default 0)")
    parser.add_argument("--jitter-ms", default=0.0, type=milliseconds_arg,
                        help="extra uniform random time added to each lock / enable, in ms "
                        "(default 0)")
    parser.add_argument("--serial", default="EMU-0001", help="serial number SerNo reports")
    parser.add_argument("--seed", default=0, type=int, help="seed for jitter and random faults")


def run(args: argparse.Namespace) -> int:
    """Serve one emulated ITLA; print its address (URL or pty path) once; stop on SIGINT/SIGTERM."""
    enable_ms = args.enable_ms
    emulator = ItlaEmulator(serial_number=args.serial, time_to_lock_s=args.time_to_lock_ms / 1000,
                            enable_time_s=None if enable_ms is None else enable_ms / 1000,
                            startup_s=args.startup_ms / 1000,
                            lock_jitter_s=args.jitter_ms / 1000, seed=args.seed)
    if not args.pty:
        server = start_server(itla_connection_handler(emulator), args.listen, "itla-emulator")
        logger.info("ITLA emulator %s serving on %s", args.serial, server.url)
        return serve_until_signal(server, lambda s: s.url)
    return serve_pty_until_signal(lambda: serve_pty(emulator))


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m drivers.emulators.itla [options]``."""
    parser = argparse.ArgumentParser(prog="itla_emulator", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
