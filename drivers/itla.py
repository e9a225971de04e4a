"""Driver for OIF-ITLA-MSA tunable lasers (01.2 / 01.3 / micro-ITLA) over any byte transport.

Layers, innermost first:

- Frame codec (pure): ``bip4``, ``encode_request``, ``decode_reply``. Every frame is four
  bytes: byte 0 carries the BIP-4 checksum in bits 7-4; a request has LstRsp in bit 3 and R/W
  in bit 0, a reply has CE in bit 3 and the status (OK/XE/AEA/CP) in bits 1-0; byte 1 is the
  register; bytes 2-3 are the data, big-endian.
- Register table: ``REGISTERS`` / ``register(name_or_addr)`` with access, sign and units.
- ``ItlaDriver``: one request/reply exchange at a time under a lock; XE is turned into an
  ``ItlaExecutionError`` carrying the NOP error code (CII, "initialising", is retried for
  ``ItlaTimeouts.startup_s``); corrupt replies are retried with the LstRsp bit (the module
  resends its last reply instead of executing the command again); silence or a shifted frame
  boundary is recovered by single NOP bytes (``resync()``); a module that answers none of them
  is a ``DeviceTimeout``. Timeouts come from ``ItlaTimeouts``. It implements
  ``drivers.interfaces.TunableTransceiver``. Rules and sources: docs/devices/itla.md.

Frequencies are in THz (registers: THz, 0.1 GHz, MHz parts), powers in dBm (registers:
dBm x 100), times in seconds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import IntEnum
from types import TracebackType

from common.errors import DeviceError, DeviceTimeout, ProtocolError, SafetyLimitError
from drivers.interfaces import DeviceIdentity, TransceiverState
from drivers.transport import Transport

logger = logging.getLogger(__name__)

__all__ = [
    "Access",
    "ItlaDriver",
    "ItlaExecutionError",
    "ItlaLimits",
    "ItlaStatus",
    "ItlaTimeouts",
    "NOP_ERRORS",
    "NopError",
    "REGISTERS",
    "Register",
    "Reply",
    "Status",
    "Request",
    "bip4",
    "checksum_ok",
    "decode_reply",
    "decode_request",
    "encode_reply",
    "encode_request",
    "nop_error",
    "register",
    "split_mhz",
]

# --- frame codec ---------------------------------------------------------------------------------

FRAME_LEN = 4
WRITE_BIT = 0x01
"""Request byte 0, bit 0: 1 = write."""
LSTRSP_BIT = 0x08
"""Request byte 0, bit 3: ask the module to resend its last reply (nothing is executed)."""
CE_BIT = 0x08
"""Reply byte 0, bit 3: the module found a bad checksum in the request and did not execute it."""
STATUS_MASK = 0x03

SENA = 0x0008
"""ResEna bit 3: optical output enabled."""
RESENA_SR = 0x0002
"""ResEna bit 1: soft reset."""
RESENA_MR = 0x0001
"""ResEna bit 0: module (hard) reset."""
PENDING_MASK = 0xFF00
"""NOP bits 15-8: one flag per pending operation."""
NOP_MRDY = 0x0010
"""NOP bit 4: module ready."""
NOP_ERROR_MASK = 0x000F


class Status(IntEnum):
    """Reply status field (byte 0, bits 1-0)."""

    OK = 0
    XE = 1
    """Execution error: read NOP for the reason."""
    AEA = 2
    """Automatic extended addressing: the data is a length; read EAR for the bytes."""
    CP = 3
    """Command pending: poll NOP until the pending flags clear."""


def bip4(b0: int, b1: int, b2: int, b3: int) -> int:
    """Return the BIP-4 checksum of a frame, ignoring the checksum nibble of `b0`."""
    bip8 = (b0 & 0x0F) ^ b1 ^ b2 ^ b3
    return ((bip8 >> 4) ^ bip8) & 0x0F


def _with_checksum(b0: int, b1: int, b2: int, b3: int) -> bytes:
    b0 &= 0x0F
    return bytes((b0 | bip4(b0, b1, b2, b3) << 4, b1, b2, b3))


def checksum_ok(frame: bytes) -> bool:
    """True when `frame` is four bytes whose checksum nibble matches its contents."""
    return len(frame) == FRAME_LEN and frame[0] >> 4 == bip4(*frame)


def _data_word(data: int) -> int:
    if not -0x8000 <= data <= 0xFFFF:
        raise ValueError(f"ITLA data {data} does not fit in 16 bits (-32768..65535)")
    return data & 0xFFFF


def encode_request(register: int, data: int = 0, write: bool = False, *,
                   last_response: bool = False) -> bytes:
    """Encode a host-to-module frame; negative `data` is sent as 16-bit two's complement."""
    if not 0 <= register <= 0xFF:
        raise ValueError(f"ITLA register {register} is not a byte (0..255)")
    word = _data_word(data)
    b0 = (WRITE_BIT if write else 0) | (LSTRSP_BIT if last_response else 0)
    return _with_checksum(b0, register, word >> 8, word & 0xFF)


