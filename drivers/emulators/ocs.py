"""Emulated Polatis-style optical circuit switch, speaking SCPI over TCP like the real unit.

The emulator answers the commands that published lab clients send to a Polatis switch
(docs/reference/devices/ocs.md lists them with their sources): the ``:OXC:SWITch``
connection commands, ``:PMONitor:POWer?``, ``:SYSTem:ERRor?`` and the IEEE 488.2 common
commands (``*IDN?``, ``*OPC?``, ``*OPC``, ``*WAI``, ``*RST``, ``*CLS``, ``*ESR?``, ``*ESE``,
``*SRE``, ``*STB?``, ``*TST?``). Headers in long or short form, any case; several units on a
line separated by ``;``, a unit without a leading colon taking the path of the one before it
(SCPI's compound-command rule). Each answer goes on a line of its own ending in CR-LF.

Bad input never raises: it lands on the error queue (``-222,"Data out of range"``). Making a
connection takes the switching time; ``*OPC?`` and ``*WAI`` wait for it (a reply carries
the time it is due). The switch itself is a ``ocs_model.SwitchModel``; its commands
``ocs_commands.OcsCommands``; this module adds the line loop, the common commands, the status
registers and faults; ``ocs_serve`` the TCP handler and the command line.

Run stand-alone with ``python -m oddl.drivers.emulators.ocs_serve --size 16``.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from oddl.common import lighttable
from oddl.drivers.emulators.faults import LinkFaults
from oddl.drivers.emulators.ocs_commands import OcsCommands, split_parameters
from oddl.drivers.emulators.ocs_model import (
    DARK_DBM,
    DEFAULT_LOSS_DB,
    DEFAULT_SWITCH_S,
    SwitchModel,
)
from oddl.drivers.emulators.scpi import (
    ESR_OPC,
    PLAIN,
    ScpiError,
    StatusRegisters,
    match_header,
    nr1,
    one_parameter,
    parse_number,
    tokenize_header,
)

logger = logging.getLogger(__name__)

__all__ = ["ERROR_QUEUE_SIZE", "Answer", "OcsEmulator", "OcsFaults", "Reply"]

ERROR_QUEUE_SIZE = 30
MANUFACTURER = "Polatis"
FIRMWARE = "0.0.0-emu"
TERMINATOR = b"\r\n"

_T = TypeVar("_T")

Answer = tuple[float, bytes | None]
"""(when it is due on the clock, the bytes to send or None: only wait until then)."""


@dataclass
class OcsFaults(LinkFaults):
    """The link faults of every emulator (lost, late, garbled answers; a controller restart
    with ``reset_next``, which keeps the connections) and a silent misroute.

    ``misroute_next``: the next k switching commands leave their last new connection unmade
    without queueing an error, a failure only a read-back shows.
    """

    LABEL: ClassVar[str] = "ocs"

    misroute_next: int = 0


@dataclass(frozen=True)
class Reply:
    """What the connection handler does with one received line: send each answer when due."""

    answers: tuple[Answer, ...] = ()
    drop_connection: bool = False


class OcsEmulator:
    """An N×N Polatis-style switch; thread-safe, one instance shared by all connections."""

    def __init__(self, size: int = 16, *, switch_s: float = DEFAULT_SWITCH_S,
                 loss_db: float = DEFAULT_LOSS_DB, dark_dbm: float = DARK_DBM,
                 serial_number: str = "EMU00001", model: str | None = None,
                 firmware: str = FIRMWARE, state_file: str | Path | None = None,
                 faults: OcsFaults | None = None, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.switch = SwitchModel(size, switch_s=switch_s, loss_db=loss_db, dark_dbm=dark_dbm,
                                  state_file=state_file, clock=clock)
        self.model = model or f"N-OST-{size}x{size}-LA1-DMHNS"
        self.serial_number = serial_number
        self.firmware = firmware
        self.faults = faults or OcsFaults()
        self.clock = clock
        self.lines_handled = 0
        self._errors: list[int] = []
        self._commands = OcsCommands(self.switch, self._errors, self._push_error)
        self._status = StatusRegisters()
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._notifying = threading.local()
        self.on_change: Callable[[], None] | None = None
        """Called (outside the lock) after a command or call changed where light goes: the
        emulator host's light table (`oddl.common.lighttable.LightPublisher.update`)."""

    # ----- the light through the switch (the emulated data plane reads it) ------------------

    @property
    def loss_db(self) -> float:
        """Insertion loss of one connection."""
        return self.switch.loss_db

    def light_route(self, ingress: int, t: float) -> tuple[int | None, int, str]:
        """Where light entering `ingress` leaves at time `t`: (egress, 0, "") or (None, the
        light table's code, why) while the port has no connection, its connection is being
        made, or a port of it is disabled or failed."""
        with self._lock:
            sw = self.switch
            egress = sw.connections.get(ingress)
            if egress is None:
                return None, lighttable.NOT_CONNECTED, f"ingress {ingress} is not connected"
            down = sorted({ingress, egress} & (sw.disabled | sw.failed))
            if down:
                what = "failed" if down[0] in sw.failed else "disabled"
                return None, lighttable.PORT_DOWN, f"port {down[0]} is {what}"
            if t < sw.settled_at(ingress):
                return None, lighttable.SWITCHING, f"is switching ingress {ingress}"
            return egress, 0, ""

    def transitions(self, now: float) -> list[float]:
        """Future instants at which a connection being made completes."""
        with self._lock:
            return [t for i in self.switch.connections
                    if (t := self.switch.settled_at(i)) > now and math.isfinite(t)]

    def _notify_after(self, fn: Callable[[], _T]) -> _T:
        """Run `fn` (which takes the lock) and call `on_change` if the light changed; once,
        outside the lock, for the outermost call (`process` runs `handle_line`)."""
        if self.on_change is None or getattr(self._notifying, "on", False):
            return fn()
        with self._lock:
            before = self.switch.light_state()
        self._notifying.on = True
        try:
            return fn()
        finally:
            self._notifying.on = False
            with self._lock:
                changed = self.switch.light_state() != before
            if changed and self.on_change is not None:
                self.on_change()

    # ----- helpers for tests and the command line -------------------------------------------

    @property
    def connections(self) -> dict[int, int]:
        """The connection table {ingress: egress}."""
        with self._lock:
            return dict(self.switch.connections)

    def set_input_dbm(self, port: int, dbm: float | None) -> None:
        """Light arriving at ingress `port` (None: dark)."""
        with self._lock:
            if not self.switch.is_ingress(port):
                raise ValueError(f"port {port} is not an ingress port (1..{self.switch.size})")
            if dbm is None:
                self.switch.input_dbm.pop(port, None)
            else:
                self.switch.input_dbm[port] = dbm

    def fail_port(self, port: int, failed: bool = True) -> None:
        """Make `port` fail (it refuses connections with -240, reads F, passes no light) or
        repair it."""
        def change() -> None:
            with self._lock:
                if port not in self.switch.ports:
                    raise ValueError(f"port {port}: this switch has ports "
                                     f"1..{2 * self.switch.size}")
                (self.switch.failed.add if failed else self.switch.failed.discard)(port)
        self._notify_after(change)

    def inject(self, **changes: object) -> None:
        """Set fault fields by name (ConfigError for unknown names or bad values)."""
        with self._lock:
            self.faults = self.faults.merged(changes)

    def error_codes(self) -> list[int]:
        """The codes on the error queue, oldest first, without draining it."""
        with self._lock:
            return list(self._errors)

    def restart_controller(self) -> None:
        """The switch's controller restarts: error queue and status cleared, the connections
        kept (the optics hold)."""
        with self._lock:
            self._errors.clear()
            self._status = StatusRegisters()
            self.switch.busy_until = self.clock()

    # ----- the line loop ----------------------------------------------------------------------

    def process(self, raw: bytes) -> Reply:
        """Handle one received line (no terminator) with the faults applied."""
        return self._notify_after(lambda: self._process(raw))

    def _process(self, raw: bytes) -> Reply:
        with self._lock:
            faults = self.faults
            if faults.reset_next:
                faults.reset_next = False
                logger.info("ocs emulator %s: injected controller restart", self.serial_number)
                self.restart_controller()
                return Reply(drop_connection=True)
            if faults.drop_answer(self._rng):
                return Reply()
            answers = self.handle_line(raw.decode("ascii", errors="replace"))
            out: list[Answer] = []
            for due, data in answers:
                if data is not None and faults.garble_answer(self._rng):
                    data = bytes(self._rng.choice(b"\x00\x07#,?;:AZaz09\x80\xfe")
                                 for _ in range(self._rng.randint(4, 24))) + TERMINATOR
                out.append((due + faults.late_s, data))
            return Reply(tuple(out))

    def overlong_line(self) -> None:
        """A client sent more than the longest line without a terminator."""
        with self._lock:
            self._push_error(-223)

    def handle_line(self, line: str) -> list[Answer]:
        """Execute one program message (units split by ';'); its answers, each a CR-LF line
        with the time it is due. Errors go to the error queue."""
        return self._notify_after(lambda: self._handle_line(line))

    def _handle_line(self, line: str) -> list[Answer]:
        with self._lock:
            self.lines_handled += 1
            path: list[tuple[str, int | None]] = []
            out: list[Answer] = []
            for unit in line.split(";"):
                if not unit.strip():
                    continue
                try:
                    answer = self._execute(unit.strip(), path)
                except ScpiError as exc:
                    self._push_error(exc.code)
                    continue
                if answer is not None:
                    out.append(answer)
            return out

    def _push_error(self, code: int) -> None:
        self._status.note_error(code)
        if len(self._errors) >= ERROR_QUEUE_SIZE:
            self._errors[-1] = -350
        else:
            self._errors.append(code)

    def _execute(self, unit: str, path: list[tuple[str, int | None]]) -> Answer | None:
        if any(not (" " <= c <= "~" or c == "\t") for c in unit):
            raise ScpiError(-101)
        header, _, rest = unit.replace("\t", " ").partition(" ")
        query = header.endswith("?")
        header = header.removesuffix("?")
        if header.startswith("*"):
            return self._common(header.upper(), rest, query)
        tokens = (tokenize_header(header[1:]) if header.startswith(":")
                  else path + tokenize_header(header))
        for row in self._commands.table:
            if match_header(row.nodes, tokens) is not None:
                break
        else:
            raise ScpiError(-113)
        if row.query != query:
            raise ScpiError(-113)
        path[:] = tokens[:-1]
        before = dict(self.switch.connections)
        text = row.handler(split_parameters(rest))
        if not query:
            self._misroute(before)
            return None
        return self.clock(), (text or "").encode("ascii") + TERMINATOR

    def _misroute(self, before: dict[int, int]) -> None:
        """The injected silent failure: drop the last connection this command made."""
        made = [i for i, e in self.switch.connections.items() if before.get(i) != e]
        if made and self.faults.misroute_next > 0:
            self.faults.misroute_next -= 1
            del self.switch.connections[made[-1]]
            self.switch.save()
            logger.info("ocs emulator: injected misroute, ingress %d left unconnected", made[-1])

    def _common(self, header: str, rest: str, query: bool) -> Answer | None:
        """IEEE 488.2 common commands."""
        params = split_parameters(rest)
        if header in ("*ESE", "*SRE") and not query:
            mask = round(parse_number(one_parameter(params), PLAIN, 0, 255, 0))
            setattr(self._status, header[1:].lower(), mask)
            return None
        if params:
            raise ScpiError(-108)
        now = self.clock()
        busy = max(now, self.switch.busy_until)
        answers: dict[str, Callable[[], str]] = {
            "*IDN": lambda: f"{MANUFACTURER},{self.model},{self.serial_number},{self.firmware}",
            "*TST": lambda: "0",
            "*ESR": lambda: nr1(self._status.read_and_clear_esr()),
            "*ESE": lambda: nr1(self._status.ese),
            "*SRE": lambda: nr1(self._status.sre),
            "*STB": lambda: nr1(self._status.status_byte(bool(self._errors))),
        }
        if query:
            if header == "*OPC":  # answered once the switching in progress is done
                return busy, b"1" + TERMINATOR
            if header not in answers:
                raise ScpiError(-113)
            return now, answers[header]().encode("ascii") + TERMINATOR
        if header == "*WAI":
            return busy, None
        if header == "*OPC":
            self._status.esr |= ESR_OPC
        elif header == "*RST":
            self.switch.reset()  # error queue and status registers stay (IEEE 488.2)
        elif header == "*CLS":
            self._errors.clear()
            self._status.esr = 0
        else:
            raise ScpiError(-113)
        return None


if __name__ == "__main__":  # the command line is ocs_serve's
    raise SystemExit("the OCS emulator's command is "
                     "`python -m oddl.drivers.emulators.ocs_serve`")
