"""The measurement model and SCPI command handlers of the N7744A/N7745A meter emulator.

`MeterModel` is the part of `PowerMeterEmulator` that knows the instrument: per-channel
settings (*RST values), how a reading is taken from the power source and reported in the
channel's unit, the logging function, the ALL queries, triggering and the SYSTem commands.
`powermeter_emulator` adds the SCPI parser loop, the error queue, faults, the TCP handler and
the command line. docs/devices/powermeter.md gives the source of each behaviour.
"""

from __future__ import annotations

import math
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from drivers.emulators.scpi import (
    DB_UNITS,
    DBM_UNITS,
    LENGTH_UNITS,
    NO_ERROR,
    PLAIN,
    TIME_UNITS,
    ScpiError,
    boolean,
    format_error,
    ieee_block,
    nr1,
    nr3,
    one_parameter,
    parse_boolean,
    parse_choice,
    parse_number,
)

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


def _dbm_to_w(dbm: float) -> float:
    return 10.0 ** (dbm / 10.0) * 1e-3

class MeterModel:
    """Channel state, measurements and command handlers; mixed into PowerMeterEmulator.

    Every handler takes (channel, parameters, is_query) and returns the response or None;
    bad input raises ScpiError. The emulator holds its lock around every call.
    """

    channels: int
    power_source: PowerSource | None
    noise_db: float
    noise_floor_dbm: float
    all_block_unit: str
    _ch: list[_Channel]
    _clock: Callable[[], float]
    _wall_clock: Callable[[], float]
    _time_offset_s: float
    _rng: random.Random
    _errors: list[int]
    _trigger_config: str
    _origin: float
    _answer_after_s: float

    def _preset(self) -> None:
        """Every channel and the trigger configuration back to their *RST values."""
        self._ch = [_Channel() for _ in range(self.channels)]
        self._trigger_config = "DEF"
        self._origin = self._clock()

    def _input_trigger(self, channel: int) -> None:
        """A pulse at the input trigger connector, as seen by `channel`."""
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