def encode_reply(register: int, data: int = 0, status: Status = Status.OK, *,
                 ce: bool = False) -> bytes:
    """Encode a module-to-host frame (used by the emulator and by protocol tests)."""
    word = _data_word(data)
    b0 = (CE_BIT if ce else 0) | (int(status) & STATUS_MASK)
    return _with_checksum(b0, register & 0xFF, word >> 8, word & 0xFF)


@dataclass(frozen=True)
class Request:
    """A decoded host-to-module frame."""

    register: int
    data: int
    write: bool
    last_response: bool


def decode_request(frame: bytes) -> Request:
    """Decode a request; raise ProtocolError for a wrong length or checksum."""
    if len(frame) != FRAME_LEN:
        raise ProtocolError(f"ITLA request must be 4 bytes, got {len(frame)}")
    if not checksum_ok(frame):
        raise ProtocolError(f"ITLA request {frame.hex(' ')} has a bad checksum")
    return Request(frame[1], frame[2] << 8 | frame[3], bool(frame[0] & WRITE_BIT),
                   bool(frame[0] & LSTRSP_BIT))


@dataclass(frozen=True)
class Reply:
    """A decoded module-to-host frame."""

    status: Status
    ce: bool
    register: int
    data: int
    """Unsigned 16-bit data word."""

    @property
    def signed(self) -> int:
        """The data word read as a signed 16-bit integer."""
        return self.data - 0x10000 if self.data & 0x8000 else self.data


def decode_reply(frame: bytes) -> Reply:
    """Decode a reply; raise ProtocolError for a wrong length or checksum."""
    if len(frame) != FRAME_LEN:
        raise ProtocolError(f"ITLA reply must be 4 bytes, got {len(frame)}")
    if not checksum_ok(frame):
        raise ProtocolError(f"ITLA reply {frame.hex(' ')} has a bad checksum "
                            f"(expected nibble {bip4(*frame):X})")
    return Reply(Status(frame[0] & STATUS_MASK), bool(frame[0] & CE_BIT), frame[1],
                 frame[2] << 8 | frame[3])


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
                          "drivers.itla.REGISTERS or a numeric address")
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
             "wait for the pending operation (ItlaDriver.wait_pending()) and send it again"),
    NopError(0x5, "CII", "ignored while initialising",
             "wait until the module has finished starting up and send it again"),
    NopError(0x6, "ERE", "extended address range error",
             "restart the string read from its register (ItlaDriver.read_string())"),
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


# --- frequency helpers ---------------------------------------------------------------------------

def split_mhz(mhz: int) -> tuple[int, int, int]:
    """Split a frequency in MHz into (THz, 0.1 GHz, MHz) register parts."""
    if mhz < 0:
        raise ValueError(f"frequency {mhz} MHz is negative")
    thz, rest = divmod(mhz, 1_000_000)
    return thz, rest // 100, rest % 100


def _join_mhz(thz: int, ghz10: int, mhz: int) -> int:
    return thz * 1_000_000 + ghz10 * 100 + mhz


# --- driver --------------------------------------------------------------------------------------

class _Silent(Exception):
    """No complete reply came back for one attempt (nothing, or only part of a frame)."""


