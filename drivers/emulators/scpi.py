"""SCPI building blocks for instrument emulators: headers, parameters, blocks, lines, status.

What a SCPI instrument does the same way whatever it measures (IEEE 488.2 and SCPI-99):

- headers in long or short form, any case, optional nodes and numeric suffixes
  (`compile_pattern`, `match_header`);
- numeric parameters with optional unit suffixes and whitespace (``1550 nm``, ``0.001 s``,
  ``-20DBM``), MIN/MAX/DEF, booleans (ON/OFF/0/1) and character choices;
- definite-length arbitrary blocks (``#<n><length><bytes>``, `ieee_block`);
- program messages ended by LF, CR or CR-LF (`LineSplitter`);
- the standard event status register, its enable mask and the status byte (`StatusRegisters`).

Bad input raises `ScpiError` with the standard error code; the emulator puts it on its error
queue. Nothing here does I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

SCPI_ERRORS: dict[int, str] = {
    -100: "Command error",
    -101: "Invalid character",
    -104: "Data type error",
    -108: "Parameter not allowed",
    -109: "Missing parameter",
    -113: "Undefined header",
    -114: "Header suffix out of range",
    -131: "Invalid suffix",
    -200: "Execution error",
    -221: "Settings conflict",
    -222: "Data out of range",
    -223: "Too much data",
    -224: "Illegal parameter value",
    -230: "Data corrupt or stale",
    -300: "Device-specific error",
    -350: "Queue overflow",
}
"""Standard SCPI error codes and messages (SCPI-99 vol. 2, chapter 21)."""

NO_ERROR = '+0,"No error"'
"""What SYST:ERR? answers on an empty queue (Keysight signs the code: ``+0``)."""

_TOKEN = re.compile(r"([A-Z]+)(\d*)")
_NUMBER = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:E[+-]?\d+)?)\s*([A-Z]*)")


class ScpiError(Exception):
    """A parse or execution error with its standard SCPI code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def format_error(code: int) -> str:
    """Format one error-queue entry the Keysight way: ``-113,"Undefined header"``."""
    return f'{code:+d},"{SCPI_ERRORS.get(code, "Device-specific error")}"'


# ----- headers -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """One header node: long and short mnemonic, whether it takes a suffix, whether optional."""

    long: str
    short: str
    suffix: bool
    optional: bool


def compile_pattern(pattern: str) -> tuple[Node, ...]:
    """'SENSe#:[CHANnel#]:POWer' -> nodes; '#' takes a numeric suffix, [] is optional."""
    nodes = []
    for part in pattern.split(":"):
        optional = part.startswith("[")
        part = part.strip("[]")
        suffix = part.endswith("#")
        part = part.rstrip("#")
        short = "".join(c for c in part if c.isupper())
        nodes.append(Node(part.upper(), short, suffix, optional))
    return tuple(nodes)


def tokenize_header(header: str) -> list[tuple[str, int | None]]:
    """Split 'SENS1:POW:WAV' into [('SENS', 1), ('POW', None), ...]; ScpiError(-113) if bad."""
    tokens: list[tuple[str, int | None]] = []
    for part in header.upper().split(":"):
        m = _TOKEN.fullmatch(part)
        if m is None:
            raise ScpiError(-113)
        tokens.append((m[1], int(m[2]) if m[2] else None))
    return tokens


def match_header(nodes: tuple[Node, ...], tokens: list[tuple[str, int | None]], i: int = 0,
                 j: int = 0) -> list[tuple[str, int | None]] | None:
    """Match header tokens against a node pattern; return (node, suffix) pairs or None."""
    if i == len(nodes):
        return [] if j == len(tokens) else None
    node = nodes[i]
    if j < len(tokens):
        mnemonic, suffix = tokens[j]
        if mnemonic in (node.short, node.long) and (suffix is None or node.suffix):
            rest = match_header(nodes, tokens, i + 1, j + 1)
            if rest is not None:
                return [(node.long, suffix), *rest]
    if node.optional:
        return match_header(nodes, tokens, i + 1, j)
    return None


