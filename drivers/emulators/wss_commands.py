"""The emulated WSS's command set: one function per command, run under the emulator's lock.

``execute(emulator, text, now)`` parses one command line (checksum framing already removed)
and returns the (delay, line) pairs that follow the echo; a refused command raises
``Refused(code, reason)`` and changes nothing. Which error a refusal gets (docs/reference/devices/wss.md):

- ``CER``: unknown command word.
- ``AER``: malformed arguments (missing, extra, not numbers, attenuation with more than one
  decimal, a slice interval written backwards).
- ``RER``: a value out of range (channel outside the plan's numbering, port outside 1..P and
  not 99, attenuation above the maximum and not 99.9, slice outside 1..Smax, CHW width).
- ``VER``: valid values the present state refuses (a channel listed twice, a flexgrid channel
  ``DCC`` has not defined, overlapping ``DCC`` channels, ``DCC`` outside flexgrid mode, an
  unknown start-up state).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Protocol

from oddl.common.config import FixedPlan
from oddl.drivers.interfaces import BLOCKED_DB, BLOCKED_PORT, Route
from oddl.drivers.wss_protocol import WssErrorCode

logger = logging.getLogger(__name__)

__all__ = ["Refused", "SwitchState", "execute"]

_INT = re.compile(r"[0-9]{1,6}")
_ATT = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,8})?")
_COMMAND = re.compile(r"([^ \t]+)(?:[ \t]+(.*))?", re.DOTALL)

Lines = list[tuple[float, str]]


class SwitchState(Protocol):
    """What the commands read and change: the emulated module's plan, arrays and settings.

    ``WssEmulator`` is one; it runs the commands under its lock.
    """

    serial_number: str
    manufacture_date: str
    firmware: str
    hardware: str
    ports: int
    max_attenuation_db: float
    max_flex_channels: int
    rra_per_line: int
    settle_s: float
    restart_s: float
    startup_state: str
    factory_plan: FixedPlan
    window_thz: tuple[float, float]
    slices: int
    mode_ghz: float
    """Grid mode: 0 = flexgrid (``DCC`` plan), else the fixed spacing in GHz (``CHW``)."""
    plan: FixedPlan
    flex: dict[int, tuple[int, int]]
    staged: dict[int, Route]
    active: dict[int, Route]
    settle_until: float
    restart_until: float

    def channel_numbers(self) -> list[int]:
        """The channels of the plan in force, ascending."""
        ...

    def reset(self) -> None:
        """Power-cycle: come up in the start-up state."""
        ...


class Refused(Exception):
    """A command the emulated module refuses: becomes one error line."""

    def __init__(self, code: WssErrorCode, reason: str) -> None:
        super().__init__(f"{code.value}: {reason}")
        self.code = code
        self.reason = reason


def execute(emu: SwitchState, text: str, now: float) -> Lines:
    """Run one command line on `emu` at `now`; return the lines after the echo."""
    m = _COMMAND.fullmatch(text.strip(" \t"))
    if m is None:
        raise Refused(WssErrorCode.CER, "no command word")
    word, args = m.group(1), (m.group(2) or "").strip(" \t")
    word = word.upper() if word.isascii() else word
    handler = _COMMANDS.get(word)
    if handler is None:
        raise Refused(WssErrorCode.CER, f"unknown command {word[:20]!r}")
    return handler(emu, args, now)


def _no_args(args: str, word: str) -> None:
    if args:
        raise Refused(WssErrorCode.AER, f"{word} takes no arguments")


def _query(value: Callable[[SwitchState], str], word: str) -> Callable[..., Lines]:
    def run(emu: SwitchState, args: str, now: float) -> Lines:
        _no_args(args, word)
        return [(0.0, value(emu)), (0.0, "OK")]
    return run


def _rra(emu: SwitchState, args: str, now: float) -> Lines:
    _no_args(args, "RRA?")
    entries = [f"{ch},{r.port},{r.attenuation_db:.1f}" for ch, r in sorted(emu.active.items())]
    n = emu.rra_per_line or max(1, len(entries))
    lines = [";".join(entries[i:i + n]) for i in range(0, len(entries), n)]
    return [(0.0, line) for line in lines] + [(0.0, "OK")]


def _parse_routes(emu: SwitchState, args: str, word: str) -> dict[int, Route]:
    """Parse ``ch,port,att;...``; raise Refused on the first bad entry (atomic)."""
    if not args:
        raise Refused(WssErrorCode.AER, f"{word} needs ch,port,att entries")
    body = args[:-1] if args.endswith(";") else args
    known = set(emu.channel_numbers())
    updates: dict[int, Route] = {}
    for entry in body.split(";"):
        parts = entry.split(",")
        if (len(parts) != 3 or not _INT.fullmatch(parts[0]) or not _INT.fullmatch(parts[1])
                or not _ATT.fullmatch(parts[2])):
            raise Refused(WssErrorCode.AER, f"bad entry {entry[:40]!r}, expected ch,port,att")
        channel, port = int(parts[0]), int(parts[1])
        if emu.mode_ghz == 0:
            if not 1 <= channel <= emu.max_flex_channels:
                raise Refused(WssErrorCode.RER, f"channel {channel} outside 1.."
                                                f"{emu.max_flex_channels}")
            if channel not in known:
                raise Refused(WssErrorCode.VER, f"channel {channel} is not defined (DCC)")
        elif channel not in known:
            raise Refused(WssErrorCode.RER, f"channel {channel} is not in the channel plan")
        if not (1 <= port <= emu.ports or port == BLOCKED_PORT):
            raise Refused(WssErrorCode.RER, f"port {port} outside 1..{emu.ports} or 99")
        att = _attenuation(emu, parts[2])
        if channel in updates:
            raise Refused(WssErrorCode.VER, f"channel {channel} listed twice")
        updates[channel] = Route(port, att)
    return updates


def _attenuation(emu: SwitchState, text: str) -> float:
    try:
        value = Decimal(text)
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        raise Refused(WssErrorCode.AER, f"bad attenuation {text[:20]!r}") from None
    if value == Decimal("99.9"):
        return BLOCKED_DB
    if text.partition(".")[2][1:].strip("0"):
        raise Refused(WssErrorCode.AER, f"attenuation {text[:20]} has more than one decimal")
    if value > Decimal(str(emu.max_attenuation_db)):
        raise Refused(WssErrorCode.RER, f"attenuation {text[:20]} above "
                                        f"{emu.max_attenuation_db:.1f} and not 99.9")
    return float(value)


def _ura(emu: SwitchState, args: str, now: float) -> Lines:
    emu.staged.update(_parse_routes(emu, args, "URA"))
    return [(0.0, "OK")]


def _switch(emu: SwitchState, now: float) -> Lines:
    emu.settle_until = now + emu.settle_s
    logger.debug("WSS emulator: switching, settled at %.6f", emu.settle_until)
    return [(emu.settle_s, "OK")]


def _rsw(emu: SwitchState, args: str, now: float) -> Lines:
    _no_args(args, "RSW")
    emu.active = dict(emu.staged)
    return _switch(emu, now)


def _uca(emu: SwitchState, args: str, now: float) -> Lines:
    """Update the listed channels and switch them at once (no RSW)."""
    updates = _parse_routes(emu, args, "UCA")
    emu.staged.update(updates)
    emu.active = {**emu.active, **updates}
    return _switch(emu, now)


def _dcc(emu: SwitchState, args: str, now: float) -> Lines:
    if args == "?":  # "DCC ?" written with a blank
        return _dcc_query(emu, "", now)
    if emu.mode_ghz != 0:
        raise Refused(WssErrorCode.VER, "DCC needs flexgrid mode (CHW 0)")
    if not args:
        raise Refused(WssErrorCode.AER, "DCC needs ch=first:last entries")
    body = args[:-1] if args.endswith(";") else args
    plan: dict[int, tuple[int, int]] = {}
    for entry in body.split(";"):
        ch_text, _, rng = entry.partition("=")
        first_text, _, last_text = rng.partition(":")
        if not (_INT.fullmatch(ch_text) and _INT.fullmatch(first_text)
                and _INT.fullmatch(last_text)):
            raise Refused(WssErrorCode.AER, f"bad entry {entry[:40]!r}, expected ch=first:last")
        ch, first, last = int(ch_text), int(first_text), int(last_text)
        if not 1 <= ch <= emu.max_flex_channels:
            raise Refused(WssErrorCode.RER, f"channel {ch} outside 1..{emu.max_flex_channels}")
        if not (1 <= first <= emu.slices and 1 <= last <= emu.slices):
            raise Refused(WssErrorCode.RER, f"slices {first}:{last} outside 1..{emu.slices}")
        if first > last:
            raise Refused(WssErrorCode.AER, f"slices {first}:{last} written backwards")
        if ch in plan:
            raise Refused(WssErrorCode.VER, f"channel {ch} defined twice")
        for other, (o0, o1) in plan.items():
            if first <= o1 and o0 <= last:
                raise Refused(WssErrorCode.VER, f"channel {ch} overlaps channel {other}")
        plan[ch] = (first, last)
    old = emu.flex
    emu.flex = plan
    kept = {ch for ch in plan if old.get(ch) == plan[ch]}
    blocked = Route(BLOCKED_PORT, BLOCKED_DB)
    emu.staged = {ch: emu.staged.get(ch, blocked) if ch in kept else blocked for ch in plan}
    emu.active = {ch: emu.active.get(ch, blocked) if ch in kept else blocked for ch in plan}
    return [(0.0, "OK")]


def _dcc_query(emu: SwitchState, args: str, now: float) -> Lines:
    _no_args(args, "DCC?")
    entries = [f"{ch}={s0}:{s1}" for ch, (s0, s1) in sorted(emu.flex.items())]
    return [(0.0, ";".join(entries)), (0.0, "OK")] if entries else [(0.0, "OK")]


def _chw(emu: SwitchState, args: str, now: float) -> Lines:
    if args == "?":
        return _chw_query(emu, "", now)
    if not _INT.fullmatch(args):
        raise Refused(WssErrorCode.AER, "CHW needs a width in GHz: 0 (flexgrid), 50 or 100")
    width = int(args)
    widths = {0, 50, 100, emu.factory_plan.spacing_ghz}
    if width not in widths:
        raise Refused(WssErrorCode.RER, f"channel width {width} GHz not supported")
    if width == emu.mode_ghz:
        return [(0.0, "OK")]
    emu.mode_ghz = width
    emu.flex = {}
    if width:
        emu.plan = _fixed_plan(emu, width)
    emu.staged = {ch: Route(BLOCKED_PORT, BLOCKED_DB) for ch in emu.channel_numbers()}
    emu.active = dict(emu.staged)
    return _switch(emu, now)


def _fixed_plan(emu: SwitchState, width: int) -> FixedPlan:
    """The configured plan for its own spacing; other widths fill the spectral window."""
    p = emu.factory_plan
    if width == p.spacing_ghz:
        return p
    lo, hi = emu.window_thz
    count = max(1, math.floor((hi - lo) * 1000.0 / width + 1e-6))
    return FixedPlan(p.first_channel, lo + width / 2000.0, float(width), count)


def _chw_query(emu: SwitchState, args: str, now: float) -> Lines:
    _no_args(args, "CHW?")
    mode = emu.mode_ghz
    return [(0.0, f"{mode:g}"), (0.0, "OK")]


def _sus(emu: SwitchState, args: str, now: float) -> Lines:
    if args == "?":
        return [(0.0, emu.startup_state), (0.0, "OK")]
    state = args.upper()
    if state not in ("SAB", "SFD", "SLS"):
        raise Refused(WssErrorCode.VER if state.isalpha() else WssErrorCode.AER,
                      "start-up state is SLS, SAB or SFD")
    emu.startup_state = state
    return [(0.0, "OK")]


def _res(emu: SwitchState, args: str, now: float) -> Lines:
    """Restart: OK, then the module is deaf for ``restart_s`` and comes up per SUS."""
    _no_args(args, "RES")
    emu.reset()
    emu.restart_until = now + emu.restart_s
    return [(0.0, "OK")]


_COMMANDS: dict[str, Callable[[SwitchState, str, float], Lines]] = {
    "SNO?": _query(lambda e: e.serial_number, "SNO?"),
    "MFD?": _query(lambda e: e.manufacture_date, "MFD?"),
    "FWR?": _query(lambda e: e.firmware, "FWR?"),
    "HWR?": _query(lambda e: e.hardware, "HWR?"),
    "OSS?": _query(lambda e: "0x0000", "OSS?"),
    "SUS?": lambda e, a, n: _sus(e, "?" if not a else "\0", n),
    "SUS": _sus,
    "RRA?": _rra,
    "URA": _ura,
    "RSW": _rsw,
    "UCA": _uca,
    "DCC": _dcc,
    "DCC?": _dcc_query,
    "CHW": _chw,
    "CHW?": _chw_query,
    "RES": _res,
}
