"""Emulated Keysight N7744A/N7745A multiport optical power meter, served as SCPI over TCP.

The emulator speaks the commands of the N774x programming guide that lab clients send
(docs/reference/devices/powermeter.md lists them with their sources): calibration wavelength (one channel
or ``:SENS:POW:WAV:ALL``), unit, averaging time, range and auto range, auto gain, relative
reference, loss correction, zeroing, FETCh/READ of one channel or of all (binary block, CSV),
INITiate, TRIGger (per channel, ``:TRIG NODEA|NODEB``, ``:TRIG:CONF``), the logging function
(IEEE-488.2 definite-length block of little-endian float32), SYSTem (ERRor, TIME, PRESet) and
the IEEE 488.2 common commands with the status registers (*ESR?, *STB?, *ESE, *SRE).

Readings come from `power_source(channel)`, the optical power (dBm, None for no light) arriving
at that meter port right now, so a wrong WSS route shows up as a wrong reading. Bad input never
raises: it lands on the SCPI error queue (SYST:ERR?, ``+0,"No error"`` when empty).

Behaviour that follows the guide: results are in the unit the channel is set to (dBm, W, or dB
while the reference state is relative), the logging result included; ``READ?`` on a channel
that does not measure continuously answers after one averaging time (in continuous mode it is
identical to ``FETCh?``); ``:READ:POW:ALL?``/``:FETC:POW:ALL?`` blocks are in W (the guide's
text; ``all_block_unit="channel"`` gives the channel unit, as one published driver reports
seeing). Reconstructed (no source found, chosen to be plausible) and listed in the doc: the
"sensitivity too low" value +9.91E+37 (dBm mode), setting a channel while it logs stops the
logging, zeroing fails when light is on the input, ``:TRIG:CONF?`` and ``SYST:TIME?`` formats.

The emulator owns three collaborators: the instrument itself (channel settings, readings,
logging, the error queue) is a `powermeter_model.MeterModel`; its command handlers and header
table a `powermeter_commands.MeterCommands` over that model; this module adds the SCPI loop,
the status registers and faults; `powermeter_serve` the TCP handler and the command line.

Run stand-alone with ``python -m oddl.drivers.emulators.powermeter_serve --constant-dbm -3``.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from oddl.drivers.emulators.faults import FaultSettings
from oddl.drivers.emulators.powermeter_commands import MeterCommands
from oddl.drivers.emulators.powermeter_model import (
    ALL_BLOCK_UNITS,
    MeterModel,
    PowerSource,
    Response,
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

__all__ = ["ERROR_QUEUE_SIZE", "PowerMeterEmulator", "PowerMeterFaults", "Reply"]

ERROR_QUEUE_SIZE = 30
MANUFACTURER = "Keysight Technologies"
FIRMWARE = "1.0.0-emu"

@dataclass
class PowerMeterFaults(FaultSettings):
    """Transport faults the TCP handler applies; change the fields at any time from a test.

    `no_answer`: commands run but responses are dropped. `answer_delay_s`: every response is
    sent this late. `garbage`: every response is replaced by random bytes (one line).
    `reset_on_next_line`: one-shot; the next line is lost, the meter power-cycles (settings,
    error queue and logging data back to power-on state) and the connection drops.
    """

    no_answer: bool = False
    answer_delay_s: float = 0.0
    garbage: bool = False
    reset_on_next_line: bool = False

    LABEL = "powermeter"


@dataclass(frozen=True)
class Reply:
    """What the connection handler must do with one received line."""

    data: bytes | None
    delay_s: float = 0.0
    drop_connection: bool = False


class PowerMeterEmulator:
    """A stateful N7744A/N7745A twin; thread-safe, one instance shared by all connections."""

    def __init__(self, *, channels: int = 4, power_source: PowerSource | None = None,
                 serial_number: str = "EMU0000001", clock: Callable[[], float] = time.monotonic,
                 seed: int = 0, noise_db: float = 0.01, noise_floor_dbm: float = -80.0,
                 faults: PowerMeterFaults | None = None, all_block_unit: str = "watt",
                 wall_clock: Callable[[], float] = time.time) -> None:
        if not 1 <= channels <= 8:
            raise ValueError(f"channels={channels}: the N7744A has 4 and the N7745A 8; use 1..8")
        if not (math.isfinite(noise_db) and noise_db >= 0):
            raise ValueError(f"noise_db={noise_db}: use a standard deviation >= 0 dB")
        if all_block_unit not in ALL_BLOCK_UNITS:
            raise ValueError(f"all_block_unit={all_block_unit!r}: use 'watt' (the programming "
                             "guide) or 'channel'")
        self.channels = channels
        self.model = "N7745A" if channels > 4 else "N7744A"
        self.serial_number = serial_number
        self.faults = faults or PowerMeterFaults()
        self.lines_handled = 0
        self.responses_sent = 0
        self._meter = MeterModel(channels=channels, power_source=power_source,
                                 noise_db=noise_db, noise_floor_dbm=noise_floor_dbm,
                                 all_block_unit=all_block_unit, clock=clock,
                                 wall_clock=wall_clock, rng=random.Random(seed))
        self._commands = MeterCommands(self._meter)
        self._garbage_rng = random.Random(seed + 1)
        self._lock = threading.RLock()
        self._progress = threading.Condition(self._lock)
        self._status = StatusRegisters()

    # ----- public helpers for tests and the integrator -------------------------------------

    def power_cycle(self) -> None:
        """Return to the power-on state: *RST settings, empty error queue, no logging data."""
        with self._lock:
            self._meter.preset()
            self._meter.errors.clear()
            self._status = StatusRegisters()

    def inject(self, **changes: object) -> None:
        """Set fault fields by name (ConfigError for unknown names or bad values)."""
        with self._lock:
            self.faults = self.faults.merged(changes)

    def trigger(self, channel: int) -> None:
        """Pulse the electrical trigger input of `channel` (SME: one sample, CME: start).

        Ignored while the trigger connectors are disabled (``:TRIG:CONF DIS``).
        """
        if not 1 <= channel <= self.channels:
            raise ValueError(f"channel {channel}: this meter has channels 1..{self.channels}")
        with self._lock:
            if self._meter.trigger_config != "DIS":
                self._meter.input_trigger(channel)

    def error_codes(self) -> list[int]:
        """The codes on the error queue, oldest first, without draining it."""
        with self._lock:
            return list(self._meter.errors)

    def wait_for_lines(self, count: int, timeout: float = 5.0) -> bool:
        """Block until at least `count` lines were handled in total; False on timeout."""
        with self._progress:
            return self._progress.wait_for(lambda: self.lines_handled >= count, timeout)

    def wait_for_responses(self, count: int, timeout: float = 5.0) -> bool:
        """Block until at least `count` responses were sent on the wire; False on timeout."""
        with self._progress:
            return self._progress.wait_for(lambda: self.responses_sent >= count, timeout)

    def note_sent(self) -> None:
        """Count one response written to a connection (called by the handler)."""
        with self._progress:
            self.responses_sent += 1
            self._progress.notify_all()

    # ----- transport-level entry point ------------------------------------------------------

    def process(self, raw: bytes, terminator: bytes = b"\n") -> Reply:
        """Handle one received line (no terminator) and apply the configured faults.

        The response ends with `terminator`, the one the line came with. `delay_s` is when it
        is due: one averaging time for ``READ?`` of a channel not measuring continuously, plus
        any injected delay.
        """
        with self._lock:
            faults = self.faults
            if faults.reset_on_next_line:
                faults.reset_on_next_line = False
                logger.info("powermeter emulator %s: injected reset", self.serial_number)
                self.power_cycle()
                return Reply(None, drop_connection=True)
            text = raw.rstrip(b"\r").decode("ascii", errors="replace")
            response = self.handle_line(text)
            delay = self._meter.answer_after_s + faults.answer_delay_s
            if response is None or faults.no_answer:
                return Reply(None)
            data = response if isinstance(response, bytes) else response.encode("ascii")
            if faults.garbage:
                data = bytes(self._garbage_rng.choice(b"\x00\x07\x1b#,?;:AZaz09\x80\xfe\xff")
                             for _ in range(self._garbage_rng.randint(4, 24)))
            return Reply(data + terminator, delay_s=delay)

    def overlong_line(self) -> None:
        """Record that a client sent more than MAX_LINE_BYTES without a terminator."""
        with self._lock:
            self._push_error(-223)

    # ----- SCPI core ------------------------------------------------------------------------

    def handle_line(self, line: str) -> Response | None:
        """Execute one program message (units split by ';'); return the response, if any.

        Text responses are str; a response carrying a binary block is bytes. Errors go to the
        error queue and never raise.
        """
        with self._lock:
            self.lines_handled += 1
            self._meter.answer_after_s = 0.0
            self._progress.notify_all()
            for ch in range(1, self.channels + 1):
                self._meter.advance_logging(ch)
            responses: list[Response] = []
            for unit in line.split(";"):
                if not unit.strip():
                    continue
                try:
                    response = self._execute(unit.strip())
                except ScpiError as exc:
                    self._push_error(exc.code)
                    continue
                except Exception:  # an emulator bug or a failing power_source must not kill us
                    logger.exception("powermeter emulator: %r failed", unit)
                    self._push_error(-300)
                    continue
                if response is not None:
                    responses.append(response)
            if not responses:
                return None
            if any(isinstance(r, bytes) for r in responses):
                return b";".join(r if isinstance(r, bytes) else r.encode("ascii")
                                 for r in responses)
            return ";".join(r for r in responses if isinstance(r, str))

    def _push_error(self, code: int) -> None:
        self._status.note_error(code)
        if len(self._meter.errors) >= ERROR_QUEUE_SIZE:
            self._meter.errors[-1] = -350
        else:
            self._meter.errors.append(code)

    def _execute(self, unit: str) -> Response | None:
        if any(not (" " <= c <= "~" or c == "\t") for c in unit):
            raise ScpiError(-101)
        header, _, rest = unit.replace("\t", " ").partition(" ")
        rest = rest.strip()
        params = [p.strip() for p in rest.split(",")] if rest else []
        query = header.endswith("?")
        if query:
            header = header[:-1]
        if header.startswith("*"):
            return self._common(header.upper(), params, query)
        if header.startswith(":"):
            header = header[1:]
        tokens = tokenize_header(header)
        for command in self._commands.table:
            matched = match_header(command.nodes, tokens)
            if matched is not None:
                break
        else:
            raise ScpiError(-113)
        if (query and not command.query) or (not query and not command.setting):
            raise ScpiError(-113)
        channel = 0
        if command.channelled:
            channel = matched[0][1] if matched[0][1] is not None else 1
            if not 1 <= channel <= self.channels:
                raise ScpiError(-114)
            if any(name == "CHANNEL" and suffix not in (None, 1) for name, suffix in matched):
                raise ScpiError(-114)
        if query and params:
            raise ScpiError(-108)
        targets = [channel] if command.channelled else range(1, self.channels + 1)
        logging_before = {ch for ch in targets if self._meter.state(ch).log_running}
        response = command.handler(channel, params, query)
        if not query and command.stops_logging:
            for ch in logging_before:
                self._meter.stop_logging(ch)
        return response

    def _common(self, header: str, params: list[str], query: bool) -> Response | None:
        """IEEE 488.2 common commands (*IDN?, *RST, *CLS, *OPC, *ESR?, *STB?, ...)."""
        if header in ("*ESE", "*SRE") and not query:
            mask = round(parse_number(one_parameter(params), PLAIN, 0, 255, 0))
            if header == "*ESE":
                self._status.ese = mask
            else:
                self._status.sre = mask
            return None
        if params:
            raise ScpiError(-108)
        queries: dict[str, Callable[[], str]] = {
            "*IDN": lambda: f"{MANUFACTURER},{self.model},{self.serial_number},{FIRMWARE}",
            "*OPC": lambda: "1",
            "*TST": lambda: "0",
            "*OPT": lambda: "0",
            "*ESR": lambda: nr1(self._status.read_and_clear_esr()),
            "*ESE": lambda: nr1(self._status.ese),
            "*SRE": lambda: nr1(self._status.sre),
            "*STB": lambda: nr1(self._status.status_byte(bool(self._meter.errors))),
        }
        if query:
            if header not in queries:
                raise ScpiError(-113)
            return queries[header]()
        if header == "*RST":
            self._meter.preset()  # the error queue and status registers stay
            return None
        if header == "*CLS":
            self._meter.errors.clear()
            self._status.esr = 0
            return None
        if header == "*OPC":
            self._status.esr |= ESR_OPC  # every operation completes before the next line
            return None
        if header == "*WAI":
            return None
        raise ScpiError(-113)



if __name__ == "__main__":  # the command line is powermeter_serve's
    raise SystemExit("the powermeter emulator's command is `python -m oddl.drivers.emulators.powermeter_serve` "
                     "(or `oddl emulate powermeter`)")