# ----- parameters --------------------------------------------------------------------------

LENGTH_UNITS = {"": 1.0, "M": 1.0, "MM": 1e-3, "UM": 1e-6, "NM": 1e-9, "PM": 1e-12}
TIME_UNITS = {"": 1.0, "S": 1.0, "MS": 1e-3, "US": 1e-6, "NS": 1e-9}
DB_UNITS = {"": 1.0, "DB": 1.0}
DBM_UNITS = {"": 1.0, "DBM": 1.0, "DB": 1.0}
PLAIN = {"": 1.0}


def one_parameter(params: list[str]) -> str:
    """The single parameter of a setting: -109 when missing, -108 when there are more."""
    if not params or not params[0]:
        raise ScpiError(-109)
    if len(params) > 1:
        raise ScpiError(-108)
    return params[0]


def parse_number(text: str, units: dict[str, float], lo: float, hi: float,
                 default: float) -> float:
    """A decimal number with an optional unit suffix (space allowed), or MIN/MAX/DEF.

    -104 for text that is not a number, -131 for an unknown suffix, -222 outside lo..hi.
    """
    word = text.strip().upper()
    if word in ("MIN", "MINIMUM"):
        return lo
    if word in ("MAX", "MAXIMUM"):
        return hi
    if word in ("DEF", "DEFAULT"):
        return default
    m = _NUMBER.fullmatch(word)
    if m is None:
        raise ScpiError(-104)
    if m[2] not in units:
        raise ScpiError(-131)
    value = float(m[1]) * units[m[2]]
    if not (math.isfinite(value) and lo - abs(lo) * 1e-9 <= value <= hi + abs(hi) * 1e-9):
        raise ScpiError(-222)
    return min(max(value, lo), hi)


def parse_boolean(text: str) -> bool:
    """ON/OFF or a number (non-zero after rounding is ON); -224 otherwise."""
    word = text.strip().upper()
    if word == "ON":
        return True
    if word == "OFF":
        return False
    try:
        value = float(word)
    except ValueError:
        raise ScpiError(-224) from None
    if not math.isfinite(value):
        raise ScpiError(-224)
    return round(value) != 0


def parse_choice(text: str, choices: dict[str, str]) -> str:
    """Map a character parameter (any case, long or short form) to its canonical value."""
    value = choices.get(text.strip().upper())
    if value is None:
        raise ScpiError(-224)
    return value


def nr1(value: int) -> str:
    """An integer response, signed the Keysight way (``+1``, ``-30``)."""
    return f"{value:+d}"


def nr3(value: float) -> str:
    """A float response in exponent form (``+1.55000000E-06``)."""
    return f"{value:+.8E}"


def boolean(value: bool) -> str:
    """A boolean response: ``+1`` or ``+0``."""
    return "+1" if value else "+0"


# ----- blocks ------------------------------------------------------------------------------

def ieee_block(payload: bytes) -> bytes:
    """Wrap `payload` in an IEEE-488.2 definite-length block header (#<n><length>)."""
    length = str(len(payload))
    return b"#" + str(len(length)).encode() + length.encode() + payload


def parse_ieee_block(data: bytes) -> bytes:
    """Return the payload of a definite-length block; ValueError if `data` is not exactly one."""
    if len(data) < 2 or data[:1] != b"#" or not data[1:2].isdigit() or data[1:2] == b"0":
        raise ValueError(f"not a definite-length block: {data[:12]!r}")
    ndigits = int(data[1:2])
    digits = data[2:2 + ndigits]
    if len(digits) != ndigits or not digits.isdigit():
        raise ValueError(f"bad block length field {digits!r}")
    length = int(digits)
    payload = data[2 + ndigits:]
    if len(payload) != length:
        raise ValueError(f"block announces {length} bytes, carries {len(payload)}")
    return payload


# ----- program messages on a byte stream ----------------------------------------------------

