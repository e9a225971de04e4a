"""The SCPI command handlers of the emulated N7744A/N7745A and the table that routes headers to them.

``MeterCommands`` works on a ``MeterModel`` (the instrument's state and measurements): one handler
per command of the programming guide the emulator speaks: per-channel settings, logging,
readings, triggering and SYSTem. Every handler takes (channel, parameters, is_query) and
returns the response or None; bad input raises ScpiError. ``table`` is the header
table ``PowerMeterEmulator`` matches each program message unit against.
docs/reference/devices/powermeter.md gives the source of each behaviour.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from oddl.drivers.emulators.powermeter_model import (
    AVERAGING_RANGE_S,
    CORRECTION_RANGE_DB,
    LOGGING_POINTS_RANGE,
    POWER_RANGES_DBM,
    REFERENCE_RANGE_DBM,
    WAVELENGTH_RANGE_M,
    ZERO_LIGHT_LIMIT_DBM,
    Handler,
    MeterModel,
    Response,
    Sample,
)
from oddl.drivers.emulators.scpi import (
    DB_UNITS,
    DBM_UNITS,
    LENGTH_UNITS,
    NO_ERROR,
    PLAIN,
    TIME_UNITS,
    Node,
    ScpiError,
    boolean,
    compile_pattern,
    format_error,
    ieee_block,
    nr1,
    nr3,
    one_parameter,
    parse_boolean,
    parse_choice,
    parse_number,
)

__all__ = ["Command", "MeterCommands"]

_TRIGGER_INPUTS = {"IGNORE": "IGN", "IGN": "IGN", "SMEASURE": "SME", "SME": "SME",
                   "CMEASURE": "CME", "CME": "CME"}
_TRIGGER_OUTPUTS = {"DISABLED": "DIS", "DIS": "DIS", "AVGOVER": "AVG", "AVG": "AVG",
                    "MEASURE": "MEAS", "MEAS": "MEAS"}
_TRIGGER_CONFIGS = {"0": "DIS", "DIS": "DIS", "DISABLED": "DIS", "1": "DEF", "DEF": "DEF",
                    "DEFAULT": "DEF", "2": "PASS", "PASS": "PASS", "PASSTHROUGH": "PASS",
                    "3": "LOOP", "LOOP": "LOOP", "LOOPBACK": "LOOP"}
_TRIGGER_NODES = {"NODEA": "A", "1": "A", "NODEB": "B", "2": "B"}
_LOGGING_FUNCTION = "LOGGING_STABILITY"


@dataclass(frozen=True)
class Command:
    """One row of the header table: the pattern, its handler and what it accepts."""

    nodes: tuple[Node, ...]
    handler: Handler
    query: bool
    setting: bool
    stops_logging: bool = False
    channelled: bool = True



def _two_parameters(params: list[str]) -> tuple[str, str]:
    """Exactly two non-empty parameters (-109 missing, -108 too many)."""
    if len(params) < 2 or not all(params):
        raise ScpiError(-109)
    if len(params) > 2:
        raise ScpiError(-108)
    return params[0], params[1]


class MeterCommands:
    """The command handlers over one `MeterModel`, and their header table (``table``).

    ``PowerMeterEmulator`` owns one and holds its lock around each handler.
    """

    def __init__(self, meter: MeterModel) -> None:
        self.meter = meter
        self.table = self._build_commands()

    def _flag(self, ch: int, params: list[str], query: bool, name: str) -> Response | None:
        """A boolean setting of channel `ch` named `name` (query: 0 or 1)."""
        c = self.meter.state(ch)
        if query:
            return boolean(getattr(c, name))
        setattr(c, name, parse_boolean(one_parameter(params)))
        return None

    def _choice(self, ch: int, params: list[str], query: bool, name: str,
                choices: dict[str, str]) -> Response | None:
        """A setting of channel `ch` named `name` that takes one of `choices` (query: its
        short form)."""
        c = self.meter.state(ch)
        if query:
            return str(getattr(c, name))
        setattr(c, name, parse_choice(one_parameter(params), choices))
        return None

    def _number_setting(self, ch: int, params: list[str], query: bool, name: str,
                        units: dict[str, float], bounds: tuple[float, float],
                        default: float) -> Response | None:
        """A numeric setting of channel `ch` named `name`, in `units`, inside `bounds`."""
        c = self.meter.state(ch)
        if query:
            return nr3(getattr(c, name))
        setattr(c, name, parse_number(one_parameter(params), units, *bounds, default))
        return None

    # ----- per-channel settings ------------------------------------------------------------

    def _wavelength(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._number_setting(ch, params, query, "wavelength_m", LENGTH_UNITS,
                                    WAVELENGTH_RANGE_M, 1550e-9)

    def _wavelength_all(self, ch: int, params: list[str], query: bool) -> Response | None:
        metres = parse_number(one_parameter(params), LENGTH_UNITS, *WAVELENGTH_RANGE_M, 1550e-9)
        for c in self.meter.channel_states:
            c.wavelength_m = metres
        return None

    def _unit(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self.meter.state(ch)
        if query:
            return boolean(c.unit_watt)
        choices = {"0": "DBM", "+0": "DBM", "DBM": "DBM", "1": "W", "+1": "W", "W": "W",
                   "WATT": "W"}
        c.unit_watt = parse_choice(one_parameter(params), choices) == "W"
        return None

    def _averaging(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self.meter.state(ch)
        if query:
            return nr3(c.averaging_s)
        c.averaging_s = parse_number(one_parameter(params), TIME_UNITS, *AVERAGING_RANGE_S, 0.1)
        c.last_period = None
        return None

    def _auto_range(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._flag(ch, params, query, "auto_range")

    def _range(self, ch: int, params: list[str], query: bool) -> Response | None:
        """RANG: the manual range in dBm (nearest 10 dB step); setting it ends auto ranging.
        RANG? is always in dBm; with auto ranging it is the range the last reading needed."""
        c = self.meter.state(ch)
        if query:
            level = self.meter.current(ch).dbm if c.auto_range else None
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
        return self._flag(ch, params, query, "auto_gain")

    def _reference_state(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._flag(ch, params, query, "reference_relative")

    def _reference(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._number_setting(ch, params, query, "reference_dbm", DBM_UNITS,
                                    REFERENCE_RANGE_DBM, 0.0)

    def _zero(self, ch: int, params: list[str], query: bool) -> Response | None:
        """ZERO: measure the electrical offset (needs a dark input); ZERO? 0 = it worked."""
        c = self.meter.state(ch)
        if query:
            return nr1(c.zero_result)
        if params:
            raise ScpiError(-108)
        sample = self.meter.measure(ch)
        c.zero_result = 0 if sample.dbm is None or sample.dbm < ZERO_LIGHT_LIMIT_DBM else 1
        return None

    def _zero_all(self, ch: int, params: list[str], query: bool) -> Response | None:
        if query:
            return nr1(max(c.zero_result for c in self.meter.channel_states))
        for n in range(1, self.meter.channels + 1):
            self._zero(n, params, False)
        return None

    def _correction(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._number_setting(ch, params, query, "correction_db", DB_UNITS,
                                    CORRECTION_RANGE_DB, 0.0)

    # ----- logging ------------------------------------------------------------------------

    def _log_parameters(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self.meter.state(ch)
        if query:
            return f"{nr1(c.log_points)},{nr3(c.log_averaging_s)}"
        first, second = _two_parameters(params)
        points = parse_number(first, PLAIN, *LOGGING_POINTS_RANGE, 100)
        averaging = parse_number(second, TIME_UNITS, *AVERAGING_RANGE_S, 0.1)
        c.log_points, c.log_averaging_s = round(points), averaging
        return None

    def _function_state(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self.meter.state(ch)
        if query:
            return f"{c.log_function},{'PROGRESS' if c.log_running else 'COMPLETE'}"
        first, second = _two_parameters(params)
        function = parse_choice(first, {"LOGG": "LOGG", "LOGGING": "LOGG", "NONE": "NONE"})
        action = parse_choice(second, {"STAR": "STAR", "START": "STAR", "STOP": "STOP"})
        if action == "STOP":
            self.meter.stop_logging(ch)
            return None
        if function == "NONE":
            raise ScpiError(-224)
        c.log_function = _LOGGING_FUNCTION
        c.log_running = True
        c.log_samples = []
        c.log_start = self.meter.clock() if c.trigger_input == "IGN" else None
        return None

    def _function_result(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self.meter.state(ch)
        if c.log_running:
            raise ScpiError(-230)
        return ieee_block(struct.pack(f"<{len(c.log_samples)}f", *c.log_samples))

    # ----- readings -----------------------------------------------------------------------

    def _fetch(self, ch: int, params: list[str], query: bool) -> Response | None:
        return nr3(self.meter.value(ch, self.meter.current(ch)))

    def _read(self, ch: int, params: list[str], query: bool) -> Response | None:
        return nr3(self.meter.value(ch, self.meter.triggered(ch)))

    def _all(self, take: Callable[[int], Sample], in_watts: bool) -> list[float]:
        samples = [take(ch) for ch in range(1, self.meter.channels + 1)]
        if in_watts:
            return [s.watts for s in samples]
        return [self.meter.value(ch, s) for ch, s in enumerate(samples, start=1)]

    def _block(self, values: list[float]) -> bytes:
        return ieee_block(struct.pack(f"<{len(values)}f", *values))

    def _fetch_all_block(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._block(self._all(self.meter.current, self.meter.all_block_unit == "watt"))

    def _read_all_block(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._block(self._all(self.meter.triggered, self.meter.all_block_unit == "watt"))

    def _fetch_all_csv(self, ch: int, params: list[str], query: bool) -> Response | None:
        return ",".join(nr3(v) for v in self._all(self.meter.current, False))

    def _read_all_csv(self, ch: int, params: list[str], query: bool) -> Response | None:
        return ",".join(nr3(v) for v in self._all(self.meter.triggered, False))

    def _all_config(self, ch: int, params: list[str], query: bool) -> Response | None:
        """Slot and channel of every value of the ALL blocks: uint16 pairs (slot, 1)."""
        pairs = [v for slot in range(1, self.meter.channels + 1) for v in (slot, 1)]
        return ieee_block(struct.pack(f"<{len(pairs)}H", *pairs))

    def _continuous(self, ch: int, params: list[str], query: bool) -> Response | None:
        c = self.meter.state(ch)
        if query:
            return boolean(c.continuous)
        c.continuous = parse_boolean(one_parameter(params))
        if not c.continuous and c.last is None:
            self.meter.take(ch)
        return None

    def _initiate(self, ch: int, params: list[str], query: bool) -> Response | None:
        if params:
            raise ScpiError(-108)
        self.meter.take(ch)
        return None

    # ----- triggering ---------------------------------------------------------------------

    def _trigger_input(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._choice(ch, params, query, "trigger_input", _TRIGGER_INPUTS)

    def _trigger_output(self, ch: int, params: list[str], query: bool) -> Response | None:
        return self._choice(ch, params, query, "trigger_output", _TRIGGER_OUTPUTS)

    def _trigger_node(self, ch: int, params: list[str], query: bool) -> Response | None:
        """:TRIG NODEA is a trigger at the input connector; NODEB one at the output connector,
        which comes back to the input only in loop-back configuration."""
        node = parse_choice(one_parameter(params), _TRIGGER_NODES)
        if self.meter.trigger_config == "DIS":
            return None
        if node == "A" or self.meter.trigger_config == "LOOP":
            for n in range(1, self.meter.channels + 1):
                self.meter.input_trigger(n)
        return None

    def _trigger_configuration(self, ch: int, params: list[str], query: bool) -> Response | None:
        if query:
            return self.meter.trigger_config
        self.meter.trigger_config = parse_choice(one_parameter(params), _TRIGGER_CONFIGS)
        return None

    # ----- system -------------------------------------------------------------------------

    def _system_error(self, ch: int, params: list[str], query: bool) -> Response | None:
        if not self.meter.errors:
            return NO_ERROR
        return format_error(self.meter.errors.pop(0))

    def _error_count(self, ch: int, params: list[str], query: bool) -> Response | None:
        return nr1(len(self.meter.errors))

    def _system_time(self, ch: int, params: list[str], query: bool) -> Response | None:
        now = self.meter.wall_clock() + self.meter.time_offset_s
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
        self.meter.time_offset_s += wanted - math.floor(now)
        return None

    def _system_preset(self, ch: int, params: list[str], query: bool) -> Response | None:
        if params:
            raise ScpiError(-108)
        self.meter.preset()
        return None

    def _build_commands(self) -> list[Command]:
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
        commands = [Command(compile_pattern(p), h, "q" in kind, "s" in kind, stops)
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
        commands += [Command(compile_pattern(p), h, "q" in kind, "s" in kind, stops,
                              channelled=False) for p, h, kind, stops in unchannelled]
        return commands
