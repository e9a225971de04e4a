"""Emulated Keysight N7744A/N7745A multiport optical power meter, served as SCPI over TCP.

The emulator speaks the commands of the N774x programming guide that lab clients send
(docs/devices/powermeter.md lists them with their sources): calibration wavelength (one channel
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

Run stand-alone with ``python -m oddl.drivers.powermeter_emulator --constant-dbm -3``.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from oddl.drivers.emulator_cli import listen_arg, serve_until_signal, start_server
from oddl.drivers.faults import FaultSettings
from oddl.drivers.scpi import (
    DB_UNITS,
    DBM_UNITS,
    ESR_OPC,
    LENGTH_UNITS,
    NO_ERROR,
    PLAIN,
    SCPI_ERRORS,
    TIME_UNITS,
    LineSplitter,
    Node,
    ScpiError,
    StatusRegisters,
    boolean,
    compile_pattern,
    format_error,
    ieee_block,
    match_header,
    nr1,
    nr3,
    one_parameter,
    parse_boolean,
    parse_choice,
    parse_ieee_block,
    parse_number,
    tokenize_header,
)
from oddl.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["SCPI_ERRORS", "PowerMeterEmulator", "PowerMeterFaults", "Reply", "ieee_block",
           "parse_ieee_block", "powermeter_connection_handler", "add_arguments", "run"]

PowerSource = Callable[[int], float | None]
"""Optical power in dBm arriving at meter channel `n` right now; None when there is no light."""

Response = str | bytes
"""A response without terminator: text, or bytes when it carries a binary block."""

TOO_LOW_READING = 9.91e37
"""Reading (dBm mode) meaning 'sensitivity too low': no light or below the noise floor."""

WAVELENGTH_RANGE_M = (1250e-9, 1650e-9)
AVERAGING_RANGE_S = (1e-6, 10.0)
LOGGING_POINTS_RANGE = (1, 1_000_000)
CORRECTION_RANGE_DB = (-200.0, 200.0)
POWER_RANGES_DBM = (-30, -20, -10, 0, 10)
"""Manual power ranges of the N774x, 10 dB apart (RANG rounds to the nearest one)."""
REFERENCE_RANGE_DBM = (-200.0, 200.0)
ZERO_LIGHT_LIMIT_DBM = -40.0
"""Zeroing fails (ZERO? answers +1) when more light than this is on the input."""
ERROR_QUEUE_SIZE = 30
MAX_LINE_BYTES = 65536
MANUFACTURER = "Keysight Technologies"
FIRMWARE = "1.0.0-emu"
ALL_BLOCK_UNITS = ("watt", "channel")

_TRIGGER_INPUTS = {"IGNORE": "IGN", "IGN": "IGN", "SMEASURE": "SME", "SME": "SME",
                   "CMEASURE": "CME", "CME": "CME"}
_TRIGGER_OUTPUTS = {"DISABLED": "DIS", "DIS": "DIS", "AVGOVER": "AVG", "AVG": "AVG",
                    "MEASURE": "MEAS", "MEAS": "MEAS"}
_TRIGGER_CONFIGS = {"0": "DIS", "DIS": "DIS", "DISABLED": "DIS", "1": "DEF", "DEF": "DEF",
                    "DEFAULT": "DEF", "2": "PASS", "PASS": "PASS", "PASSTHROUGH": "PASS",
                    "3": "LOOP", "LOOP": "LOOP", "LOOPBACK": "LOOP"}
_TRIGGER_NODES = {"NODEA": "A", "1": "A", "NODEB": "B", "2": "B"}
_LOGGING_FUNCTION = "LOGGING_STABILITY"

Handler = Callable[[int, list[str], bool], Response | None]


@dataclass(frozen=True)
class _Sample:
    dbm: float | None  # None: sensitivity too low
    watts: float


@dataclass
class _Channel:
    """Settings and measurement state of one meter channel (*RST values)."""

    wavelength_m: float = 1550e-9
    unit_watt: bool = False
    averaging_s: float = 0.1
    auto_range: bool = True
    range_dbm: int = 0
    auto_gain: bool = True
    reference_relative: bool = False
    reference_dbm: float = 0.0
    correction_db: float = 0.0
    zero_result: int = 0
    continuous: bool = True
    trigger_input: str = "IGN"
    trigger_output: str = "DIS"
    last: _Sample | None = None
    last_period: int | None = None
    log_points: int = 100
    log_averaging_s: float = 0.1
    log_function: str = "NONE"
    log_running: bool = False
    log_start: float | None = None  # None while a CME logging waits for its trigger
    log_samples: list[float] = field(default_factory=list)  # in the unit at the start


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

    def __post_init__(self) -> None:
        self.validate()


@dataclass(frozen=True)
class Reply:
    """What the connection handler must do with one received line."""

    data: bytes | None
    delay_s: float = 0.0
    drop_connection: bool = False


@dataclass(frozen=True)
class _Command:
    nodes: tuple[Node, ...]
    handler: Handler
    query: bool
    setting: bool
    stops_logging: bool = False
    channelled: bool = True


def _dbm_to_w(dbm: float) -> float:
    return 10.0 ** (dbm / 10.0) * 1e-3


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
        self.power_source = power_source
        self.noise_db = noise_db
        self.noise_floor_dbm = noise_floor_dbm
        self.all_block_unit = all_block_unit
        self.faults = faults or PowerMeterFaults()
        self.lines_handled = 0
        self.responses_sent = 0
        self._clock = clock
        self._wall_clock = wall_clock
        self._time_offset_s = 0.0
        self._rng = random.Random(seed)
        self._garbage_rng = random.Random(seed + 1)
        self._lock = threading.RLock()
        self._progress = threading.Condition(self._lock)
        self._errors: list[int] = []
        self._status = StatusRegisters()
        self._ch: list[_Channel] = []
        self._trigger_config = "DEF"
        self._origin = 0.0
        self._answer_after_s = 0.0  # how long the line being handled takes (READ?)
        self.power_cycle()
        self._commands = self._build_commands()

    # ----- public helpers for tests and the integrator -------------------------------------

    def power_cycle(self) -> None:
        """Return to the power-on state: *RST settings, empty error queue, no logging data."""
        with self._lock:
            self._preset()
            self._errors.clear()
            self._status = StatusRegisters()

    def _preset(self) -> None:
        self._ch = [_Channel() for _ in range(self.channels)]
        self._trigger_config = "DEF"
        self._origin = self._clock()

    def inject(self, **changes: object) -> None:
        """Set fault fields by name (ConfigError for unknown names or bad values)."""
        with self._lock:
            merged: dict[str, object] = {f.name: getattr(self.faults, f.name)
                                         for f in fields(PowerMeterFaults)}
            unknown = sorted(set(changes) - set(merged))
            if unknown:
                raise ConfigError(f"powermeter faults: unknown key(s) {', '.join(unknown)}")
            merged.update(changes)
            self.faults = PowerMeterFaults.from_mapping(merged)

    def trigger(self, channel: int) -> None:
        """Pulse the electrical trigger input of `channel` (SME: one sample, CME: start).

        Ignored while the trigger connectors are disabled (``:TRIG:CONF DIS``).
        """
        if not 1 <= channel <= self.channels:
            raise ValueError(f"channel {channel}: this meter has channels 1..{self.channels}")
        with self._lock:
            if self._trigger_config != "DIS":
                self._input_trigger(channel)

    def _input_trigger(self, channel: int) -> None:
        c = self._ch[channel - 1]
        self._advance_logging(channel)
        if not c.log_running:
            if c.trigger_input == "SME":
                self._take(channel)
            return
        if c.trigger_input == "SME":
            c.log_samples.append(self._value(channel, self._measure(channel)))
            if len(c.log_samples) >= c.log_points:
                c.log_running = False
        elif c.trigger_input == "CME" and c.log_start is None:
            c.log_start = self._clock()

    def error_codes(self) -> list[int]:
        """The codes on the error queue, oldest first, without draining it."""
        with self._lock:
            return list(self._errors)

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
            delay = self._answer_after_s + faults.answer_delay_s
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
            self._answer_after_s = 0.0
            self._progress.notify_all()
            for ch in range(1, self.channels + 1):
                self._advance_logging(ch)
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
        if len(self._errors) >= ERROR_QUEUE_SIZE:
            self._errors[-1] = -350
        else:
            self._errors.append(code)

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
        for command in self._commands:
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
        logging_before = {ch for ch in targets if self._ch[ch - 1].log_running}
        response = command.handler(channel, params, query)
        if not query and command.stops_logging:
            for ch in logging_before:
                self._stop_logging(ch)
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
            "*STB": lambda: nr1(self._status.status_byte(bool(self._errors))),
        }
        if query:
            if header not in queries:
                raise ScpiError(-113)
            return queries[header]()
        if header == "*RST":
            self._preset()  # the error queue and status registers stay
            return None
        if header == "*CLS":
            self._errors.clear()
            self._status.esr = 0
            return None
        if header == "*OPC":
            self._status.esr |= ESR_OPC  # every operation completes before the next line
            return None
        if header == "*WAI":
            return None
        raise ScpiError(-113)

    def _build_commands(self) -> list[_Command]:
        sense = "SENSe#:[CHANnel#]"
        table: list[tuple[str, Handler, str, bool]] = [
            (f"{sense}:POWer:WAVelength", self._wavelength, "qs", True),
            (f"{sense}:POWer:UNIT", self._unit, "qs", True),
            (f"{sense}:POWer:ATIMe", self._averaging, "qs", True),
            (f"{sense}:POWer:RANGe:AUTO", self._auto_range, "qs", True),
            (f"{sense}:POWer:RANGe:[UPPer]", self._range, "qs", True),
            (f"{sense}:POWer:GAIN:AUTO", self._auto_gain, "qs", True),
            (f"{sense}:POWer:REFerence:STATe", self._reference_state, "qs", True),
            (f"{sense}:POWer:REFerence", self._reference, "qs", True),
            (f"{sense}:CORRection:COLLect:ZERO", self._zero, "qs", True),
            (f"{sense}:CORRection:[LOSS]:[INPut]:[MAGNitude]", self._correction, "qs", True),
            (f"{sense}:FUNCtion:PARameter:LOGGing", self._log_parameters, "qs", True),
            (f"{sense}:FUNCtion:STATe", self._function_state, "qs", False),
            (f"{sense}:FUNCtion:RESult", self._function_result, "q", False),
            ("FETCh#:[CHANnel#]:[SCALar]:POWer:[DC]", self._fetch, "q", False),
            ("READ#:[CHANnel#]:[SCALar]:POWer:[DC]", self._read, "q", False),
            ("INITiate#:[CHANnel#]:CONTinuous", self._continuous, "qs", True),
            ("INITiate#:[CHANnel#]:[IMMediate]", self._initiate, "s", False),
            ("TRIGger#:[CHANnel#]:INPut", self._trigger_input, "qs", True),
            ("TRIGger#:[CHANnel#]:OUTPut", self._trigger_output, "qs", True),
        ]
        commands = [_Command(compile_pattern(p), h, "q" in kind, "s" in kind, stops)
                    for p, h, kind, stops in table]
        unchannelled: list[tuple[str, Handler, str, bool]] = [
            ("SENSe#:POWer:WAVelength:ALL", self._wavelength_all, "s", True),
            ("SENSe#:CORRection:COLLect:ZERO:ALL", self._zero_all, "qs", True),
            ("FETCh#:[SCALar]:POWer:ALL", self._fetch_all_block, "q", False),
            ("FETCh#:[SCALar]:POWer:ALL:CSV", self._fetch_all_csv, "q", False),
            ("READ#:[SCALar]:POWer:ALL", self._read_all_block, "q", False),
            ("READ#:[SCALar]:POWer:ALL:CSV", self._read_all_csv, "q", False),
            ("READ#:[SCALar]:POWer:ALL:CONFig", self._all_config, "q", False),
            ("TRIGger#", self._trigger_node, "s", False),
            ("TRIGger:CONFiguration", self._trigger_configuration, "qs", False),
            ("SYSTem:ERRor:[NEXT]", self._system_error, "q", False),
            ("SYSTem:ERRor:COUNt", self._error_count, "q", False),
            ("SYSTem:TIME", self._system_time, "qs", False),
            ("SYSTem:PRESet", self._system_preset, "s", False),
        ]
        commands += [_Command(compile_pattern(p), h, "q" in kind, "s" in kind, stops,
                              channelled=False) for p, h, kind, stops in unchannelled]
        return commands

    # ----- measurement model ---------------------------------------------------------------

    def _measure(self, channel: int) -> _Sample:
        c = self._ch[channel - 1]
        power = self.power_source(channel) if self.power_source is not None else None
        if power is None or not math.isfinite(power) or power < self.noise_floor_dbm:
            return _Sample(None, self._rng.gauss(0.0, _dbm_to_w(self.noise_floor_dbm)))
        dbm = float(power) + c.correction_db
        if self.noise_db > 0:
            dbm += self._rng.gauss(0.0, self.noise_db)
        return _Sample(dbm, _dbm_to_w(dbm))

    def _take(self, channel: int) -> _Sample:
        c = self._ch[channel - 1]
        c.last = self._measure(channel)
        c.last_period = int((self._clock() - self._origin) / c.averaging_s)
        return c.last

    def _value(self, channel: int, sample: _Sample) -> float:
        """A sample in the channel's unit: dB against the reference, W, or dBm."""
        c = self._ch[channel - 1]
        if c.reference_relative:
            return TOO_LOW_READING if sample.dbm is None else sample.dbm - c.reference_dbm
        if c.unit_watt:
            return sample.watts
        return TOO_LOW_READING if sample.dbm is None else sample.dbm

    def _current(self, channel: int) -> _Sample:
        """FETCh: the last measurement (a new one each averaging period in continuous mode)."""
        c = self._ch[channel - 1]
        period = int((self._clock() - self._origin) / c.averaging_s)
        if c.last is None or (c.continuous and period != c.last_period):
            self._take(channel)
        assert c.last is not None
        return c.last

    def _triggered(self, channel: int) -> _Sample:
        """READ: like FETCh when measuring continuously, else a new measurement that takes
        one averaging time (the response is held back that long)."""
        c = self._ch[channel - 1]
        if c.continuous:
            return self._current(channel)
        self._answer_after_s = max(self._answer_after_s, c.averaging_s)
        return self._take(channel)

    def _advance_logging(self, channel: int) -> None:
        c = self._ch[channel - 1]
        if not c.log_running or c.trigger_input == "SME" or c.log_start is None:
            return
        elapsed = self._clock() - c.log_start
        due = min(c.log_points, int(elapsed / c.log_averaging_s + 1e-9))
        while len(c.log_samples) < due:
            c.log_samples.append(self._value(channel, self._measure(channel)))
        if len(c.log_samples) >= c.log_points:
            c.log_running = False

    def _stop_logging(self, channel: int) -> None:
        c = self._ch[channel - 1]
        c.log_running = False
        c.log_function = "NONE"

    # ----- per-channel settings ------------------------------------------------------------

    def _wavelength(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return nr3(c.wavelength_m)
        c.wavelength_m = parse_number(one_parameter(params), LENGTH_UNITS, *WAVELENGTH_RANGE_M,
                                      1550e-9)
        return None

    def _wavelength_all(self, ch: int, params: list[str], query: bool) -> Response | None:
        metres = parse_number(one_parameter(params), LENGTH_UNITS, *WAVELENGTH_RANGE_M, 1550e-9)
        for c in self._ch:
            c.wavelength_m = metres
        return None

    def _unit(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return boolean(c.unit_watt)
        choices = {"0": "DBM", "+0": "DBM", "DBM": "DBM", "1": "W", "+1": "W", "W": "W",
                   "WATT": "W"}
        c.unit_watt = parse_choice(one_parameter(params), choices) == "W"
        return None

    def _averaging(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return nr3(c.averaging_s)
        c.averaging_s = parse_number(one_parameter(params), TIME_UNITS, *AVERAGING_RANGE_S, 0.1)
        c.last_period = None
        return None

    def _auto_range(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return boolean(c.auto_range)
        c.auto_range = parse_boolean(one_parameter(params))
        return None

    def _range(self, ch: int, params: list[str], query: bool) -> Response | None:
        """RANG: the manual range in dBm (nearest 10 dB step); setting it ends auto ranging.
        RANG? is always in dBm; with auto ranging it is the range the last reading needed."""
        c = self._ch[ch - 1]
        if query:
            level = self._current(ch).dbm if c.auto_range else None
            if level is not None:
                return nr3(float(next((r for r in POWER_RANGES_DBM if level <= r),
                                      POWER_RANGES_DBM[-1])))
            return nr3(float(c.range_dbm))
        dbm = parse_number(one_parameter(params), DBM_UNITS, POWER_RANGES_DBM[0] - 5,
                           POWER_RANGES_DBM[-1] + 5, 0.0)
        c.range_dbm = min(POWER_RANGES_DBM, key=lambda r: abs(r - dbm))
        c.auto_range = False
        return None

    def _auto_gain(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return boolean(c.auto_gain)
        c.auto_gain = parse_boolean(one_parameter(params))
        return None

    def _reference_state(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return boolean(c.reference_relative)
        c.reference_relative = parse_boolean(one_parameter(params))
        return None

    def _reference(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return nr3(c.reference_dbm)
        c.reference_dbm = parse_number(one_parameter(params), DBM_UNITS,
                                       *REFERENCE_RANGE_DBM, 0.0)
        return None

    def _zero(self, ch: int, params: list[str], query: bool) -> Response | None:
        """ZERO: measure the electrical offset (needs a dark input); ZERO? 0 = it worked."""
        c = self._ch[ch - 1]
        if query:
            return nr1(c.zero_result)
        if params:
            raise ScpiError(-108)
        sample = self._measure(ch)
        c.zero_result = 0 if sample.dbm is None or sample.dbm < ZERO_LIGHT_LIMIT_DBM else 1
        return None

    def _zero_all(self, ch: int, params: list[str], query: bool) -> Response | None:
        if query:
            return nr1(max(c.zero_result for c in self._ch))
        for n in range(1, self.channels + 1):
            self._zero(n, params, False)
        return None

    def _correction(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return nr3(c.correction_db)
        c.correction_db = parse_number(one_parameter(params), DB_UNITS, *CORRECTION_RANGE_DB,
                                       0.0)
        return None

    # ----- logging ------------------------------------------------------------------------

    def _log_parameters(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return f"{nr1(c.log_points)},{nr3(c.log_averaging_s)}"
        if len(params) < 2 or not all(params):
            raise ScpiError(-109)
        if len(params) > 2:
            raise ScpiError(-108)
        points = parse_number(params[0], PLAIN, *LOGGING_POINTS_RANGE, 100)
        averaging = parse_number(params[1], TIME_UNITS, *AVERAGING_RANGE_S, 0.1)
        c.log_points, c.log_averaging_s = round(points), averaging
        return None

    def _function_state(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return f"{c.log_function},{'PROGRESS' if c.log_running else 'COMPLETE'}"
        if len(params) < 2 or not all(params):
            raise ScpiError(-109)
        if len(params) > 2:
            raise ScpiError(-108)
        function = parse_choice(params[0], {"LOGG": "LOGG", "LOGGING": "LOGG", "NONE": "NONE"})
        action = parse_choice(params[1], {"STAR": "STAR", "START": "STAR", "STOP": "STOP"})
        if action == "STOP":
            self._stop_logging(ch)
            return None
        if function == "NONE":
            raise ScpiError(-224)
        c.log_function = _LOGGING_FUNCTION
        c.log_running = True
        c.log_samples = []
        c.log_start = self._clock() if c.trigger_input == "IGN" else None
        return None

    def _function_result(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if c.log_running:
            raise ScpiError(-230)
        return ieee_block(struct.pack(f"<{len(c.log_samples)}f", *c.log_samples))

    # ----- readings -----------------------------------------------------------------------

    def _fetch(self, ch: int, params: list[str], query: bool) -> Response | None:
        return nr3(self._value(ch, self._current(ch)))

    def _read(self, ch: int, params: list[str], query: bool) -> Response | None:
        return nr3(self._value(ch, self._triggered(ch)))

    def _all(self, take: Callable[[int], _Sample], in_watts: bool) -> list[float]:
        samples = [take(ch) for ch in range(1, self.channels + 1)]
        if in_watts:
            return [s.watts for s in samples]
        return [self._value(ch, s) for ch, s in enumerate(samples, start=1)]

    def _block(self, values: list[float]) -> bytes:
        return ieee_block(struct.pack(f"<{len(values)}f", *values))

    def _fetch_all_block(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._block(self._all(self._current, self.all_block_unit == "watt"))

    def _read_all_block(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._block(self._all(self._triggered, self.all_block_unit == "watt"))

    def _fetch_all_csv(self, ch: int, params: list[str], query: bool) -> Response | None:
        return ",".join(nr3(v) for v in self._all(self._current, False))

    def _read_all_csv(self, ch: int, params: list[str], query: bool) -> Response | None:
        return ",".join(nr3(v) for v in self._all(self._triggered, False))

    def _all_config(self, ch: int, params: list[str], query: bool) -> Response | None:
        """Slot and channel of every value of the ALL blocks: uint16 pairs (slot, 1)."""
        pairs = [v for slot in range(1, self.channels + 1) for v in (slot, 1)]
        return ieee_block(struct.pack(f"<{len(pairs)}H", *pairs))

    def _continuous(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return boolean(c.continuous)
        c.continuous = parse_boolean(one_parameter(params))
        if not c.continuous and c.last is None:
            self._take(ch)
        return None

    def _initiate(self, ch: int, params: list[str], query: bool) -> Response | None:
        if params:
            raise ScpiError(-108)
        self._take(ch)
        return None

    # ----- triggering ---------------------------------------------------------------------

    def _trigger_input(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return c.trigger_input
        c.trigger_input = parse_choice(one_parameter(params), _TRIGGER_INPUTS)
        return None

    def _trigger_output(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return c.trigger_output
        c.trigger_output = parse_choice(one_parameter(params), _TRIGGER_OUTPUTS)
        return None

    def _trigger_node(self, ch: int, params: list[str], query: bool) -> Response | None:
        """:TRIG NODEA is a trigger at the input connector; NODEB one at the output connector,
        which comes back to the input only in loop-back configuration."""
        node = parse_choice(one_parameter(params), _TRIGGER_NODES)
        if self._trigger_config == "DIS":
            return None
        if node == "A" or self._trigger_config == "LOOP":
            for n in range(1, self.channels + 1):
                self._input_trigger(n)
        return None

    def _trigger_configuration(self, ch: int, params: list[str], query: bool) -> Response | None:
        if query:
            return self._trigger_config
        self._trigger_config = parse_choice(one_parameter(params), _TRIGGER_CONFIGS)
        return None

    # ----- system -------------------------------------------------------------------------

    def _system_error(self, ch: int, params: list[str], query: bool) -> Response | None:
        if not self._errors:
            return NO_ERROR
        return format_error(self._errors.pop(0))

    def _error_count(self, ch: int, params: list[str], query: bool) -> Response | None:
        return nr1(len(self._errors))

    def _system_time(self, ch: int, params: list[str], query: bool) -> Response | None:
        now = self._wall_clock() + self._time_offset_s
        if query:
            t = time.localtime(now)
            return f"{nr1(t.tm_hour)},{nr1(t.tm_min)},{nr1(t.tm_sec)}"
        if len(params) != 3 or not all(params):
            raise ScpiError(-109 if len(params) < 3 else -108)
        hour, minute, second = (round(parse_number(p, PLAIN, 0, hi, 0))
                                for p, hi in zip(params, (23, 59, 59), strict=True))
        t = time.localtime(now)
        wanted = time.mktime((t.tm_year, t.tm_mon, t.tm_mday, hour, minute, second,
                              0, 0, t.tm_isdst))
        self._time_offset_s += wanted - math.floor(now)
        return None

    def _system_preset(self, ch: int, params: list[str], query: bool) -> Response | None:
        if params:
            raise ScpiError(-108)
        self._preset()
        return None


def powermeter_connection_handler(emulator: PowerMeterEmulator) -> Callable[[socket.socket],
                                                                              None]:
    """A TcpEmulatorServer handler: lines ended by LF, CR or CR-LF in; each response ends
    with the terminator of its line (binary blocks too)."""

    def handle(conn: socket.socket) -> None:
        lines = LineSplitter(MAX_LINE_BYTES, emulator.overlong_line)
        answered_with_cr = False  # the last line ended in CR and got an answer
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return
            for raw, terminator in lines.feed(chunk):
                if raw is None:  # the LF of a CR-LF split across two reads
                    if answered_with_cr:
                        conn.sendall(b"\n")
                    answered_with_cr = False
                    continue
                reply = emulator.process(raw, terminator)
                answered_with_cr = False
                if reply.drop_connection:
                    return
                if reply.data is None:
                    continue
                if reply.delay_s > 0:
                    time.sleep(reply.delay_s)
                conn.sendall(reply.data)
                emulator.note_sent()
                answered_with_cr = terminator == b"\r"

    return handle


# ----- command line (wired by the integrator as `oddl emulate powermeter`) ----------------

def _channels_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 8:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1..8 (N7744A: 4, N7745A: 8)")
    return value


def _finite_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number")
    return value


def _noise_arg(text: str) -> float:
    value = _finite_arg(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a standard deviation >= 0 dB")
    return value


def constant_source(dbm: float) -> PowerSource:
    """A power source that delivers `dbm` to every channel (a stand-alone meter)."""

    def source(channel: int) -> float | None:
        return dbm

    return source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``oddl emulate powermeter`` options to `parser`."""
    parser.add_argument("--listen", default="127.0.0.1:0", type=listen_arg, metavar="HOST:PORT",
                        help="address to serve on (port 0: any free port)")
    parser.add_argument("--channels", default=4, type=_channels_arg,
                        help="meter channels (default 4, N7744A; 8 reports N7745A)")
    parser.add_argument("--seed", default=0, type=int, help="seed for reading noise and faults")
    parser.add_argument("--constant-dbm", default=None, type=_finite_arg, metavar="DBM",
                        help="every channel reads this power (default: no light)")
    parser.add_argument("--noise-db", default=0.01, type=_noise_arg,
                        help="standard deviation of the reading noise in dB (default 0.01)")
    parser.add_argument("--serial", default="EMU0000001", help="serial number *IDN? reports")
    parser.add_argument("--all-unit", default="watt", choices=ALL_BLOCK_UNITS,
                        help="unit of the :READ/:FETC:POW:ALL? blocks: watt (the programming "
                        "guide, default) or channel (the unit each channel is set to)")


def run(args: argparse.Namespace) -> int:
    """Serve one emulated meter; print its VISA resource string once; stop on SIGINT/SIGTERM."""
    source = None if args.constant_dbm is None else constant_source(args.constant_dbm)
    emulator = PowerMeterEmulator(channels=args.channels, power_source=source, seed=args.seed,
                                  noise_db=args.noise_db, serial_number=args.serial,
                                  all_block_unit=args.all_unit)
    server = start_server(powermeter_connection_handler(emulator), args.listen,
                          "powermeter-emulator")
    resource = f"TCPIP0::{server.address[0]}::{server.address[1]}::SOCKET"
    logger.info("power meter emulator %s serving on %s", args.serial, resource)
    return serve_until_signal(server, lambda s: resource)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m oddl.drivers.powermeter_emulator [options]``."""
    parser = argparse.ArgumentParser(prog="powermeter_emulator",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