class LineSplitter:
    """Cut a byte stream into program messages ended by LF, CR or CR-LF.

    `feed` returns (line, terminator) pairs; the terminator is the one the client used, so a
    reply can end the same way (a client that writes CR usually reads up to CR). A CR at the
    end of a chunk ends its line at once (a CR client waits for its answer); when the next
    chunk starts with LF, that LF is the rest of a CR-LF and comes out as ``(None, b"\n")``:
    the answer to the previous line, sent ending in CR, must be finished with LF. More than
    `max_bytes` without a terminator calls `on_overlong` once and drops bytes up to the next
    terminator.
    """

    def __init__(self, max_bytes: int, on_overlong: Callable[[], None]) -> None:
        self.max_bytes = max_bytes
        self._on_overlong = on_overlong
        self._buf = bytearray()
        self._after_cr = False
        self._discarding = False

    def feed(self, chunk: bytes) -> list[tuple[bytes | None, bytes]]:
        """Add received bytes; return the complete lines with their terminators."""
        out: list[tuple[bytes | None, bytes]] = []
        data = memoryview(chunk)
        if self._after_cr:
            self._after_cr = False
            if data[:1] == b"\n":
                data = data[1:]
                out.append((None, b"\n"))
        self._buf += data
        while True:
            cut = _first_terminator(self._buf)
            if cut < 0:
                break
            line = bytes(self._buf[:cut])
            if self._buf[cut:cut + 2] == b"\r\n":
                terminator, size = b"\r\n", 2
            elif self._buf[cut:cut + 1] == b"\r":
                terminator, size = b"\r", 1
                if cut + 1 == len(self._buf):
                    self._after_cr = True  # an LF may follow in the next chunk
            else:
                terminator, size = b"\n", 1
            del self._buf[:cut + size]
            if self._discarding:
                self._discarding = False
                continue
            out.append((line, terminator))
        if len(self._buf) > self.max_bytes:
            self._buf.clear()
            if not self._discarding:
                self._on_overlong()
            self._discarding = True
        return out


def _first_terminator(buf: bytearray) -> int:
    cr, lf = buf.find(b"\r"), buf.find(b"\n")
    if cr < 0:
        return lf
    if lf < 0:
        return cr
    return min(cr, lf)


# ----- status reporting (IEEE 488.2 section 11) -----------------------------------------------

ESR_OPC = 0x01
ESR_QUERY_ERROR = 0x04
ESR_DEVICE_ERROR = 0x08
ESR_EXECUTION_ERROR = 0x10
ESR_COMMAND_ERROR = 0x20
STB_ERROR_QUEUE = 0x04
STB_ESB = 0x20
STB_MSS = 0x40


def esr_bit_for(code: int) -> int:
    """The standard event status bit an error code sets (-1xx command, -2xx execution, ...)."""
    if -199 <= code <= -100:
        return ESR_COMMAND_ERROR
    if -299 <= code <= -200:
        return ESR_EXECUTION_ERROR
    if -399 <= code <= -300 or code > 0:
        return ESR_DEVICE_ERROR
    if -499 <= code <= -400:
        return ESR_QUERY_ERROR
    return 0


@dataclass
class StatusRegisters:
    """Standard event status register (*ESR?), its enable (*ESE) and service request (*SRE)."""

    esr: int = 0
    ese: int = 0
    sre: int = 0

    def note_error(self, code: int) -> None:
        """Set the event bit that error `code` belongs to."""
        self.esr |= esr_bit_for(code)

    def read_and_clear_esr(self) -> int:
        """*ESR? reads the register and clears it."""
        value, self.esr = self.esr, 0
        return value

    def status_byte(self, error_queue_not_empty: bool) -> int:
        """*STB?: error-queue bit, event summary (ESR & ESE) and the master summary bit."""
        stb = STB_ERROR_QUEUE if error_queue_not_empty else 0
        if self.esr & self.ese:
            stb |= STB_ESB
        if stb & self.sre & ~STB_MSS:
            stb |= STB_MSS
        return stb
