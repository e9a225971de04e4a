"""The register model of the emulated ITLA: power-on state, reads, writes and timed operations.

``ItlaRegisterModel._execute(frame, now)`` turns one 4-byte request into its 4-byte reply;
``drivers.emulators.itla.ItlaEmulator`` adds the lock, faults and optical read-out around it.

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
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from drivers.emulators.itla import ItlaFaults

logger = logging.getLogger(__name__)

__all__ = ["DARK_DBM", "ItlaRegisterModel"]

DARK_DBM = -40.0
"""What OOP reports when no light is out (output off, tuning, after a reset)."""

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

@dataclass
class _Pending:
    flag: int
    until: float



class ItlaRegisterModel:
    """The registers of one emulated ITLA and the operations they start (tuning, enabling).

    Not locked and not faulty by itself: ``ItlaEmulator`` calls it under its lock and sets the
    fields below in its constructor.
    """

    serial_number: str
    time_to_lock_s: float
    lock_jitter_s: float
    enable_time_s: float
    startup_s: float
    faults: ItlaFaults
    _clock: Callable[[], float]
    _rng: random.Random
    _lfl: int
    _lfh: int
    _opsl: int
    _opsh: int
    _lgrid: int
    _ftfr: int
    _defaults: tuple[int, int, int]
    _strings: dict[str, str]

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

    def _fcf_mhz(self) -> int:
        return self._fcf1 * 1_000_000 + self._fcf2 * 100 + self._fcf3

    def _grid_mhz(self) -> int:
        return self._grid * 100 + self._grid2

    def _channel_mhz(self, channel: int) -> int:
        return self._fcf_mhz() + (channel - 1) * self._grid_mhz()

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
            return self._tuned(reg, data, PENDING_TUNE, now)
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
        if not self._in_range(self._channel_mhz(self._channel)):
            return self._xe(0x32, IVC)
        self._sena = True
        self._start_pending(PENDING_ENABLE, now)
        return self._ok(0x32, data, Status.CP)
