"""Wire facts of the Finisar / II-VI flexgrid WSS ASCII protocol, shared by driver and emulator.

Sources (cited in docs/reference/devices/wss.md): the vendor command reference as quoted in the
``nerds-ufes/futebol-optical-agent`` sources (Apache-2.0; ``lib/handle_wss.py`` docstrings and
``lib/finisar_serial_adapter.py``), and the bench script ``seanie5011/OSNR_fyp``
``Setup/wss_automation.py``. Only facts are taken from them, no code.

- Lines end in CR (LF optional) towards the module, CR-LF from it. A reply is zero or more
  result lines, then ``OK`` or one error line: ``CER`` (command error), ``AER`` (argument
  error), ``RER`` (range error) or ``VER`` (validation error).
- Optional checksum framing: ``^<text>$<XXXX>`` where XXXX is the 16-bit two's complement of
  the sum of the character codes of <text>, in upper-case hex: ``^OK$FF66``, ``^CHW 0$FECE``.
- Port 99 means "blocked by port", attenuation 99.9 dB "blocked by attenuation".
- Flexgrid slices are 6.25 GHz wide and numbered from 1 upwards from the low edge of the
  module's spectral window; channels are defined over slice ranges with ``DCC``.
"""

from __future__ import annotations

import re
from enum import StrEnum

from oddl.common.config import FixedPlan

__all__ = [
    "ERROR_MEANINGS",
    "FACTORY_PLAN",
    "FACTORY_WINDOW_THZ",
    "SLICE_GHZ",
    "ChecksumError",
    "WssErrorCode",
    "checksum",
    "frame",
    "unframe",
]

SLICE_GHZ = 6.25
"""Width of one flexgrid spectral slice."""

FACTORY_WINDOW_THZ = (191.325, 196.150)
"""Spectral window of the C-band module (the published FUTEBOL adapter's default)."""


class WssErrorCode(StrEnum):
    """The four error replies of the module."""

    CER = "CER"
    AER = "AER"
    RER = "RER"
    VER = "VER"


ERROR_MEANINGS: dict[WssErrorCode, str] = {
    WssErrorCode.CER: "command error",
    WssErrorCode.AER: "argument error",
    WssErrorCode.RER: "range error",
    WssErrorCode.VER: "validation error",
}


class ChecksumError(ValueError):
    """A framed line whose checksum does not match, or a malformed frame."""


def checksum(text: str) -> int:
    """16-bit two's complement of the sum of the character codes of `text`."""
    return (0x10000 - sum(text.encode("latin-1"))) & 0xFFFF


def frame(text: str) -> str:
    """Wrap `text` in the checksum framing: ``^text$XXXX``."""
    return f"^{text}${checksum(text):04X}"


_FRAMED = re.compile(r"\^(.*)\$([0-9A-Fa-f]{4})", re.DOTALL)


def unframe(line: str) -> tuple[str, bool]:
    """Return (text, was_framed); raise ChecksumError for a bad frame or checksum."""
    if not line.startswith("^"):
        return line, False
    m = _FRAMED.fullmatch(line)
    if m is None:
        raise ChecksumError(f"framed line {line[:40]!r} does not end in $XXXX")
    text, got = m.group(1), int(m.group(2), 16)
    if checksum(text) != got:
        raise ChecksumError(f"checksum ${got:04X} of {text[:40]!r} should be "
                            f"${checksum(text):04X}")
    return text, True


FACTORY_PLAN = FixedPlan(first_channel=0, first_thz=191.350, spacing_ghz=50.0, channels=96)
"""Factory 50 GHz plan: channels 0..95 (the manual numbers fixed-grid channels 0..Cmax-1),
centred from 191.350 THz so that the plan fills the factory window."""
