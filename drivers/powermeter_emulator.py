"""Emulated Keysight N7744A/N7745A multiport optical power meter, served as SCPI over TCP.

The emulator speaks the SCPI subset the `powermeter` driver uses (research/devices.md §4):
calibration wavelength, unit, averaging time, auto range, loss correction, FETCh/READ,
INITiate, TRIGger and the logging function whose result is an IEEE-488.2 definite-length block
of little-endian float32 values in W. Readings come from `power_source(channel)`, the optical
power (dBm, None for no light) arriving at that meter port right now, so a wrong WSS route shows
up as a wrong reading. Bad input never raises: it lands on the SCPI error queue (SYST:ERR?).

Reconstructed details (not taken from the programming guide, chosen to be plausible):
- "sensitivity too low" (no light, or below `noise_floor_dbm`) reads +9.91E+37 in dBm mode;
  in W mode the reading is zero-mean noise at the floor level;
- `:SENS:CORR` is an offset in dB added to every reading;
- a setting sent to a channel while it logs stops the logging (samples so far are kept);
- logging samples are taken lazily: when the emulator is next asked, every sample whose time has
  come is drawn from `power_source` at that moment;
- after an error, a query produces no response (IEEE 488.2); the driver reads SYST:ERR?;
- the calibration wavelength and auto range are stored and read back but do not change readings;
  READ? answers at once instead of after one averaging time.

Run stand-alone with ``python -m oddl.drivers.powermeter_emulator --constant-dbm -3``.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from oddl.drivers.emulator_cli import listen_arg, serve_until_signal, start_server
from oddl.drivers.faults import FaultSettings
from oddl.errors import ConfigError

logger = logging.getLogger(__name__)

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
ERROR_QUEUE_SIZE = 30
MAX_LINE_BYTES = 65536
MANUFACTURER = "Keysight Technologies"
FIRMWARE = "1.0.0-emu"

SCPI_ERRORS: dict[int, str] = {
    -101: "Invalid character",
    -104: "Data type error",
    -108: "Parameter not allowed",
    -109: "Missing parameter",
    -113: "Undefined header",
    -114: "Header suffix out of range",
    -131: "Invalid suffix",
    -221: "Settings conflict",
    -222: "Data out of range",
    -223: "Too much data",
    -224: "Illegal parameter value",
    -230: "Data corrupt or stale",
    -300: "Device-specific error",
    -350: "Queue overflow",
}

_TOKEN = re.compile(r"([A-Z]+)(\d*)")
_NUMBER = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:E[+-]?\d+)?)\s*([A-Z]*)")
_LENGTH_UNITS = {"": 1.0, "M": 1.0, "MM": 1e-3, "UM": 1e-6, "NM": 1e-9, "PM": 1e-12}
_TIME_UNITS = {"": 1.0, "S": 1.0, "MS": 1e-3, "US": 1e-6, "NS": 1e-9}
_DB_UNITS = {"": 1.0, "DB": 1.0}
_TRIGGER_INPUTS = {"IGNORE": "IGN", "IGN": "IGN", "SMEASURE": "SME", "SME": "SME",
                   "CMEASURE": "CME", "CME": "CME"}
_TRIGGER_OUTPUTS = {"DISABLED": "DIS", "DIS": "DIS", "AVGOVER": "AVG", "AVG": "AVG",
                    "MEASURE": "MEAS", "MEAS": "MEAS"}
_LOGGING_FUNCTION = "LOGGING_STABILITY"


class _ScpiError(Exception):
    """Raised inside the parser; handle_line turns it into an error-queue entry."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


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
    correction_db: float = 0.0
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
    log_samples: list[float] = field(default_factory=list)


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
class _Node:
    long: str
    short: str
    suffix: bool
    optional: bool


@dataclass(frozen=True)
class _Command:
    nodes: tuple[_Node, ...]
    handler: Callable[[int, list[str], bool], Response | None]
    query: bool
    setting: bool
    stops_logging: bool = False
    channelled: bool = True


