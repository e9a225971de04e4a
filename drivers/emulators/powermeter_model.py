"""The measurement model of the N7744A/N7745A meter emulator: channel state and readings.

`MeterModel` is the instrument that `PowerMeterEmulator` owns: per-channel settings (*RST
values), how a reading is taken from the power source and reported in the channel's unit, how
a logging run collects its samples, and the error queue. The SCPI handlers that read and
change this state are `powermeter_commands.MeterCommands`; `powermeter` adds the SCPI parser
loop, the status registers and faults, `powermeter_serve` the TCP handler and the command line.
docs/reference/devices/powermeter.md gives the source of each behaviour.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["ALL_BLOCK_UNITS", "ChannelState", "MeterModel", "PowerSource", "Response", "Sample",
           "TOO_LOW_READING"]

PowerSource = Callable[[int], float | None]
"""Optical power in dBm arriving at meter channel `n` right now; None when there is no light."""

Response = str | bytes
"""A response without terminator: text, or bytes when it carries a binary block."""

ALL_BLOCK_UNITS = ("watt", "channel")
"""Units of the :READ/:FETC:POW:ALL? blocks: W (the programming guide), or each channel's."""
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

Handler = Callable[[int, list[str], bool], Response | None]


@dataclass(frozen=True)
class Sample:
    """One measurement: dBm (None: sensitivity too low) and W."""

    dbm: float | None  # None: sensitivity too low
    watts: float


@dataclass
class ChannelState:
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
    last: Sample | None = None
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
    """The meter's channels, measurements, error queue and trigger configuration.

    Not locked by itself: ``PowerMeterEmulator`` owns one and holds its lock around every use;
    its command handlers (``MeterCommands``) read and change the state through it.
    """

    def __init__(self, *, channels: int, power_source: PowerSource | None, noise_db: float,
                 noise_floor_dbm: float, all_block_unit: str, clock: Callable[[], float],
                 wall_clock: Callable[[], float], rng: random.Random) -> None:
        self.channels = channels
        self.power_source = power_source
        self.noise_db = noise_db
        self.noise_floor_dbm = noise_floor_dbm
        self.all_block_unit = all_block_unit
        self.clock = clock
        self.wall_clock = wall_clock
        self.rng = rng
        self.time_offset_s = 0.0
        """SYST:TIME's offset from the wall clock."""
        self.errors: list[int] = []
        """The SCPI error queue, oldest first."""
        self.answer_after_s = 0.0
        """How long the line being handled takes to answer (READ? of a triggered channel)."""
        self.channel_states: list[ChannelState] = []
        self.trigger_config = "DEF"
        self.origin = 0.0
        self.preset()

    def state(self, channel: int) -> ChannelState:
        """The settings and measurement state of `channel` (1-based)."""
        return self.channel_states[channel - 1]

    def preset(self) -> None:
        """Every channel and the trigger configuration back to their *RST values."""
        self.channel_states = [ChannelState() for _ in range(self.channels)]
        self.trigger_config = "DEF"
        self.origin = self.clock()

    def input_trigger(self, channel: int) -> None:
        """A pulse at the input trigger connector, as seen by `channel`."""
        c = self.state(channel)
        self.advance_logging(channel)
        if not c.log_running:
            if c.trigger_input == "SME":
                self.take(channel)
            return
        if c.trigger_input == "SME":
            c.log_samples.append(self.value(channel, self.measure(channel)))
            if len(c.log_samples) >= c.log_points:
                c.log_running = False
        elif c.trigger_input == "CME" and c.log_start is None:
            c.log_start = self.clock()

    # ----- measurement model ---------------------------------------------------------------

    def measure(self, channel: int) -> Sample:
        c = self.state(channel)
        power = self.power_source(channel) if self.power_source is not None else None
        if power is None or not math.isfinite(power) or power < self.noise_floor_dbm:
            return Sample(None, self.rng.gauss(0.0, _dbm_to_w(self.noise_floor_dbm)))
        dbm = float(power) + c.correction_db
        if self.noise_db > 0:
            dbm += self.rng.gauss(0.0, self.noise_db)
        return Sample(dbm, _dbm_to_w(dbm))

    def take(self, channel: int) -> Sample:
        c = self.state(channel)
        c.last = self.measure(channel)
        c.last_period = int((self.clock() - self.origin) / c.averaging_s)
        return c.last

    def value(self, channel: int, sample: Sample) -> float:
        """A sample in the channel's unit: dB against the reference, W, or dBm."""
        c = self.state(channel)
        if c.reference_relative:
            return TOO_LOW_READING if sample.dbm is None else sample.dbm - c.reference_dbm
        if c.unit_watt:
            return sample.watts
        return TOO_LOW_READING if sample.dbm is None else sample.dbm

    def current(self, channel: int) -> Sample:
        """FETCh: the last measurement (a new one each averaging period in continuous mode)."""
        c = self.state(channel)
        period = int((self.clock() - self.origin) / c.averaging_s)
        if c.last is None or (c.continuous and period != c.last_period):
            self.take(channel)
        assert c.last is not None
        return c.last

    def triggered(self, channel: int) -> Sample:
        """READ: like FETCh when measuring continuously, else a new measurement that takes
        one averaging time (the response is held back that long)."""
        c = self.state(channel)
        if c.continuous:
            return self.current(channel)
        self.answer_after_s = max(self.answer_after_s, c.averaging_s)
        return self.take(channel)

    def advance_logging(self, channel: int) -> None:
        c = self.state(channel)
        if not c.log_running or c.trigger_input == "SME" or c.log_start is None:
            return
        elapsed = self.clock() - c.log_start
        due = min(c.log_points, int(elapsed / c.log_averaging_s + 1e-9))
        while len(c.log_samples) < due:
            c.log_samples.append(self.value(channel, self.measure(channel)))
        if len(c.log_samples) >= c.log_points:
            c.log_running = False

    def stop_logging(self, channel: int) -> None:
        c = self.state(channel)
        c.log_running = False
        c.log_function = "NONE"
