"""The OIF-ITLA-MSA register map, NOP error codes and status words, as data.

``REGISTERS`` / ``register(name_or_addr)`` with access, sign and units; ``NOP_ERRORS`` /
``nop_error(code)`` with a remedy for each; ``ItlaStatus`` decodes StatusF, StatusW and NOP;
``ItlaLimits`` is what a module says it can do. Rules and sources: docs/reference/devices/itla.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from oddl.common.errors import DeviceError
from oddl.drivers.itla_frames import NOP_ERROR_MASK, PENDING_MASK

__all__ = [
    "Access",
    "DIS_BIT",
    "FREQ_BIT",
    "ItlaExecutionError",
    "ItlaLimits",
    "ItlaStatus",
    "LATCH_MASK",
    "NOP_ERRORS",
    "NopError",
    "PWR_BIT",
    "REGISTERS",
    "Register",
    "nop_error",
    "register",
]

# --- registers -----------------------------------------------------------------------------------

class Access(IntEnum):
    """Register access from the host."""

    RO = 0
    RW = 1


@dataclass(frozen=True)
class Register:
    """One register of the MSA table."""

    name: str
    address: int
    access: Access
    signed: bool = False
    units: str = ""
    aea: bool = False
    """Read returns status AEA and a byte count; the bytes come from EAR."""
    description: str = ""


_R, _W = Access.RO, Access.RW

REGISTERS: tuple[Register, ...] = (
    Register("NOP", 0x00, _W, description="pending flags (15-8), MRDY (4), error field (3-0)"),
    Register("DevTyp", 0x01, _R, aea=True, description="device type string"),
    Register("MFGR", 0x02, _R, aea=True, description="manufacturer string"),
    Register("Model", 0x03, _R, aea=True, description="model string"),
    Register("SerNo", 0x04, _R, aea=True, description="serial number string"),
    Register("MFGDate", 0x05, _R, aea=True, description="manufacturing date string"),
    Register("Release", 0x06, _R, aea=True, description="firmware release string"),
    Register("RelBack", 0x07, _R, aea=True, description="backwards-compatible release string"),
    Register("GenCfg", 0x08, _W, description="general module configuration"),
    Register("EAC", 0x09, _R, description="AEA extended address configuration (AEA-EAC)"),
    Register("EA", 0x0A, _R, description="AEA extended address (AEA-EA)"),
    Register("EAR", 0x0B, _W, description="AEA data: two string bytes per read (AEA-EAR)"),
    Register("IOCap", 0x0D, _W, description="interface capabilities, baud rate in bits 7-4"),
    Register("LstResp", 0x13, _R, description="last response"),
    Register("DLConfig", 0x14, _W, description="firmware download configuration"),
    Register("DLStatus", 0x15, _R, description="firmware download status"),
    Register("StatusF", 0x20, _W, description="fatal status; write 1 to clear latches (7-0)"),
    Register("StatusW", 0x21, _W, description="warning status; write 1 to clear latches (7-0)"),
    Register("FPowTh", 0x22, _W, units="dB*100", description="fatal power threshold"),
    Register("WPowTh", 0x23, _W, units="dB*100", description="warning power threshold"),
    Register("FFreqTh", 0x24, _W, units="GHz*10", description="fatal frequency threshold"),
    Register("WFreqTh", 0x25, _W, units="GHz*10", description="warning frequency threshold"),
    Register("FThermTh", 0x26, _W, units="degC*100", description="fatal thermal threshold"),
    Register("WThermTh", 0x27, _W, units="degC*100", description="warning thermal threshold"),
    Register("SRQT", 0x28, _W, description="status bits that assert SRQ"),
    Register("FatalT", 0x29, _W, description="status bits that assert FATAL"),
    Register("ALMT", 0x2A, _W, description="status bits that assert ALM"),
    Register("Channel", 0x30, _W, description="channel number, low word (write tunes)"),
    Register("PWR", 0x31, _W, signed=True, units="dBm*100", description="power set-point"),
    Register("ResEna", 0x32, _W, description="SENA (3) output enable, SR (1), MR (0) resets"),
    Register("MCB", 0x33, _W, description="ADT (1) alarm during tune, SDF (2) shutdown on fatal"),
    Register("GRID", 0x34, _W, signed=True, units="GHz*10", description="grid spacing"),
    Register("FCF1", 0x35, _W, units="THz", description="first channel frequency, THz part"),
    Register("FCF2", 0x36, _W, units="GHz*10", description="first channel frequency, 0.1 GHz"),
    Register("LF1", 0x40, _R, units="THz", description="laser frequency, THz part"),
    Register("LF2", 0x41, _R, units="GHz*10", description="laser frequency, 0.1 GHz part"),
    Register("OOP", 0x42, _R, signed=True, units="dBm*100", description="optical output power"),
    Register("CTemp", 0x43, _R, signed=True, units="degC*100", description="case temperature"),
    Register("FTFR", 0x4F, _R, units="MHz", description="fine-tune frequency range"),
    Register("OPSL", 0x50, _R, signed=True, units="dBm*100", description="lowest power setting"),
    Register("OPSH", 0x51, _R, signed=True, units="dBm*100", description="highest power setting"),
    Register("LFL1", 0x52, _R, units="THz", description="lowest frequency, THz part"),
    Register("LFL2", 0x53, _R, units="GHz*10", description="lowest frequency, 0.1 GHz part"),
    Register("LFH1", 0x54, _R, units="THz", description="highest frequency, THz part"),
    Register("LFH2", 0x55, _R, units="GHz*10", description="highest frequency, 0.1 GHz part"),
    Register("LGrid", 0x56, _R, units="GHz*10", description="smallest grid spacing"),
    Register("Currents", 0x57, _R, aea=True, description="module currents (AEA)"),
    Register("Temps", 0x58, _R, aea=True, description="module temperatures (AEA)"),
    Register("DitherE", 0x59, _W, description="dither enable"),
    Register("DitherR", 0x5A, _W, units="kHz", description="dither rate"),
    Register("DitherF", 0x5B, _W, units="GHz*10", description="dither FM deviation"),
    Register("DitherA", 0x5C, _W, units="%*10", description="dither AM deviation"),
    Register("TBTFL", 0x5D, _W, signed=True, units="degC*100", description="low base temp."),
    Register("TBTFH", 0x5E, _W, signed=True, units="degC*100", description="high base temp."),
    Register("FAgeTh", 0x5F, _W, units="%", description="fatal age threshold"),
    Register("WAgeTh", 0x60, _W, units="%", description="warning age threshold"),
    Register("Age", 0x61, _R, units="%", description="laser age (end of life = 100)"),
    Register("FTF", 0x62, _W, signed=True, units="MHz", description="fine-tune frequency"),
    Register("FFreqTh2", 0x63, _W, units="MHz", description="fatal frequency threshold, MHz"),
    Register("WFreqTh2", 0x64, _W, units="MHz", description="warning frequency threshold, MHz"),
    Register("ChannelH", 0x65, _W, description="channel number, high word"),
    Register("GRID2", 0x66, _W, signed=True, units="MHz", description="grid spacing, MHz part"),
    Register("FCF3", 0x67, _W, units="MHz", description="first channel frequency, MHz part"),
    Register("LF3", 0x68, _R, units="MHz", description="laser frequency, MHz part"),
    Register("LFL3", 0x69, _R, units="MHz", description="lowest frequency, MHz part"),
    Register("LFH3", 0x6A, _R, units="MHz", description="highest frequency, MHz part"),
    Register("LGrid2", 0x6B, _R, units="MHz", description="smallest grid spacing, MHz part"),
)

_BY_NAME = {r.name.lower(): r for r in REGISTERS}
_BY_NAME.update({"aea-eac": _BY_NAME["eac"], "aea-ea": _BY_NAME["ea"],
                 "aea-ear": _BY_NAME["ear"]})
_BY_ADDRESS = {r.address: r for r in REGISTERS}


def register(name_or_addr: str | int) -> Register:
    """Look a register up by name (case-insensitive) or address.

    Unknown addresses (e.g. vendor registers 0x80-0xFE) get an anonymous read-write entry;
    unknown names raise DeviceError naming the fix.
    """
    if isinstance(name_or_addr, int):
        if not 0 <= name_or_addr <= 0xFF:
            raise ValueError(f"ITLA register address {name_or_addr} is not a byte (0..255)")
        return _BY_ADDRESS.get(name_or_addr) or Register(f"0x{name_or_addr:02X}", name_or_addr,
                                                         Access.RW)
    found = _BY_NAME.get(name_or_addr.lower())
    if found is None:
        raise DeviceError(f"unknown ITLA register {name_or_addr!r}; use a name from "
                          "oddl.drivers.itla_registers.REGISTERS or a numeric address")
    return found


# --- NOP error field -----------------------------------------------------------------------------

@dataclass(frozen=True)
class NopError:
    """One value of the NOP error field (bits 3-0)."""

    code: int
    mnemonic: str
    meaning: str
    remedy: str

    @property
    def label(self) -> str:
        """E.g. 'RVE range error'."""
        return f"{self.mnemonic} {self.meaning}"


NOP_ERRORS: dict[int, NopError] = {e.code: e for e in (
    NopError(0x0, "OK", "no error", "nothing to do"),
    NopError(0x1, "RNI", "register not implemented",
             "this module does not have that register; check its datasheet"),
    NopError(0x2, "RNW", "register not writable", "the register is read-only; do not write it"),
    NopError(0x3, "RVE", "range error",
             "choose a value inside the module's limits (ItlaDriver.limits())"),
    NopError(0x4, "CIP", "ignored, operation pending",
             "wait for the pending operation (ItlaLink.wait_pending()) and send it again"),
    NopError(0x5, "CII", "ignored while initialising",
             "wait until the module has finished starting up and send it again"),
    NopError(0x6, "ERE", "extended address range error",
             "restart the string read from its register (ItlaLink.read_string())"),
    NopError(0x7, "ERO", "extended address read-only", "do not write AEA data"),
    NopError(0x8, "EXF", "execution failure",
             "read status() for alarms; retry, and reset or power-cycle the module if it persists"),
    NopError(0x9, "CIE", "ignored while output enabled",
             "switch the output off first (ItlaDriver.disable_output())"),
    NopError(0xA, "IVC", "invalid configuration",
             "check the first-channel frequency, grid and channel against limits()"),
    NopError(0xF, "VSE", "vendor-specific error", "see the module's vendor manual"),
)}


def nop_error(code: int) -> NopError:
    """The NopError for `code` (reserved codes get a generic entry)."""
    return NOP_ERRORS.get(code) or NopError(code, f"E{code:X}", "reserved error code",
                                            "see the module's vendor manual")


class ItlaExecutionError(DeviceError):
    """The module answered XE; `error` is the NOP error field read right after."""

    def __init__(self, message: str, *, device: str, error: NopError, register: Register,
                 write: bool, value: int) -> None:
        super().__init__(message, device=device)
        self.error = error
        self.register = register
        self.write = write
        self.value = value


# --- status decoding -----------------------------------------------------------------------------

_STATUS_BITS = ("PWRL", "THERML", "FREQL", "VSFL", "CRL", "MRL", "CEL", "XEL",
                "PWR", "THERM", "FREQ", "VSF", "DIS", "FATAL", "ALM", "SRQ")
"""StatusF/StatusW bit names from bit 0 up; F/W prefixes are added for bits 0-3 and 8-11."""
DIS_BIT = 1 << 12
FREQ_BIT = 1 << 10
PWR_BIT = 1 << 8
LATCH_MASK = 0x00FF


def _bit_names(word: int, prefix: str, mask: int) -> list[str]:
    names = []
    for bit, name in enumerate(_STATUS_BITS):
        if word & mask & (1 << bit):
            names.append(prefix + name if bit < 4 or 8 <= bit < 12 else name)
    return names


@dataclass(frozen=True)
class ItlaStatus:
    """StatusF, StatusW and NOP decoded."""

    statusf: int
    statusw: int
    nop: int

    @property
    def pending(self) -> bool:
        """An operation (tuning, enabling) is still running."""
        return bool(self.nop & PENDING_MASK)

    @property
    def pending_flags(self) -> int:
        """NOP bits 15-8."""
        return (self.nop & PENDING_MASK) >> 8

    @property
    def error(self) -> NopError:
        """The NOP error field (error of the last command)."""
        return nop_error(self.nop & NOP_ERROR_MASK)

    @property
    def output_disabled(self) -> bool:
        """DIS: the optical output is off."""
        return bool((self.statusf | self.statusw) & DIS_BIT)

    @property
    def frequency_alarm(self) -> bool:
        """FFREQ or WFREQ: the laser is off its target frequency."""
        return bool((self.statusf | self.statusw) & FREQ_BIT)

    @property
    def locked(self) -> bool:
        """Output on, nothing pending, no frequency alarm."""
        return not (self.output_disabled or self.pending or self.frequency_alarm)

    @property
    def fatal(self) -> bool:
        """FATAL asserted."""
        return bool(self.statusf & (1 << 13))

    @property
    def alarms(self) -> tuple[str, ...]:
        """Present conditions (bits 8-15 except DIS), e.g. ('FFREQ', 'WPWR', 'ALM')."""
        mask = 0xFF00 & ~DIS_BIT
        names = _bit_names(self.statusf, "F", mask) + _bit_names(self.statusw, "W", mask)
        return tuple(dict.fromkeys(names))

    @property
    def latched(self) -> tuple[str, ...]:
        """Latched events (bits 0-7), e.g. ('MRL',) after a module reset."""
        names = (_bit_names(self.statusf, "F", LATCH_MASK)
                 + _bit_names(self.statusw, "W", LATCH_MASK))
        return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class ItlaLimits:
    """What the module says it can do (LFL/LFH, OPSL/OPSH, LGrid, FTFR)."""

    min_thz: float
    max_thz: float
    min_power_dbm: float
    max_power_dbm: float
    min_grid_ghz: float
    fine_tune_mhz: int