def _compile(pattern: str) -> tuple[_Node, ...]:
    """'SENSe#:[CHANnel#]:POWer' -> nodes; '#' takes a numeric suffix, [] is optional."""
    nodes = []
    for part in pattern.split(":"):
        optional = part.startswith("[")
        part = part.strip("[]")
        suffix = part.endswith("#")
        part = part.rstrip("#")
        short = "".join(c for c in part if c.isupper())
        nodes.append(_Node(part.upper(), short, suffix, optional))
    return tuple(nodes)


def _match(nodes: tuple[_Node, ...], tokens: list[tuple[str, int | None]], i: int = 0,
           j: int = 0) -> list[tuple[str, int | None]] | None:
    """Match header tokens against a node pattern; return (node, suffix) pairs or None."""
    if i == len(nodes):
        return [] if j == len(tokens) else None
    node = nodes[i]
    if j < len(tokens):
        mnemonic, suffix = tokens[j]
        if mnemonic in (node.short, node.long) and (suffix is None or node.suffix):
            rest = _match(nodes, tokens, i + 1, j + 1)
            if rest is not None:
                return [(node.long, suffix), *rest]
    if node.optional:
        return _match(nodes, tokens, i + 1, j)
    return None


def _dbm_to_w(dbm: float) -> float:
    return 10.0 ** (dbm / 10.0) * 1e-3


def _nr3(value: float) -> str:
    return f"{value:+.8E}"


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