@dataclass
class ItlaTimeouts:
    """How long the driver waits, in seconds; set them from the device's configuration.

    ``reply_s`` bounds one request/reply exchange (Pure Photonics' code waits 0.25 s);
    ``lock_s`` a channel or fine-tune change with the output on; ``enable_s`` the output enable
    (seconds on real modules: take it from the datasheet); ``startup_s`` how long commands
    refused with CII (module initialising after power-up or reset) are retried. The defaults
    are generous bounds, not device figures.
    """

    reply_s: float = 0.25
    lock_s: float = 5.0
    enable_s: float = 30.0
    startup_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("reply_s", "lock_s", "enable_s", "startup_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"ITLA timeout {name}={value}: expected a number of seconds > 0")


class ItlaDriver:
    """An OIF ITLA laser behind `transport`; implements ``TunableTransceiver``.

    One lock covers each request/reply exchange (and multi-frame sequences such as string
    reads), so the driver can be shared between threads. Used as a context manager, leaving
    the block calls ``shutdown()`` (output off, then close); ``close()`` alone leaves the light
    as it is.

    Link recovery: a reply with a bad checksum is fetched again with the LstRsp bit; a CE reply
    (the module saw a bad checksum) resends the request once. Silence, a partial reply, a
    second CE or replies for the wrong register mean the frame boundary may have slipped (a
    byte lost on the wire): the driver resynchronises the way the MSA and vendors describe, by
    sending single NOP bytes (0x00) until a 4-byte reply comes back, then repeats the request
    (a write is first read back, so a write whose reply was lost is not executed twice).
    """

    def __init__(self, transport: Transport, name: str = "itla", *,
                 timeout_s: float | None = None, retries: int = 2,
                 poll_interval_s: float = 0.01, timeouts: ItlaTimeouts | None = None,
                 recover_link: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.timeouts = replace(timeouts) if timeouts is not None else ItlaTimeouts()
        """This driver's own copy: changing it changes no other driver."""
        if timeout_s is not None:
            self.timeouts = replace(self.timeouts, reply_s=timeout_s)
        self.name = name
        self.retries = retries
        self.recover_link = recover_link
        """False: no resynchronisation, silence is a DeviceTimeout at once (for probing a
        port at several baud rates, where nothing is framed anyway)."""
        self.poll_interval_s = poll_interval_s
        self.tune_history: deque[float] = deque(maxlen=10_000)
        """Measured time-to-lock of each set_channel, seconds (newest last)."""
        self.last_time_to_lock_s: float | None = None
        self.resyncs = 0
        """How many times the link was resynchronised (single NOP bytes)."""
        self._transport = transport
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.RLock()
        self._limits: ItlaLimits | None = None
        self._grid: tuple[int, int] | None = None  # (first channel MHz, spacing MHz)
        self._absent: set[int] = set()  # optional registers this module answered RNI for
        self._closed = False

    @property
    def timeout_s(self) -> float:
        """Reply timeout of one exchange, seconds (``timeouts.reply_s``)."""
        return self.timeouts.reply_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self.timeouts.reply_s = value

    # -- context management --

    def __enter__(self) -> ItlaDriver:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()

    def close(self) -> None:
        """Release the link; the optical state is left as it is."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._transport.close()

    def shutdown(self) -> None:
        """Switch the output off (best effort, failures logged), then close the link."""
        try:
            if not self._closed:
                self.disable_output()
        except DeviceError as exc:
            logger.warning("%s: could not switch the output off on shutdown: %s", self.name, exc)
        finally:
            self.close()

    # -- exchanges --

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise DeviceError("the link is closed; open a new driver", device=self.name)
            yield

    def _transact(self, reg: Register, data: int, write: bool) -> Reply:
        """Send one request and return its reply, recovering the link (no XE handling)."""
        request = encode_request(reg.address, data, write)
        op = f"write {reg.name}={data}" if write else f"read {reg.name}"
        resend = request
        problems: list[str] = []
        ce_seen = False
        for attempt in range(self.retries + 1):
            self._transport.reset_input()
            self._transport.write(resend)
            try:
                reply, problem = self._read_reply(reg.address)
            except _Silent as exc:
                problems.append(str(exc))
                logger.warning("%s: %s attempt %d: %s", self.name, op, attempt + 1, exc)
                if not self.recover_link:
                    raise DeviceTimeout(
                        f"no reply to {op} within {self.timeout_s * 1000:.0f} ms; check the "
                        "cable, the baud rate and that the laser (or its emulator) is powered "
                        "and running", device=self.name) from None
                if not self.resync():
                    raise DeviceTimeout(
                        f"no reply to {op} within {self.timeout_s * 1000:.0f} ms, nor to "
                        f"{FRAME_LEN} single NOP bytes; check the cable, the baud rate and that "
                        "the laser (or its emulator) is powered and running",
                        device=self.name) from None
                if write and (done := self._already_written(reg, data)) is not None:
                    return done
                resend = request
                continue
            if reply is not None:
                if attempt:
                    logger.info("%s: %s recovered after %d retries", self.name, reg.name, attempt)
                return reply
            problems.append(problem)
            logger.warning("%s: %s attempt %d: %s", self.name, op, attempt + 1, problem)
            if problem.startswith("CE") and not ce_seen:
                # The module did not execute the request: send it again as it was.
                ce_seen = True
                resend = request
            elif problem.startswith("CE"):
                # CE again: most likely a byte was lost and the module's frames are shifted.
                if self.recover_link:
                    self.resync()
                    if write and (done := self._already_written(reg, data)) is not None:
                        return done
                resend = request
            else:
                # The module answered but the reply was damaged: ask for that answer again
                # (LstRsp), so a write is never executed twice.
                resend = encode_request(reg.address, data, write, last_response=True)
        if self.recover_link:
            self.resync()  # leave the link framed for the next command
        raise ProtocolError(
            f"{len(problems)} exchanges for {op} failed ({'; '.join(problems)}); check the "
            "baud rate, cable and grounding; a write may or may not have been executed, so "
            "read the register back", device=self.name)

    def resync(self) -> bool:
        """Re-establish framing: send single NOP bytes (0x00), each followed by one reply
        timeout, until a 4-byte reply arrives (at most 4 bytes). True when the module answered.

        Whatever the module had buffered (0-3 bytes of a damaged frame) is completed by these
        bytes, so its next frame starts with the host's next request.
        """
        with self._locked():
            self.resyncs += 1
            for sent in range(1, FRAME_LEN + 1):
                self._transport.reset_input()
                self._transport.write(b"\x00")
                try:
                    raw = self._transport.read_exact(FRAME_LEN, self.timeout_s)
                except DeviceTimeout:
                    continue
                logger.info("%s: link resynchronised after %d NOP byte(s) (reply %s)",
                            self.name, sent, raw.hex(" "))
                return True
            logger.warning("%s: no reply to %d single NOP bytes", self.name, FRAME_LEN)
            return False

    def _already_written(self, reg: Register, data: int) -> Reply | None:
        """After a lost write reply: the reply the write would have had if the register
        already holds `data` (so the write is not sent twice), else None."""
        if reg.address in (0x00, _RESENA.address) or reg.access is Access.RO:
            return None  # NOP and resets cannot be told apart by reading back
        try:
            back = self._transact(reg, 0, False)
        except (ProtocolError, DeviceTimeout):
            return None
        if back.status != Status.OK or back.data != data & 0xFFFF:
            return None
        nop = self._transact(_NOP, 0, False)
        pending = nop.status == Status.CP or bool(nop.data & PENDING_MASK)
        logger.info("%s: %s already holds %d; the write had been executed", self.name,
                    reg.name, data)
        return Reply(Status.CP if pending else Status.OK, False, reg.address, data & 0xFFFF)

    def _read_reply(self, address: int) -> tuple[Reply | None, str]:
        """One attempt: (reply, "") or (None, what was wrong). Raises _Silent when no complete
        reply for this register came back."""
        deadline = time.monotonic() + self.timeout_s
        stale = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise DeviceTimeout("reply timed out", device=self.name)
                raw = self._transport.read_exact(FRAME_LEN, remaining)
            except DeviceTimeout as exc:
                if stale:
                    raise _Silent(f"{stale} reply(ies) for another register, then "
                                  "silence") from exc
                raise _Silent(f"no complete reply within {self.timeout_s * 1000:.0f} "
                              "ms") from exc
            try:
                reply = decode_reply(raw)
            except ProtocolError:
                return None, f"bad checksum in reply {raw.hex(' ')}"
            if reply.ce:
                return None, "CE: the module saw a bad checksum in the request"
            if reply.register == address:
                return reply, ""
            # A reply for another register: most likely a late answer to an earlier request
            # still in the pipe. Skip it and keep reading for ours.
            stale += 1
            logger.warning("%s: skipping reply for register 0x%02X while waiting for 0x%02X",
                           self.name, reply.register, address)
            if stale >= 4:
                raise _Silent(f"{stale} replies echo the wrong register")

    def _exchange(self, reg: Register, data: int = 0, write: bool = False) -> Reply:
        """One exchange; XE becomes ItlaExecutionError with the NOP error code and a remedy.

        CII (the module is still initialising after power-up or a reset) is retried every
        poll interval for up to ``timeouts.startup_s``.
        """
        started: float | None = None
        while True:
            with self._locked():
                reply = self._transact(reg, data, write)
                if reply.status != Status.XE:
                    return reply
                code = self._transact(_NOP, 0, False).data & NOP_ERROR_MASK
            err = nop_error(code)
            now = self._clock()
            started = now if started is None else started
            if err.mnemonic != "CII" or now - started >= self.timeouts.startup_s:
                break
            logger.debug("%s: module initialising (CII); retrying %s", self.name, reg.name)
            self._sleep(self.poll_interval_s)
        op = f"write {reg.name} = {data}" if write else f"read {reg.name}"
        extra = ""
        if err.mnemonic == "CII":
            extra = (f" (still initialising after {self.timeouts.startup_s:.3g} s; raise "
                     "timeouts.startup_s if the module needs longer)")
        raise ItlaExecutionError(f"{op} refused: {err.label} (NOP error {code}); {err.remedy}"
                                 f"{extra}", device=self.name, error=err, register=reg,
                                 write=write, value=data)

    # -- registers --

    def nop(self) -> int:
        """Read NOP: pending flags (15-8), MRDY (4) and the last error code (3-0)."""
        return self._exchange(_NOP).data

    def read_register(self, name_or_addr: str | int) -> int:
        """Read a register; signed registers are returned signed. String registers: read_string."""
        reg = register(name_or_addr)
        reply = self._exchange(reg)
        return reply.signed if reg.signed else reply.data

    def write_register(self, name_or_addr: str | int, value: int, *, wait: bool = True,
                       timeout: float | None = None) -> Status:
        """Write a register; on CP wait (if `wait`, at most `timeout` s, default
        ``timeouts.lock_s``) until the operation is done. Returns the status.

        Read-only registers are refused before anything is sent.
        """
        reg = register(name_or_addr)
        if reg.access is Access.RO:
            raise DeviceError(f"{reg.name} (0x{reg.address:02X}) is read-only; nothing was sent",
                              device=self.name)
        low, high = (-0x8000, 0x7FFF) if reg.signed else (0, 0xFFFF)
        if not low <= value <= high:
            raise ValueError(f"{reg.name} value {value} is outside {low}..{high}")
        reply = self._exchange(reg, value, write=True)
        if reply.status == Status.CP and wait:
            self.wait_pending(timeout)
        return reply.status

    def _read_optional(self, name: str) -> int:
        """Read a register that older modules lack (01.3 MHz parts): RNI reads as 0, and the
        register is not asked for again on this driver."""
        reg = register(name)
        if reg.address in self._absent:
            return 0
        try:
            return self.read_register(reg.address)
        except ItlaExecutionError as exc:
            if exc.error.mnemonic == "RNI":
                self._absent.add(reg.address)
                return 0
            raise

    def _write_optional(self, name: str, value: int) -> None:
        """Write a 01.3 MHz part; a module without the register is fine when the value is 0."""
        try:
            self.write_register(name, value)
        except ItlaExecutionError as exc:
            if exc.error.mnemonic == "RNI" and value == 0:
                return
            raise

    def read_aea(self, name_or_addr: str | int, max_len: int = 256) -> bytes:
        """Read an AEA register (strings, Currents, Temps): read it, then EAR two bytes at a
        time until the announced length (or XE/ERE from a module that stops early)."""
        reg = register(name_or_addr)
        with self._locked():
            reply = self._exchange(reg)
            if reply.status == Status.OK:
                return b""  # a module without AEA data for this register
            if reply.status != Status.AEA:
                raise ProtocolError(f"{reg.name} answered {reply.status.name}, not AEA; it is "
                                    "not an AEA register on this module", device=self.name)
            length = min(reply.data, max_len)
            buf = bytearray()
            while len(buf) < length:
                word = self._transact(_EAR, 0, False)
                if word.status == Status.XE:  # end of data (ERE): some modules stop early
                    self._transact(_NOP, 0, False)
                    break
                buf += word.data.to_bytes(2, "big")
        return bytes(buf[:length])

    def read_string(self, name_or_addr: str | int, max_len: int = 256) -> str:
        """Read a string register through AEA (NUL-terminated ASCII)."""
        raw = self.read_aea(name_or_addr, max_len)
        return raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()

    def _aea_words(self, name: str) -> tuple[int, ...]:
        raw = self.read_aea(name)
        return tuple(int.from_bytes(raw[i:i + 2], "big", signed=True)
                     for i in range(0, len(raw) - 1, 2))

    def temperatures_c(self) -> tuple[float, ...]:
        """Temps (0x58, AEA): module temperatures in degC, in the module's technology order
        (technology 1: laser chip, case)."""
        return tuple(w / 100 for w in self._aea_words("Temps"))

    def currents_ma(self) -> tuple[float, ...]:
        """Currents (0x57, AEA): module currents in mA, in the module's technology order
        (technology 1: TEC, laser diode)."""
        return tuple(w / 10 for w in self._aea_words("Currents"))

    def last_response(self) -> int:
        """LstResp (0x13): the data word of the reply the module sent before this one."""
        return self.read_register("LstResp")

    # -- identity and limits --

    def identify(self) -> DeviceIdentity:
        """Sync with a NOP, then read DevTyp, MFGR, Model, SerNo (and dates/releases if present)."""
        with self._locked():
            self.nop()
            kind = self.read_string("DevTyp")
            mfgr = self.read_string("MFGR")
            model = self.read_string("Model")
            serno = self.read_string("SerNo")
            extra: list[tuple[str, str]] = []
            for name, key in (("MFGDate", "mfg_date"), ("Release", "release"),
                              ("RelBack", "release_backwards")):
                try:
                    extra.append((key, self.read_string(name)))
                except ItlaExecutionError as exc:
                    if exc.error.mnemonic != "RNI":
                        raise
        logger.info("%s: %s %s %s serial %s", self.name, kind, mfgr, model, serno)
        return DeviceIdentity(kind=kind, manufacturer=mfgr, model=model, serial_number=serno,
                              extra=tuple(extra))

    def limits(self, refresh: bool = False) -> ItlaLimits:
        """Read (once, then cached) LFL/LFH, OPSL/OPSH, LGrid and FTFR."""
        if self._limits is not None and not refresh:
            return self._limits
        with self._locked():
            low = _join_mhz(self.read_register("LFL1"), self.read_register("LFL2"),
                            self._read_optional("LFL3"))
            high = _join_mhz(self.read_register("LFH1"), self.read_register("LFH2"),
                             self._read_optional("LFH3"))
            opsl = self.read_register("OPSL") / 100
            opsh = self.read_register("OPSH") / 100
            lgrid_mhz = self.read_register("LGrid") * 100 + self._read_optional("LGrid2")
            ftfr = self._read_optional("FTFR")
        self._limits = ItlaLimits(low / 1e6, high / 1e6, opsl, opsh, lgrid_mhz / 1e3, ftfr)
        return self._limits

    # -- grid and tuning --

    def grid(self, refresh: bool = False) -> tuple[float, float]:
        """(first channel THz, spacing GHz) as set in FCF and GRID (cached after first read)."""
        if self._grid is None or refresh:
            with self._locked():
                fcf = _join_mhz(self.read_register("FCF1"), self.read_register("FCF2"),
                                self._read_optional("FCF3"))
                spacing = self.read_register("GRID") * 100 + self._read_optional("GRID2")
            self._grid = (fcf, spacing)
        return self._grid[0] / 1e6, self._grid[1] / 1e3

    def output_enabled(self) -> bool:
        """True when ResEna has SENA set."""
        return bool(self.read_register("ResEna") & SENA)

    def configure_grid(self, first_thz: float, spacing_ghz: float) -> None:
        """Set the first-channel frequency (THz) and grid spacing (GHz); the output must be off.

        Writes FTF = 0, FCF1/FCF2/FCF3 and GRID/GRID2 (MSA tuning steps 4-5), and clears
        ChannelH so that the next Channel write selects an absolute channel on this grid.
        """
        lim = self.limits()
        fcf = round(first_thz * 1e6)
        spacing = round(spacing_ghz * 1e3)
        if not round(lim.min_thz * 1e6) <= fcf <= round(lim.max_thz * 1e6):
            raise SafetyLimitError(f"{self.name}: first channel {first_thz} THz is outside the "
                                   f"laser's range {lim.min_thz}..{lim.max_thz} THz; nothing "
                                   "was sent")
        if abs(spacing) < round(lim.min_grid_ghz * 1e3) or spacing == 0:
            raise SafetyLimitError(f"{self.name}: grid spacing {spacing_ghz} GHz is below the "
                                   f"laser's minimum {lim.min_grid_ghz} GHz; nothing was sent")
        with self._locked():
            if self.output_enabled():
                raise DeviceError("cannot change the grid while the output is on (the module "
                                  "would answer CIE); call disable_output() first",
                                  device=self.name)
            self._grid = None
            thz, ghz10, mhz = split_mhz(fcf)
            self._write_optional("FTF", 0)
            self.write_register("FCF1", thz)
            self.write_register("FCF2", ghz10)
            self._write_optional("FCF3", mhz)
            coarse = int(math.copysign(abs(spacing) // 100, spacing))
            self.write_register("GRID", coarse)
            self._write_optional("GRID2", spacing - coarse * 100)
            self._write_optional("ChannelH", 0)
            self._grid = (fcf, spacing)
        logger.info("%s: grid %.6f THz + n x %.3f GHz", self.name, fcf / 1e6, spacing / 1e3)

    def channel_frequency_thz(self, channel: int) -> float:
        """Frequency of `channel` on the configured grid: FCF + (channel - 1) x GRID."""
        first, spacing = self.grid()
        return (round(first * 1e6) + (channel - 1) * round(spacing * 1e3)) / 1e6

    def set_channel(self, channel: int, timeout: float | None = None) -> float:
        """Tune to `channel`, wait until the operation is done (and locked, if the output is on),
        and return the measured time-to-lock in seconds (`timeout` default: timeouts.lock_s).

        The sequence is the lean one the MSA allows: the Channel write (CP while the laser
        retunes), NOP polls until the pending flags clear, then one StatusW read for DIS and
        WFREQ; nothing else is read.
        """
        if channel < 1 or channel > 0xFFFFFFFF:
            raise SafetyLimitError(f"{self.name}: channel {channel} is not 1..4294967295; "
                                   "nothing was sent")
        lim = self.limits()
        freq = self.channel_frequency_thz(channel)
        if not lim.min_thz - 1e-9 <= freq <= lim.max_thz + 1e-9:
            raise SafetyLimitError(f"{self.name}: channel {channel} is {freq:.6f} THz, outside "
                                   f"the laser's range {lim.min_thz}..{lim.max_thz} THz; "
                                   "nothing was sent")
        limit = self.timeouts.lock_s if timeout is None else timeout
        with self._locked():
            start = self._clock()
            if channel > 0xFFFF:
                self.write_register("ChannelH", channel >> 16, wait=False)
            status = self.write_register("Channel", channel & 0xFFFF, wait=False)
            self._wait_settled(status, start + limit, f"tuning to channel {channel}")
            elapsed = self._clock() - start
        self.last_time_to_lock_s = elapsed
        self.tune_history.append(elapsed)
        logger.debug("%s: channel %d (%.6f THz) locked in %.1f ms", self.name, channel, freq,
                     elapsed * 1000)
        return elapsed

    def _wait_settled(self, status: Status, deadline: float, what: str) -> None:
        """After a tuning or enable write answered `status`: poll NOP (from one poll interval
        after a CP reply) until nothing is pending, then read StatusW once: DIS means the output is off (fine unless the write answered CP,
        i.e. light was being tuned), WFREQ means not yet on frequency (poll again).
        """
        if status != Status.CP:
            statusw = self.read_register("StatusW")
            if statusw & DIS_BIT:
                return  # output off: the module stored the setting, there is nothing to lock
        else:
            self._sleep(self.poll_interval_s)  # CP: the operation has only just started
        while True:
            self._wait_pending_until(deadline, what)
            statusw = self.read_register("StatusW")
            if statusw & DIS_BIT:
                st = ItlaStatus(0, statusw, 0)
                raise DeviceError(f"output is off after {what} (latched: "
                                  f"{', '.join(st.latched) or 'none'}); the module may have "
                                  "reset (MRL) or shut down on a fatal alarm; read status() and "
                                  "enable the output again", device=self.name)
            if not statusw & FREQ_BIT:
                return
            if self._clock() >= deadline:
                raise DeviceTimeout(f"not locked after {what} (StatusW 0x{statusw:04X}: "
                                    f"{', '.join(ItlaStatus(0, statusw, 0).alarms)}); check the "
                                    "laser's temperature and the target frequency, or allow a "
                                    "longer timeout", device=self.name)
            self._sleep(self.poll_interval_s)

    def wait_pending(self, timeout: float | None = None) -> float:
        """Poll NOP until no operation is pending; return the seconds waited
        (`timeout` default: timeouts.lock_s)."""
        start = self._clock()
        limit = self.timeouts.lock_s if timeout is None else timeout
        self._wait_pending_until(start + limit, "the pending operation")
        return self._clock() - start

    def _wait_pending_until(self, deadline: float, what: str) -> None:
        while True:
            reply = self._exchange(_NOP)
            if reply.status != Status.CP and not reply.data & PENDING_MASK:
                return
            if self._clock() >= deadline:
                raise DeviceTimeout(
                    f"{what} still pending at the deadline (NOP 0x{reply.data:04X}); switch "
                    "the output off (disable_output()) or reset the module, then retry; if "
                    "the module is just slow, raise the timeout (timeouts.lock_s / enable_s)",
                    device=self.name)
            self._sleep(self.poll_interval_s)

    # -- power and output --

    def set_power_dbm(self, dbm: float) -> None:
        """Set the output power set-point in dBm (0.01 dB steps), inside OPSL..OPSH."""
        lim = self.limits()
        if not (math.isfinite(dbm) and lim.min_power_dbm <= dbm <= lim.max_power_dbm):
            raise SafetyLimitError(f"{self.name}: power {dbm} dBm is outside the laser's range "
                                   f"{lim.min_power_dbm}..{lim.max_power_dbm} dBm; nothing was "
                                   "sent")
        self.write_register("PWR", round(dbm * 100))

    def enable_output(self, timeout: float | None = None) -> None:
        """Switch the output on (ResEna = SENA) and wait until it is stable and locked
        (`timeout` default: timeouts.enable_s; cold modules take tens of seconds)."""
        limit = self.timeouts.enable_s if timeout is None else timeout
        with self._locked():
            start = self._clock()
            try:
                self.write_register("ResEna", SENA, wait=False)
            except ItlaExecutionError as exc:
                if exc.error.mnemonic != "CIP":
                    raise
                # already enabling (a resent write after a lost reply): wait for it as well
            # Whatever the write answered, the light must be on, settled and locked after.
            self._wait_settled(Status.CP, start + limit, "enabling the output")
        logger.info("%s: output on", self.name)

    def disable_output(self, timeout: float | None = None) -> None:
        """Switch the output off (ResEna = 0)."""
        self.write_register("ResEna", 0, timeout=timeout)
        logger.info("%s: output off", self.name)

    def clear_latches(self) -> None:
        """Clear the latched status bits (write ones to StatusF/StatusW bits 7-0)."""
        with self._locked():
            self.write_register("StatusF", LATCH_MASK)
            self.write_register("StatusW", LATCH_MASK)

    # -- read-back --

    def frequency_thz(self) -> float:
        """Laser frequency from LF1/LF2/LF3, THz."""
        with self._locked():
            mhz = _join_mhz(self.read_register("LF1"), self.read_register("LF2"),
                            self._read_optional("LF3"))
        return mhz / 1e6

    def power_dbm(self) -> float:
        """Measured output power (OOP), dBm."""
        return self.read_register("OOP") / 100

    def status(self) -> ItlaStatus:
        """Read StatusF, StatusW and NOP."""
        with self._locked():
            f = self.read_register("StatusF")
            w = self.read_register("StatusW")
            n = self.nop()
        return ItlaStatus(f, w, n)

    def channel(self) -> int:
        """Current channel (ChannelH:Channel; ChannelH read as 0 if absent)."""
        with self._locked():
            return self._read_optional("ChannelH") << 16 | self.read_register("Channel")

    def state(self) -> TransceiverState:
        """Read channel, frequency, power, output and lock state back from the device."""
        with self._locked():
            channel = self.channel()
            freq = self.frequency_thz()
            power = self.power_dbm()
            enabled = self.output_enabled()
            statusw = self.read_register("StatusW")
            nop = self.nop()
        # StatusW carries DIS and WFREQ (the tighter frequency threshold); StatusF adds
        # nothing to "locked", so it is not read here (status() reads both).
        locked = enabled and ItlaStatus(0, statusw, nop).locked
        return TransceiverState(channel=channel, frequency_thz=freq, power_dbm=power,
                                output_enabled=enabled, locked=locked)


_NOP = register("NOP")
_EAR = register("EAR")
_RESENA = register("ResEna")
