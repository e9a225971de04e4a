"""The register model of the emulated ITLA: power-on state, reads, writes and timed operations.

``ItlaRegisterModel.execute(frame, now)`` turns one 4-byte request into its 4-byte reply;
``oddl.drivers.emulators.itla.ItlaEmulator`` adds the lock, faults and optical read-out around it.

The rules reconstructed where the MSA text was not at hand: ``itla_register_rules``.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from oddl.drivers.emulators.itla_register_rules import (
    ALM_BIT,
    CEL_BIT,
    CIE_REGISTERS,
    IMPLEMENTED,
    MONITOR_REGISTERS,
    MRL_BIT,
    PENDING_ENABLE,
    PENDING_FINE,
    PENDING_TUNE,
    PLAIN_RW,
    READ_ONLY,
    STRING_REGISTERS,
    XEL_BIT,
    NopError,
)
from oddl.drivers.itla_frames import (
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
from oddl.drivers.itla_registers import DIS_BIT, FREQ_BIT, PWR_BIT

logger = logging.getLogger(__name__)

__all__ = ["DARK_DBM", "ItlaRegisterModel", "ItlaTiming", "WriteFaults"]

DARK_DBM = -40.0
"""What OOP reports when no light is out (output off, tuning, after a reset)."""


def _signed(word: int) -> int:
    return word - 0x10000 if word & 0x8000 else word


@dataclass
class _Pending:
    flag: int
    until: float


@dataclass
class ItlaTiming:
    """How long the module takes (s): to lock after a tune, to enable, to start up; jitter."""

    time_to_lock_s: float
    enable_time_s: float
    startup_s: float
    lock_jitter_s: float


class WriteFaults(Protocol):
    """The injected faults the registers obey (``ItlaFaults`` has them)."""

    stuck_pending: bool
    error_next_write: int


class ItlaRegisterModel:
    """The registers of one emulated ITLA and the operations they start (tuning, enabling).

    Not locked and not faulty by itself: ``ItlaEmulator`` owns one and calls it under its lock.
    Frequencies in MHz and powers in 0.01 dBm, as the registers hold them; `faults` returns the
    emulator's fault settings in force (they may be replaced while it runs).
    """

    def __init__(self, *, serial_number: str, timing: ItlaTiming,
                 frequency_range_mhz: tuple[int, int], power_range: tuple[int, int],
                 min_grid_mhz: int, fine_tune_mhz: int,
                 defaults: tuple[int, int, int], strings: dict[str, str],
                 clock: Callable[[], float], rng: random.Random,
                 faults: Callable[[], WriteFaults]) -> None:
        self.serial_number = serial_number
        self.timing = timing
        self._lfl, self._lfh = frequency_range_mhz
        self._opsl, self._opsh = power_range
        self._lgrid = min_grid_mhz
        self._ftfr = fine_tune_mhz
        self._defaults = defaults
        """First channel's frequency (MHz), grid spacing (MHz), power (0.01 dBm) at power-on."""
        self._strings = strings
        self._clock = clock
        self._rng = rng
        self._faults = faults
        self.power_on()

    def power_on(self) -> None:
        """Every register back to its power-on value, output off, MRL latched."""
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
        self._regs = dict(PLAIN_RW)
        self._latch_f = MRL_BIT
        self._latch_w = MRL_BIT
        self._last_error = 0
        self._aea: bytes | None = None
        self._aea_pos = 0
        self._last_reply = encode_reply(0x00, NOP_MRDY)
        self._ready_at = self._clock() + self.timing.startup_s

    def _fcf_mhz(self) -> int:
        return self._fcf1 * 1_000_000 + self._fcf2 * 100 + self._fcf3

    def _grid_mhz(self) -> int:
        return self._grid * 100 + self._grid2

    def _channel_mhz(self, channel: int) -> int:
        return self._fcf_mhz() + (channel - 1) * self._grid_mhz()

    def _in_range(self, mhz: int) -> bool:
        return self._lfl <= mhz <= self._lfh

    def _settle(self, now: float) -> None:
        if (self._pending is not None and not self._faults().stuck_pending
                and now >= self._pending.until):
            self._pending = None

    def _emitting(self, now: float) -> bool:
        if not self._sena:
            return False
        p = self._pending
        return p is None or (not self._faults().stuck_pending and now >= p.until)

    def _start_pending(self, flag: int, now: float) -> None:
        t = self.timing
        delay = t.enable_time_s if flag == PENDING_ENABLE else t.time_to_lock_s
        if t.lock_jitter_s > 0:
            delay += self._rng.uniform(0.0, t.lock_jitter_s)
        self._pending = _Pending(flag, now + delay)

    def light(self, now: float) -> tuple[int, int] | None:
        """The light out at `now`: (frequency in MHz, power in 0.01 dBm), or None when dark."""
        if not self._emitting(now):
            return None
        return self._channel_mhz(self._channel) + self._ftf, self._pwr

    def light_state(self) -> tuple[object, ...]:
        """What the emitted light depends on (compared around a request: reads change none)."""
        return (self._sena, self._pending, self._channel, self._ftf, self._pwr,
                self._fcf_mhz(), self._grid_mhz())

    def pending_until(self) -> float | None:
        """When the operation in progress finishes (None: none, or stuck by a fault)."""
        p = self._pending
        return None if p is None or self._faults().stuck_pending else p.until

    def snapshot(self, now: float) -> dict[str, object]:
        """The registers' state at `now` as plain values (for tests and logs)."""
        self._settle(now)
        return {"output_enabled": self._sena, "pending": self._pending is not None,
                "channel": self._channel, "power_dbm": self._pwr / 100,
                "first_mhz": self._fcf_mhz(), "grid_mhz": self._grid_mhz(),
                "ftf_mhz": self._ftf, "regs": dict(self._regs), "aea": (self._aea, self._aea_pos)}

    def execute(self, frame: bytes, now: float) -> bytes:
        """Turn one 4-byte request into its 4-byte reply at time `now`."""
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
            reply = self._xe(req.register, NopError.CII)
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
        """Currents (0.1 mA) or Temps (0.01 degC), technology 1 order (see docs/reference/devices/itla.md).

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
        if reg in STRING_REGISTERS:
            self._aea = self._strings[STRING_REGISTERS[reg]].encode("ascii", "replace") + b"\0"
            self._aea_pos = 0
            return self._ok(reg, len(self._aea), Status.AEA)
        if reg in MONITOR_REGISTERS:
            words = self._monitor_words(MONITOR_REGISTERS[reg], now)
            self._aea = b"".join((w & 0xFFFF).to_bytes(2, "big") for w in words)
            self._aea_pos = 0
            return self._ok(reg, len(self._aea), Status.AEA)
        if reg == 0x0B:
            if self._aea is None or self._aea_pos >= len(self._aea):
                self._aea = None
                return self._xe(reg, NopError.ERE)
            chunk = self._aea[self._aea_pos:self._aea_pos + 2].ljust(2, b"\0")
            self._aea_pos += 2
            return self._ok(reg, int.from_bytes(chunk, "big"))
        value = self._register_value(reg, now)
        if value is None:
            return self._xe(reg, NopError.RNI)
        return self._ok(reg, value & 0xFFFF)

    def _register_value(self, reg: int, now: float) -> int | None:
        lf = split_mhz(min(max(0, self._channel_mhz(self._channel) + self._ftf),
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
        if reg not in IMPLEMENTED:
            return self._xe(reg, NopError.RNI)
        if reg == 0x0B:
            return self._xe(reg, NopError.ERO)
        if reg in READ_ONLY:
            return self._xe(reg, NopError.RNW)
        if self._pending is not None and reg != 0x32:
            return self._xe(reg, NopError.CIP)
        if self._faults().error_next_write > 0:
            self._faults().error_next_write -= 1
            return self._xe(reg, NopError.EXF)
        if reg in CIE_REGISTERS and self._sena:
            return self._xe(reg, NopError.CIE)
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
                return self._xe(reg, NopError.RVE)
            self._channel = channel
            return self._tuned(reg, data, PENDING_TUNE, now)
        if reg == 0x65:
            self._channel_h = data
            return self._ok(reg, data)
        if reg == 0x31:
            if not self._opsl <= value <= self._opsh:
                return self._xe(reg, NopError.RVE)
            self._pwr = value
            return self._ok(reg, data)
        if reg == 0x62:
            if abs(value) > self._ftfr:
                return self._xe(reg, NopError.RVE)
            self._ftf = value
            return self._tuned(reg, data, PENDING_FINE, now)
        return self._write_grid(reg, data, value)

    def _tuned(self, reg: int, data: int, flag: int, now: float) -> bytes:
        """The reply to an accepted tuning write: CP while the light retunes, OK when dark."""
        if self._sena:
            self._start_pending(flag, now)
            return self._ok(reg, data, Status.CP)
        return self._ok(reg, data)

    def _write_grid(self, reg: int, data: int, value: int) -> bytes:
        if reg == 0x35:
            if not self._lfl // 1_000_000 <= data <= self._lfh // 1_000_000:
                return self._xe(reg, NopError.RVE)
            self._fcf1 = data
        elif reg == 0x36:
            if data > 9999:
                return self._xe(reg, NopError.RVE)
            self._fcf2 = data
        elif reg == 0x67:
            if data > 99:
                return self._xe(reg, NopError.RVE)
            self._fcf3 = data
        elif reg == 0x34:
            if abs(value) * 100 + 99 < self._lgrid or abs(value) > 10000:
                return self._xe(reg, NopError.RVE)
            self._grid = value
        else:  # 0x66 GRID2
            if abs(value) > 99:
                return self._xe(reg, NopError.RVE)
            self._grid2 = value
        return self._ok(reg, data)

    def _write_resena(self, data: int, now: float) -> bytes:
        if data & RESENA_MR:
            reply = self._ok(0x32, data)
            self.power_on()
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
                return self._xe(0x32, NopError.CIP)
            return self._ok(0x32, data)
        if not self._in_range(self._channel_mhz(self._channel)):
            return self._xe(0x32, NopError.IVC)
        self._sena = True
        self._start_pending(PENDING_ENABLE, now)
        return self._ok(0x32, data, Status.CP)
