"""Driver for Keysight N7744A/N7745A multiport optical power meters (SCPI over VISA).

The meter is opened through pyvisa (default backend ``@py``), for example
``TCPIP0::192.168.1.20::5025::SOCKET`` for the real instrument or the resource string that
``oddl emulate powermeter`` prints. Channels are the meter's slots, 1-based. Powers are in dBm,
wavelengths in nm, times in s.

- Arguments are checked against the instrument ranges before anything is sent (ValueError).
- Every setting is followed by SYST:ERR?; an instrument error raises DeviceError naming the
  command. A query that gets no answer raises DeviceError if the meter queued an error for it,
  DeviceTimeout otherwise; the next call first discards any late answer (viClear).
- "No light" (the meter's "sensitivity too low" reading, above 1e20) is returned as None.
- `read_power_dbm` always measures anew: on first use the driver switches the channel to
  triggered mode (``:INIT<n>:CONT OFF``), where ``READ?`` takes one averaging time (in
  continuous mode the guide makes ``READ?`` identical to ``FETCh?``, the last finished
  period). The VISA timeout of each ``READ?`` is `timeout_s` plus the channel's averaging time.
- The meter reports in the unit its channel is set to (dBm, W, or dB against a reference).
  Readings need dBm and an absolute reference (checked once per channel); logging results are
  converted from the unit the channel had when the run started to float32 W.

The SCPI session (VISA I/O, error queue, resync after timeouts, block reads) is
``oddl.drivers.powermeter_link.PowerMeterLink``, which the meter holds; this module is the meter: ranges, channel settings,
readings and logging runs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pyvisa.resources import MessageBasedResource

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError
from oddl.drivers.interfaces import DeviceIdentity
from oddl.drivers.powermeter_link import PowerMeterLink

logger = logging.getLogger(__name__)

__all__ = ["LoggingState", "PowerMeter", "TriggerInput", "watts_to_dbm"]

WAVELENGTH_RANGE_NM = (1250.0, 1650.0)
"""Calibration wavelengths the N7744A/N7745A accept."""
AVERAGING_RANGE_S = (1e-6, 10.0)
"""Averaging times (per reading and per logged sample) the meter accepts."""
LOGGING_POINTS_RANGE = (1, 1_000_000)
"""Number of samples one logging run may take."""
CORRECTION_RANGE_DB = (-200.0, 200.0)
"""Loss-correction offsets the meter accepts."""
TOO_LOW_THRESHOLD = 1e20
"""Readings above this mean 'sensitivity too low' (no light)."""

TriggerInput = Literal["IGN", "SME", "CME"]


@dataclass(frozen=True)
class LoggingState:
    """Answer of :SENS<n>:FUNC:STAT?: the active function and whether it has finished."""

    function: str
    complete: bool

    @property
    def running(self) -> bool:
        """True while a logging run is still taking samples."""
        return self.function != "NONE" and not self.complete


def watts_to_dbm(watts: np.ndarray) -> np.ndarray:
    """Convert logged samples (W) to dBm; samples <= 0 (no light) become NaN."""
    w = np.asarray(watts, dtype=np.float64)
    out = np.full(w.shape, np.nan)
    positive = w > 0
    out[positive] = 10.0 * np.log10(w[positive] * 1e3)
    return out


def _check_channels(channels: int) -> None:
    if not 1 <= channels <= 8:
        raise ValueError(f"channels={channels}: the N7744A has 4 and the N7745A 8")


def _in_range(value: float, bounds: tuple[float, float]) -> bool:
    return math.isfinite(value) and bounds[0] <= value <= bounds[1]


def _mark(channels: set[int], ch: int, member: bool) -> None:
    """Add `ch` to `channels` or take it out."""
    if member:
        channels.add(ch)
    else:
        channels.discard(ch)


class PowerMeter:
    """A Keysight N7744A/N7745A on a pyvisa message-based resource.

    The meter holds its SCPI session as ``link`` (a ``PowerMeterLink``); ``query``,
    ``command``, ``write``, ``errors``, ``reopen`` and ``close`` are the session's.
    """

    def __init__(self, resource: str, *, name: str = "pm", backend: str = "@py",
                 timeout_s: float = 2.0, channels: int = 4) -> None:
        """Open `resource` with pyvisa `backend`; raise DeviceError if it cannot be opened."""
        _check_channels(channels)
        self._setup(PowerMeterLink.open(resource, backend=backend, timeout_s=timeout_s,
                                        name=name, on_reconnect=self._forget_channel_setup),
                    channels)

    @classmethod
    def from_resource(cls, inst: MessageBasedResource, *, name: str = "pm",
                      channels: int = 4) -> PowerMeter:
        """Wrap an already-open pyvisa resource (its terminations must be '\\n')."""
        _check_channels(channels)
        meter = cls.__new__(cls)
        meter._setup(PowerMeterLink(inst, name=name, timeout_s=(inst.timeout or 2000.0) / 1000.0,
                                    on_reconnect=meter._forget_channel_setup), channels)
        return meter

    def _setup(self, link: PowerMeterLink, channels: int) -> None:
        self.link = link
        self.name = link.name
        self.channels = channels
        self._forget_channel_setup()

    def _forget_channel_setup(self) -> None:
        """Drop what the driver knows of channel settings (after *RST or a reconnect)."""
        self._unit_dbm: set[int] = set()
        self._absolute: set[int] = set()
        self._triggered: set[int] = set()
        self._averaging_s: dict[int, float] = {}
        self._log_unit: dict[int, str] = {}

    def __enter__(self) -> PowerMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- the SCPI session's -------------------------------------------------------------

    def close(self) -> None:
        """Release the VISA session (the meter keeps its settings). Safe to call twice."""
        self.link.close()

    def reopen(self) -> None:
        """Close and open the resource again (after the meter rebooted or the link dropped)."""
        self.link.reopen()

    def write(self, command: str) -> None:
        """Send one SCPI command line without checking the error queue."""
        self.link.write(command)

    def query(self, command: str) -> str:
        """Send a SCPI query and return the answer line (stripped)."""
        return self.link.query(command)

    def command(self, command: str) -> None:
        """Send a SCPI setting, then raise DeviceError if the meter queued an error for it."""
        self.link.command(command)

    def errors(self) -> list[tuple[int, str]]:
        """Drain the meter's error queue (SYST:ERR?) and return (code, message) pairs."""
        return self.link.errors()

    # ----- argument checks -------------------------------------------------------------------

    def _channel(self, ch: int) -> int:
        if isinstance(ch, bool) or not isinstance(ch, int) or not 1 <= ch <= self.channels:
            raise ValueError(f"channel {ch!r} does not exist; this meter has channels "
                             f"1..{self.channels}")
        return ch

    # ----- identity and settings ------------------------------------------------------------

    def identify(self) -> DeviceIdentity:
        """Read *IDN?: manufacturer, model, serial number and firmware."""
        answer = self.query("*IDN?")
        fields = [f.strip() for f in answer.split(",")]
        if len(fields) != 4 or not all(fields[:3]):
            self.link.resync_before_next()
            raise ProtocolError(f"*IDN? answered {answer!r}; expected 4 comma-separated fields",
                                device=self.name)
        manufacturer, model, serial, firmware = fields
        return DeviceIdentity(kind="powermeter", manufacturer=manufacturer, model=model,
                              serial_number=serial, extra=(("firmware", firmware),))

    def reset(self) -> None:
        """Send *RST (power-on settings on every channel; logging stops)."""
        self.command("*RST")
        self._forget_channel_setup()

    def set_wavelength_nm(self, ch: int, nm: float) -> None:
        """Set the calibration wavelength of channel `ch` (1250-1650 nm)."""
        self._channel(ch)
        if not _in_range(nm, WAVELENGTH_RANGE_NM):
            raise ValueError(f"wavelength {nm} nm is outside the meter's "
                             f"{WAVELENGTH_RANGE_NM[0]:g}-{WAVELENGTH_RANGE_NM[1]:g} nm; pass "
                             "the carrier wavelength in nm, e.g. 1550.12")
        self.command(f":SENS{ch}:POW:WAV {nm:.4f}NM")

    def wavelength_nm(self, ch: int) -> float:
        """Read the calibration wavelength of channel `ch` in nm."""
        self._channel(ch)
        return round(self.link.number(f":SENS{ch}:POW:WAV?") * 1e9, 6)

    def set_unit_dbm(self, ch: int) -> None:
        """Make channel `ch` report power in dBm (the unit read_power_dbm expects)."""
        self._channel(ch)
        self.command(f":SENS{ch}:POW:UNIT 0")
        self._unit_dbm.add(ch)

    def set_averaging_time_s(self, ch: int, s: float) -> None:
        """Set the averaging time of channel `ch` (1 us to 10 s)."""
        self._channel(ch)
        if not _in_range(s, AVERAGING_RANGE_S):
            raise ValueError(f"averaging time {s} s is outside {AVERAGING_RANGE_S[0]:g}-"
                             f"{AVERAGING_RANGE_S[1]:g} s; pass seconds, e.g. 0.001 for 1 ms")
        self.command(f":SENS{ch}:POW:ATIM {s:.9g}S")
        self._averaging_s[ch] = s

    def averaging_time_s(self, ch: int) -> float:
        """Read the averaging time of channel `ch` in s."""
        self._channel(ch)
        self._averaging_s[ch] = self.link.number(f":SENS{ch}:POW:ATIM?")
        return self._averaging_s[ch]

    def set_auto_range(self, ch: int, on: bool) -> None:
        """Switch automatic power ranging of channel `ch` on or off."""
        self._channel(ch)
        self.command(f":SENS{ch}:POW:RANG:AUTO {1 if on else 0}")

    def auto_range(self, ch: int) -> bool:
        """Read whether channel `ch` ranges automatically."""
        self._channel(ch)
        return self.link.number(f":SENS{ch}:POW:RANG:AUTO?") != 0

    def set_correction_db(self, ch: int, db: float) -> None:
        """Set the loss-correction offset (dB) the meter adds to every reading of `ch`."""
        self._channel(ch)
        if not _in_range(db, CORRECTION_RANGE_DB):
            raise ValueError(f"correction {db} dB is outside {CORRECTION_RANGE_DB[0]:g}.."
                             f"{CORRECTION_RANGE_DB[1]:g} dB")
        self.command(f":SENS{ch}:CORR {db:.4f}DB")

    def set_continuous(self, ch: int, on: bool) -> None:
        """Let channel `ch` measure continuously (on) or only when triggered (off)."""
        self._channel(ch)
        self.command(f":INIT{ch}:CONT {'ON' if on else 'OFF'}")
        _mark(self._triggered, ch, not on)

    def initiate(self, ch: int) -> None:
        """Take one measurement on channel `ch` now (read it with fetch_power_dbm)."""
        self._channel(ch)
        self.command(f":INIT{ch}:IMM")

    # ----- readings -------------------------------------------------------------------------

    def _ensure_dbm(self, ch: int) -> None:
        """Readings need dBm and an absolute reference; checked once per channel."""
        if ch not in self._unit_dbm:
            if self.link.number(f":SENS{ch}:POW:UNIT?") != 0:
                raise DeviceError(f"channel {ch} reports in W; call set_unit_dbm({ch}) first",
                                  device=self.name)
            self._unit_dbm.add(ch)
        if ch not in self._absolute:
            if self.link.number(f":SENS{ch}:POW:REF:STAT?") != 0:
                raise DeviceError(f"channel {ch} reports dB relative to a reference; call "
                                  f"set_reference_relative({ch}, False) first",
                                  device=self.name)
            self._absolute.add(ch)

    def set_reference_relative(self, ch: int, on: bool) -> None:
        """Report channel `ch` in dB against its reference (on) or absolute (off)."""
        self._channel(ch)
        self.command(f":SENS{ch}:POW:REF:STAT {1 if on else 0}")
        _mark(self._absolute, ch, not on)

    def _power(self, verb: str, ch: int) -> float | None:
        self._channel(ch)
        self._ensure_dbm(ch)
        extra_s = 0.0
        if verb == "READ":
            if ch not in self._triggered:
                self.set_continuous(ch, False)
            if ch not in self._averaging_s:
                self.averaging_time_s(ch)
            extra_s = self._averaging_s[ch]
        value = self.link.number(f":{verb}{ch}:POW?", extra_s)
        if value > TOO_LOW_THRESHOLD:
            logger.debug("%s: channel %d sensitivity too low (no light)", self.name, ch)
            return None
        return value

    def read_power_dbm(self, ch: int) -> float | None:
        """Measure `ch` anew (one averaging time) and return dBm; None when there is no light."""
        return self._power("READ", ch)

    def fetch_power_dbm(self, ch: int) -> float | None:
        """Return the last measurement of `ch` in dBm without triggering; None for no light."""
        return self._power("FETC", ch)

    # ----- logging --------------------------------------------------------------------------

    def start_logging(self, ch: int, n: int, interval_s: float, *,
                      trigger: TriggerInput = "IGN") -> None:
        """Log `n` samples of `interval_s` averaging each on `ch`.

        `trigger`: IGN starts now, CME waits for one input trigger, SME takes one sample per
        input trigger. Changing any setting of `ch` before it completes stops the logging.
        """
        self._channel(ch)
        if isinstance(n, bool) or not isinstance(n, int) or not (
                LOGGING_POINTS_RANGE[0] <= n <= LOGGING_POINTS_RANGE[1]):
            raise ValueError(f"logging points {n!r} outside {LOGGING_POINTS_RANGE[0]}.."
                             f"{LOGGING_POINTS_RANGE[1]}; pass an int")
        if not _in_range(interval_s, AVERAGING_RANGE_S):
            raise ValueError(f"logging interval {interval_s} s is outside "
                             f"{AVERAGING_RANGE_S[0]:g}-{AVERAGING_RANGE_S[1]:g} s")
        if trigger not in ("IGN", "SME", "CME"):
            raise ValueError(f"trigger {trigger!r}: use 'IGN', 'SME' or 'CME'")
        self._log_unit[ch] = self._unit_of(ch)
        self.command(f":TRIG{ch}:INP {trigger}")
        self.command(f":SENS{ch}:FUNC:PAR:LOGG {n},{interval_s:.9g}S")
        self.command(f":SENS{ch}:FUNC:STAT LOGG,STAR")

    def _unit_of(self, ch: int) -> str:
        """The unit channel `ch` reports in now: 'dBm', 'W' or 'dB' (relative)."""
        if ch not in self._absolute and self.link.number(f":SENS{ch}:POW:REF:STAT?") != 0:
            return "dB"
        self._absolute.add(ch)
        if ch in self._unit_dbm:
            return "dBm"
        return "W" if self.link.number(f":SENS{ch}:POW:UNIT?") != 0 else "dBm"

    def stop_logging(self, ch: int) -> None:
        """Stop a logging run on `ch` (samples taken so far stay readable)."""
        self._channel(ch)
        self.command(f":SENS{ch}:FUNC:STAT LOGG,STOP")

    def logging_state(self, ch: int) -> LoggingState:
        """Read whether channel `ch` is logging and whether the run is complete."""
        self._channel(ch)
        answer = self.query(f":SENS{ch}:FUNC:STAT?")
        function, sep, progress = answer.upper().partition(",")
        if not sep or progress.strip() not in ("PROGRESS", "COMPLETE"):
            self.link.resync_before_next()
            raise ProtocolError(f"FUNC:STAT? answered {answer!r}; expected "
                                "<function>,PROGRESS|COMPLETE", device=self.name)
        return LoggingState(function.strip(), progress.strip() == "COMPLETE")

    def wait_for_logging(self, ch: int, timeout_s: float, *, poll_s: float = 0.05,
                         clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], None] = time.sleep) -> None:
        """Poll until the logging run on `ch` is complete; DeviceTimeout after `timeout_s`."""
        deadline = clock() + timeout_s
        while self.logging_state(ch).running:
            if clock() >= deadline:
                raise DeviceTimeout(f"logging on channel {ch} not complete after "
                                    f"{timeout_s:g} s; check the trigger mode and the "
                                    "number of points", device=self.name)
            sleep(poll_s)

    def logging_result(self, ch: int) -> np.ndarray:
        """Read the samples of the last logging run on `ch`: float32 in W, oldest first.

        The meter logs in the unit the channel had when the run started (dBm, W or dB against
        the reference); the samples are converted to W, "too low" ones to 0 W.
        """
        with self.link.lock:
            if self.logging_state(ch).running:
                raise DeviceError(f"logging on channel {ch} is still running; call "
                                  "wait_for_logging() first", device=self.name)
            unit = self._log_unit.get(ch) or self._unit_of(ch)
            reference_dbm = self.link.number(f":SENS{ch}:POW:REF?") if unit == "dB" else 0.0
            payload = self.link.query_block(f":SENS{ch}:FUNC:RES?")
        values = np.frombuffer(payload, dtype="<f4").astype(np.float64)
        if unit == "W":
            return values.astype(np.float32)
        too_low = values > TOO_LOW_THRESHOLD
        watts = 10.0 ** ((np.where(too_low, -300.0, values) + reference_dbm) / 10.0) * 1e-3
        return np.where(too_low, 0.0, watts).astype(np.float32)
