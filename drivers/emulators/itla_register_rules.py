"""The emulated ITLA's register rules: the registers it implements, its codes and bits.

``oddl.drivers.emulators.itla_register_model.ItlaRegisterModel`` serves them.

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
  listed in ``IMPLEMENTED``).
- StatusF/StatusW: DIS (bit 12) while the output is off; FPWR/FFREQ (F) and WPWR/WFREQ (W) and
  ALM while an operation is pending with the output on (not locked); latched MRL after power-up
  and resets, CEL after a bad checksum, XEL after any XE; writing 1 to a latched bit clears it.
- OOP reads the power set-point when light is out, otherwise -40.00 dBm (``DARK_DBM``). LF1-3
  always read the target frequency of the current channel (plus FTF).
- LstResp (0x13) reads the data word of the reply sent before it, echoing register 0x13, and
  leaves that reply as the last response. Temps: [chip 35.00 degC, case 25.00 degC];
  Currents: [TEC 150.0 mA, diode 0 without light, else 30 mA + 4 mA per mW].
"""

from enum import IntEnum

__all__ = ["ALM_BIT", "CEL_BIT", "CIE_REGISTERS", "IMPLEMENTED", "MONITOR_REGISTERS", "MRL_BIT",
           "PENDING_ENABLE", "PENDING_FINE", "PENDING_TUNE", "PLAIN_RW", "READ_ONLY",
           "STRING_REGISTERS", "TUNING", "XEL_BIT", "NopError"]

PENDING_ENABLE = 0x01
"""NOP pending flags (bits 15-8 of NOP): output enable, channel tune, fine tune."""
PENDING_TUNE = 0x02
PENDING_FINE = 0x04

ALM_BIT = 1 << 14
"""StatusF/StatusW: ALM; MRL, CEL and XEL are the latched bits."""
MRL_BIT = 1 << 5
CEL_BIT = 1 << 6
XEL_BIT = 1 << 7


class NopError(IntEnum):
    """Error codes of the NOP error field (NOP, MSA §9.4.1)."""

    RNI = 0x1
    RNW = 0x2
    RVE = 0x3
    CIP = 0x4
    CII = 0x5
    ERE = 0x6
    ERO = 0x7
    EXF = 0x8
    CIE = 0x9
    IVC = 0xA


STRING_REGISTERS = {0x01: "devtyp", 0x02: "mfgr", 0x03: "model", 0x04: "serno", 0x05: "mfgdate",
            0x06: "release", 0x07: "relback"}
MONITOR_REGISTERS = {0x57: "currents", 0x58: "temps"}
"""AEA monitor registers: Currents (0.1 mA words) and Temps (0.01 degC words)."""
READ_ONLY = {0x09, 0x0A, 0x13, 0x40, 0x41, 0x42, 0x43, 0x4F, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55,
              0x56, 0x68, 0x69, 0x6A, 0x6B} | set(STRING_REGISTERS) | set(MONITOR_REGISTERS)
PLAIN_RW = {0x08: 0x0000, 0x0D: 0x0000, 0x22: 200, 0x23: 100, 0x24: 50, 0x25: 20, 0x26: 500,
             0x27: 300, 0x28: 0x0000, 0x29: 0x0000, 0x2A: 0x0D0F, 0x33: 0x0004}
"""Registers stored as written (GenCfg, IOCap, thresholds, triggers, MCB) with power-on values."""
TUNING = {0x30, 0x31, 0x32, 0x34, 0x35, 0x36, 0x62, 0x65, 0x66, 0x67}
IMPLEMENTED = ({0x00, 0x0B, 0x20, 0x21} | READ_ONLY | set(PLAIN_RW) | TUNING)
CIE_REGISTERS = {0x34, 0x35, 0x36, 0x66, 0x67}
"""FCF1/2/3 and GRID/GRID2: refused with CIE while the output is on."""
