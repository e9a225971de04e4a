"""OIF-ITLA-MSA frame codec (pure): BIP-4 checksum, request and reply frames, frequency parts.

Every frame is four bytes: byte 0 carries the BIP-4 checksum in bits 7-4; a request has LstRsp
in bit 3 and R/W in bit 0, a reply has CE in bit 3 and the status (OK/XE/AEA/CP) in bits 1-0;
byte 1 is the register; bytes 2-3 are the data, big-endian. Used by the driver
(``oddl.drivers.itla``) and the emulator (``oddl.drivers.emulators.itla``). Rules and sources:
docs/reference/devices/itla.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from oddl.common.errors import ProtocolError

__all__ = [
    "CE_BIT",
    "FRAME_LEN",
    "LSTRSP_BIT",
    "NOP_ERROR_MASK",
    "NOP_MRDY",
    "PENDING_MASK",
    "RESENA_MR",
    "RESENA_SR",
    "Reply",
    "Request",
    "SENA",
    "STATUS_MASK",
    "Status",
    "WRITE_BIT",
    "bip4",
    "checksum_ok",
    "decode_reply",
    "decode_request",
    "encode_reply",
    "encode_request",
    "join_mhz",
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


# --- frequency parts -----------------------------------------------------------------------------

def split_mhz(mhz: int) -> tuple[int, int, int]:
    """Split a frequency in MHz into (THz, 0.1 GHz, MHz) register parts."""
    if mhz < 0:
        raise ValueError(f"frequency {mhz} MHz is negative")
    thz, rest = divmod(mhz, 1_000_000)
    return thz, rest // 100, rest % 100


def join_mhz(thz: int, ghz10: int, mhz: int) -> int:
    """The frequency in MHz of (THz, 0.1 GHz, MHz) register parts (inverse of ``split_mhz``)."""
    return thz * 1_000_000 + ghz10 * 100 + mhz