class PowerMeterEmulator:
    """A stateful N7744A/N7745A twin; thread-safe, one instance shared by all connections."""

    def __init__(self, *, channels: int = 4, power_source: PowerSource | None = None,
                 serial_number: str = "EMU0000001", clock: Callable[[], float] = time.monotonic,
                 seed: int = 0, noise_db: float = 0.01, noise_floor_dbm: float = -80.0,
                 faults: PowerMeterFaults | None = None) -> None:
        if not 1 <= channels <= 8:
            raise ValueError(f"channels={channels}: the N7744A has 4 and the N7745A 8; use 1..8")
        if not (math.isfinite(noise_db) and noise_db >= 0):
            raise ValueError(f"noise_db={noise_db}: use a standard deviation >= 0 dB")
        self.channels = channels
        self.model = "N7745A" if channels > 4 else "N7744A"
        self.serial_number = serial_number
        self.power_source = power_source
        self.noise_db = noise_db
        self.noise_floor_dbm = noise_floor_dbm
        self.faults = faults or PowerMeterFaults()
        self.lines_handled = 0
        self.responses_sent = 0
        self._clock = clock
        self._rng = random.Random(seed)
        self._garbage_rng = random.Random(seed + 1)
        self._lock = threading.RLock()
        self._progress = threading.Condition(self._lock)
        self._errors: list[int] = []
        self._ch: list[_Channel] = []
        self._origin = 0.0
        self.power_cycle()
        self._commands = self._build_commands()

    # ----- public helpers for tests and the integrator -------------------------------------

    def power_cycle(self) -> None:
        """Return to the power-on state: *RST settings, empty error queue, no logging data."""
        with self._lock:
            self._ch = [_Channel() for _ in range(self.channels)]
            self._errors.clear()
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
        """Pulse the electrical trigger input of `channel` (SME: one sample, CME: start)."""
        if not 1 <= channel <= self.channels:
            raise ValueError(f"channel {channel}: this meter has channels 1..{self.channels}")
        with self._lock:
            c = self._ch[channel - 1]
            self._advance_logging(channel)
            if not c.log_running:
                if c.trigger_input == "SME":
                    self._take(channel)
                return
            if c.trigger_input == "SME":
                c.log_samples.append(self._measure(channel).watts)
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

    def process(self, raw: bytes) -> Reply:
        """Handle one received line (no terminator) and apply the configured faults."""
        with self._lock:
            faults = self.faults
            if faults.reset_on_next_line:
                faults.reset_on_next_line = False
                logger.info("powermeter emulator %s: injected reset", self.serial_number)
                self.power_cycle()
                return Reply(None, drop_connection=True)
            text = raw.rstrip(b"\r").decode("ascii", errors="replace")
            response = self.handle_line(text)
            if response is None or faults.no_answer:
                return Reply(None)
            data = response if isinstance(response, bytes) else response.encode("ascii")
            if faults.garbage:
                data = bytes(self._garbage_rng.choice(b"\x00\x07\x1b#,?;:AZaz09\x80\xfe\xff")
                             for _ in range(self._garbage_rng.randint(4, 24)))
            return Reply(data + b"\n", delay_s=faults.answer_delay_s)

    def overlong_line(self) -> None:
        """Record that a client sent more than MAX_LINE_BYTES without a newline."""
        with self._lock:
            self._push_error(-223)

    # ----- SCPI core ------------------------------------------------------------------------

    def handle_line(self, line: str) -> Response | None:
        """Execute one program message (units split by ';'); return the response, if any.

        Text responses are str; a response carrying the logging block is bytes. Errors go to
        the error queue and never raise.
        """
        with self._lock:
            self.lines_handled += 1
            self._progress.notify_all()
            for ch in range(1, self.channels + 1):
                self._advance_logging(ch)
            responses: list[Response] = []
            for unit in line.split(";"):
                if not unit.strip():
                    continue
                try:
                    response = self._execute(unit.strip())
                except _ScpiError as exc:
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
        if len(self._errors) >= ERROR_QUEUE_SIZE:
            self._errors[-1] = -350
        else:
            self._errors.append(code)

    def _execute(self, unit: str) -> Response | None:
        if any(not (" " <= c <= "~" or c == "\t") for c in unit):
            raise _ScpiError(-101)
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
        tokens: list[tuple[str, int | None]] = []
        for part in header.upper().split(":"):
            m = _TOKEN.fullmatch(part)
            if m is None:
                raise _ScpiError(-113)
            tokens.append((m[1], int(m[2]) if m[2] else None))
        for command in self._commands:
            matched = _match(command.nodes, tokens)
            if matched is not None:
                break
        else:
            raise _ScpiError(-113)
        if (query and not command.query) or (not query and not command.setting):
            raise _ScpiError(-113)
        channel = 0
        if command.channelled:
            channel = matched[0][1] if matched[0][1] is not None else 1
            if not 1 <= channel <= self.channels:
                raise _ScpiError(-114)
            if any(name == "CHANNEL" and suffix not in (None, 1) for name, suffix in matched):
                raise _ScpiError(-114)
        if query and params:
            raise _ScpiError(-108)
        logging_before = command.channelled and self._ch[channel - 1].log_running
        response = command.handler(channel, params, query)
        if not query and command.stops_logging and logging_before:
            self._stop_logging(channel)
        return response

    def _common(self, header: str, params: list[str], query: bool) -> Response | None:
        if params:
            raise _ScpiError(-108)
        if header == "*IDN" and query:
            return f"{MANUFACTURER},{self.model},{self.serial_number},{FIRMWARE}"
        if header == "*OPC" and query:
            return "1"
        if header == "*TST" and query:
            return "0"
        if query:
            raise _ScpiError(-113)
        if header == "*RST":
            errors = list(self._errors)
            self.power_cycle()
            self._errors[:] = errors  # *RST leaves the error queue alone
            return None
        if header == "*CLS":
            self._errors.clear()
            return None
        if header in ("*OPC", "*WAI"):
            return None
        raise _ScpiError(-113)

    def _build_commands(self) -> list[_Command]:
        sense = "SENSe#:[CHANnel#]"
        table: list[tuple[str, Callable[[int, list[str], bool], Response | None], str, bool]] = [
            (f"{sense}:POWer:WAVelength", self._wavelength, "qs", True),
            (f"{sense}:POWer:UNIT", self._unit, "qs", True),
            (f"{sense}:POWer:ATIMe", self._averaging, "qs", True),
            (f"{sense}:POWer:RANGe:AUTO", self._auto_range, "qs", True),
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
        commands = [_Command(_compile(p), h, "q" in kind, "s" in kind, stops)
                    for p, h, kind, stops in table]
        commands.append(_Command(_compile("SYSTem:ERRor:[NEXT]"), self._system_error, True,
                                 False, channelled=False))
        commands.append(_Command(_compile("SYSTem:ERRor:COUNt"), self._error_count, True,
                                 False, channelled=False))
        return commands

    # ----- parameter parsing ---------------------------------------------------------------

    @staticmethod
    def _one(params: list[str]) -> str:
        if not params or not params[0]:
            raise _ScpiError(-109)
        if len(params) > 1:
            raise _ScpiError(-108)
        return params[0]

    @staticmethod
    def _number(text: str, units: dict[str, float], lo: float, hi: float,
                default: float) -> float:
        word = text.strip().upper()
        if word in ("MIN", "MINIMUM"):
            return lo
        if word in ("MAX", "MAXIMUM"):
            return hi
        if word in ("DEF", "DEFAULT"):
            return default
        m = _NUMBER.fullmatch(word)
        if m is None:
            raise _ScpiError(-104)
        if m[2] not in units:
            raise _ScpiError(-131)
        value = float(m[1]) * units[m[2]]
        if not (math.isfinite(value) and lo * (1 - 1e-9) <= value <= hi * (1 + 1e-9)):
            raise _ScpiError(-222)
        return min(max(value, lo), hi)

    @staticmethod
    def _boolean(text: str) -> bool:
        word = text.strip().upper()
        if word == "ON":
            return True
        if word == "OFF":
            return False
        try:
            value = float(word)
        except ValueError:
            raise _ScpiError(-224) from None
        if not math.isfinite(value):
            raise _ScpiError(-224)
        return round(value) != 0

    @staticmethod
    def _choice(text: str, choices: dict[str, str]) -> str:
        value = choices.get(text.strip().upper())
        if value is None:
            raise _ScpiError(-224)
        return value

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

    def _format(self, channel: int, sample: _Sample) -> str:
        if self._ch[channel - 1].unit_watt:
            return _nr3(sample.watts)
        return _nr3(TOO_LOW_READING if sample.dbm is None else sample.dbm)

    def _advance_logging(self, channel: int) -> None:
        c = self._ch[channel - 1]
        if not c.log_running or c.trigger_input == "SME" or c.log_start is None:
            return
        elapsed = self._clock() - c.log_start
        due = min(c.log_points, int(elapsed / c.log_averaging_s + 1e-9))
        while len(c.log_samples) < due:
            c.log_samples.append(self._measure(channel).watts)
        if len(c.log_samples) >= c.log_points:
            c.log_running = False

    def _stop_logging(self, channel: int) -> None:
        c = self._ch[channel - 1]
        c.log_running = False
        c.log_function = "NONE"

    # ----- command handlers ----------------------------------------------------------------

    def _wavelength(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return _nr3(c.wavelength_m)
        c.wavelength_m = self._number(self._one(params), _LENGTH_UNITS, *WAVELENGTH_RANGE_M,
                                      1550e-9)
        return None

    def _unit(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return "+1" if c.unit_watt else "+0"
        word = self._one(params).upper()
        choices = {"0": False, "+0": False, "DBM": False, "1": True, "+1": True, "W": True,
                   "WATT": True}
        if word not in choices:
            raise _ScpiError(-224)
        c.unit_watt = choices[word]
        return None

    def _averaging(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return _nr3(c.averaging_s)
        c.averaging_s = self._number(self._one(params), _TIME_UNITS, *AVERAGING_RANGE_S, 0.1)
        c.last_period = None
        return None

    def _auto_range(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return "+1" if c.auto_range else "+0"
        c.auto_range = self._boolean(self._one(params))
        return None

    def _correction(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return _nr3(c.correction_db)
        c.correction_db = self._number(self._one(params), _DB_UNITS, *CORRECTION_RANGE_DB, 0.0)
        return None

    def _log_parameters(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return f"+{c.log_points},{_nr3(c.log_averaging_s)}"
        if len(params) < 2 or not all(params):
            raise _ScpiError(-109)
        if len(params) > 2:
            raise _ScpiError(-108)
        points = self._number(params[0], {"": 1.0}, *LOGGING_POINTS_RANGE, 100)
        averaging = self._number(params[1], _TIME_UNITS, *AVERAGING_RANGE_S, 0.1)
        c.log_points, c.log_averaging_s = round(points), averaging
        return None

    def _function_state(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return f"{c.log_function},{'PROGRESS' if c.log_running else 'COMPLETE'}"
        if len(params) < 2 or not all(params):
            raise _ScpiError(-109)
        if len(params) > 2:
            raise _ScpiError(-108)
        function = self._choice(params[0], {"LOGG": "LOGG", "LOGGING": "LOGG", "NONE": "NONE"})
        action = self._choice(params[1], {"STAR": "STAR", "START": "STAR", "STOP": "STOP"})
        if action == "STOP":
            self._stop_logging(ch)
            return None
        if function == "NONE":
            raise _ScpiError(-224)
        c.log_function = _LOGGING_FUNCTION
        c.log_running = True
        c.log_samples = []
        c.log_start = self._clock() if c.trigger_input == "IGN" else None
        return None

    def _function_result(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if c.log_running:
            raise _ScpiError(-230)
        return ieee_block(struct.pack(f"<{len(c.log_samples)}f", *c.log_samples))

    def _fetch(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        period = int((self._clock() - self._origin) / c.averaging_s)
        if c.last is None or (c.continuous and period != c.last_period):
            self._take(ch)
        assert c.last is not None
        return self._format(ch, c.last)

    def _read(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._format(ch, self._take(ch))

    def _continuous(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return "+1" if c.continuous else "+0"
        c.continuous = self._boolean(self._one(params))
        if not c.continuous and c.last is None:
            self._take(ch)
        return None

    def _initiate(self, ch: int, params: list[str], query: bool) -> Response | None:
        if params:
            raise _ScpiError(-108)
        self._take(ch)
        return None

    def _trigger_input(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return c.trigger_input
        c.trigger_input = self._choice(self._one(params), _TRIGGER_INPUTS)
        return None

    def _trigger_output(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self._ch[ch - 1]
        if query:
            return c.trigger_output
        c.trigger_output = self._choice(self._one(params), _TRIGGER_OUTPUTS)
        return None

    def _system_error(self, ch: int, params: list[str], query: bool) -> Response | None:
        if not self._errors:
            return '0,"No error"'
        code = self._errors.pop(0)
        return f'{code},"{SCPI_ERRORS[code]}"'

    def _error_count(self, ch: int, params: list[str], query: bool) -> Response | None:
        return f"+{len(self._errors)}"


def powermeter_connection_handler(emulator: PowerMeterEmulator) -> Callable[[socket.socket],
                                                                              None]:
    """A TcpEmulatorServer handler: LF (or CR-LF) lines in, LF-terminated responses out."""

    def handle(conn: socket.socket) -> None:
        buf = bytearray()
        discarding = False  # inside an overlong line: drop bytes up to its newline
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return
            buf += chunk
            while (end := buf.find(b"\n")) >= 0:
                raw = bytes(buf[:end])
                del buf[:end + 1]
                if discarding:
                    discarding = False
                    continue
                reply = emulator.process(raw)
                if reply.drop_connection:
                    return
                if reply.data is None:
                    continue
                if reply.delay_s > 0:
                    time.sleep(reply.delay_s)
                conn.sendall(reply.data)
                emulator.note_sent()
            if len(buf) > MAX_LINE_BYTES:
                buf.clear()
                if not discarding:
                    emulator.overlong_line()
                discarding = True

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


def run(args: argparse.Namespace) -> int:
    """Serve one emulated meter; print its VISA resource string once; stop on SIGINT/SIGTERM."""
    source = None if args.constant_dbm is None else constant_source(args.constant_dbm)
    emulator = PowerMeterEmulator(channels=args.channels, power_source=source, seed=args.seed,
                                  noise_db=args.noise_db, serial_number=args.serial)
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
