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
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyvisa
from pyvisa import constants
from pyvisa.errors import InvalidSession, VisaIOError
from pyvisa.resources import MessageBasedResource

from common.errors import DeviceError, DeviceTimeout, ProtocolError
from drivers.interfaces import DeviceIdentity

logger = logging.getLogger(__name__)

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
MAX_ERRORS_DRAINED = 64
DRAIN_QUIET_MS = 100
"""After a timeout, the link counts as clean once it stayed silent this long."""
MAX_DRAIN_READS = 256

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


class PowerMeter:
    """A Keysight N7744A/N7745A on a pyvisa message-based resource."""

    def __init__(self, resource: str, *, name: str = "pm", backend: str = "@py",
                 timeout_s: float = 2.0, channels: int = 4) -> None:
        """Open `resource` with pyvisa `backend`; raise DeviceError if it cannot be opened."""
        _check_channels(channels)
        self._resource_name = resource
        self._backend = backend
        self._rm: pyvisa.ResourceManager | None = None
        self._setup(self._open(resource, backend, timeout_s, name), name=name,
                    timeout_s=timeout_s, channels=channels)

    @classmethod
    def from_resource(cls, inst: MessageBasedResource, *, name: str = "pm",
                      channels: int = 4) -> PowerMeter:
        """Wrap an already-open pyvisa resource (its terminations must be '\\n')."""
        _check_channels(channels)
        meter = cls.__new__(cls)
        meter._resource_name = None
        meter._backend = None
        meter._rm = None
        meter._setup(inst, name=name, timeout_s=(inst.timeout or 2000.0) / 1000.0,
                     channels=channels)
        return meter

    def _setup(self, inst: MessageBasedResource, *, name: str, timeout_s: float,
               channels: int) -> None:
        self.name = name
        self.channels = channels
        self.timeout_s = timeout_s
        self._lock = threading.RLock()  # one exchange (command + its answer) at a time
        self._inst: MessageBasedResource | None = inst
        self._resync = False
        self._forget_channel_setup()

    def _forget_channel_setup(self) -> None:
        """Drop what the driver knows of channel settings (after *RST or a reconnect)."""
        self._unit_dbm: set[int] = set()
        self._absolute: set[int] = set()
        self._triggered: set[int] = set()
        self._averaging_s: dict[int, float] = {}
        self._log_unit: dict[int, str] = {}

    def _open(self, resource: str, backend: str, timeout_s: float,
              name: str) -> MessageBasedResource:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s={timeout_s}: use a positive number of seconds")
        try:
            self._rm = pyvisa.ResourceManager(backend)
            inst = self._rm.open_resource(resource, read_termination="\n",
                                          write_termination="\n",
                                          timeout=round(timeout_s * 1000))
        except Exception as exc:  # pyvisa-py raises a bare Exception when it cannot connect
            if self._rm is not None:
                self._rm.close()
                self._rm = None
            raise DeviceError(f"cannot open {resource!r} ({exc}); check the resource string "
                              "in the testbed file and that the meter (or its emulator) is "
                              "running", device=name) from exc
        if not isinstance(inst, MessageBasedResource):
            inst.close()
            raise DeviceError(f"{resource!r} is not a message-based VISA resource; use a "
                              "TCPIP SOCKET or INSTR resource", device=name)
        return inst

    # ----- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the VISA session (the meter keeps its settings). Safe to call twice."""
        inst, self._inst = self._inst, None
        if inst is not None:
            try:
                inst.close()
            except (VisaIOError, InvalidSession, OSError):
                pass
        if self._rm is not None:
            try:
                self._rm.close()
            except (VisaIOError, OSError):
                pass
            self._rm = None

    def reopen(self) -> None:
        """Close and open the resource again (after the meter rebooted or the link dropped)."""
        if self._resource_name is None or self._backend is None:
            raise DeviceError("reopen() needs a meter opened from a resource string; open a "
                              "new pyvisa resource and use from_resource()", device=self.name)
        self.close()
        self._inst = self._open(self._resource_name, self._backend, self.timeout_s, self.name)
        self._resync = False
        self._forget_channel_setup()

    def __enter__(self) -> PowerMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- wire access (the one place frames are logged) -------------------------------------

    def _require(self) -> MessageBasedResource:
        if self._inst is None:
            raise DeviceError("the meter is closed; open a new PowerMeter", device=self.name)
        return self._inst

    @contextmanager
    def _io(self, what: str) -> Iterator[None]:
        """Map VISA failures while doing `what` to typed errors; mark the link for resync."""
        try:
            yield
        except VisaIOError as exc:
            self._resync = True
            if exc.error_code == constants.StatusCode.error_timeout:
                raise DeviceTimeout(f"no answer to {what!r} within {self.timeout_s:g} s; check "
                                    "that the meter is on and reachable", device=self.name
                                    ) from exc
            raise DeviceError(f"{what!r} failed: {exc.description}", device=self.name) from exc
        except UnicodeDecodeError as exc:
            self._resync = True
            raise ProtocolError(f"answer to {what!r} is not ASCII ({exc}); the link carries "
                                "garbage", device=self.name) from exc
        except (InvalidSession, OSError) as exc:
            self._resync = True
            where = self._resource_name or "the resource"
            raise DeviceError(f"{what!r} failed, no connection to {where} ({exc}); check that "
                              "the meter (or its emulator) is running, then call reopen()",
                              device=self.name) from exc

    def _sync(self) -> None:
        """After a timeout or garbage, make sure no late answer is taken for the next one.

        A meter opened from a resource string reconnects, so answers still in flight go to
        the old connection. A wrapped resource is drained instead (read until the link is quiet
        for DRAIN_QUIET_MS), which misses an answer that comes later still. Not viClear:
        pyvisa-py's clear spins forever on a socket the peer has closed.
        """
        if not self._resync:
            return
        inst = self._require()
        if self._resource_name is not None:
            logger.warning("%s: reconnecting to drop late answers", self.name)
            self.reopen()
            return
        saved = inst.timeout
        inst.timeout = DRAIN_QUIET_MS
        try:
            for _ in range(MAX_DRAIN_READS):
                try:
                    stale = inst.read_raw()
                except VisaIOError as exc:
                    if exc.error_code == constants.StatusCode.error_timeout:
                        break
                    raise DeviceError(f"draining a late answer failed: {exc.description}",
                                      device=self.name) from exc
                logger.debug("%s: discarded late answer %r", self.name, stale)
        except (InvalidSession, OSError) as exc:
            raise DeviceError(f"connection lost ({exc}); call reopen()",
                              device=self.name) from exc
        finally:
            with suppress(VisaIOError, InvalidSession, OSError):
                inst.timeout = saved
        self._resync = False

    def write(self, command: str) -> None:
        """Send one SCPI command line without checking the error queue."""
        with self._lock:
            self._require()
            self._sync()
            inst = self._require()
            logger.debug("%s >> %s", self.name, command)
            with self._io(command):
                inst.write(command)

    def _read(self, command: str, extra_s: float = 0.0) -> str:
        inst = self._require()
        with self._io(command):
            if extra_s > 0:  # the answer comes after the measurement (READ?)
                inst.timeout = round((self.timeout_s + extra_s) * 1000)
            try:
                answer = inst.read()
            finally:
                if extra_s > 0:
                    with suppress(VisaIOError, InvalidSession, OSError):
                        inst.timeout = round(self.timeout_s * 1000)
        logger.debug("%s << %s", self.name, answer)
        return answer.strip()

    def _query(self, command: str, *, explain_timeout: bool, extra_s: float = 0.0) -> str:
        with self._lock:
            self.write(command)
            try:
                return self._read(command, extra_s)
            except DeviceTimeout as timeout:
                if not explain_timeout:
                    raise
                try:
                    refused = self.errors()
                except DeviceError:
                    raise timeout from None
                if refused:
                    raise DeviceError(f"{command!r} refused by the meter: "
                                      f"{self._describe(refused)}", device=self.name
                                      ) from timeout
                raise

    def query(self, command: str) -> str:
        """Send a SCPI query and return the answer line (stripped)."""
        return self._query(command, explain_timeout=True)

    def command(self, command: str) -> None:
        """Send a SCPI setting, then raise DeviceError if the meter queued an error for it."""
        with self._lock:
            self.write(command)
            refused = self.errors()
        if refused:
            raise DeviceError(f"{command!r} refused by the meter: {self._describe(refused)}",
                              device=self.name)

    @staticmethod
    def _describe(errors: list[tuple[int, str]]) -> str:
        return "; ".join(f'{code},"{message}"' for code, message in errors)

    def errors(self) -> list[tuple[int, str]]:
        """Drain the meter's error queue (SYST:ERR?) and return (code, message) pairs."""
        found: list[tuple[int, str]] = []
        for _ in range(MAX_ERRORS_DRAINED):
            with self._lock:
                answer = self._query(":SYST:ERR?", explain_timeout=False)
            code_text, sep, message = answer.partition(",")
            try:
                code = int(code_text)
            except ValueError:
                code = None
            if code is None or not sep:
                self._resync = True
                raise ProtocolError(f"SYST:ERR? answered {answer!r}; expected "
                                    '<code>,"<message>"', device=self.name)
            if code == 0:
                return found
            found.append((code, message.strip().strip('"')))
        raise ProtocolError(f"error queue still not empty after {MAX_ERRORS_DRAINED} reads",
                            device=self.name)

    def _number(self, command: str, extra_s: float = 0.0) -> float:
        answer = self._query(command, explain_timeout=True, extra_s=extra_s)
        try:
            value = float(answer)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            self._resync = True
            raise ProtocolError(f"{command!r} answered {answer!r}; expected a number",
                                device=self.name)
        return value

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
            self._resync = True
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
        return round(self._number(f":SENS{ch}:POW:WAV?") * 1e9, 6)

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
        self._averaging_s[ch] = self._number(f":SENS{ch}:POW:ATIM?")
        return self._averaging_s[ch]

    def set_auto_range(self, ch: int, on: bool) -> None:
        """Switch automatic power ranging of channel `ch` on or off."""
        self._channel(ch)
        self.command(f":SENS{ch}:POW:RANG:AUTO {1 if on else 0}")

    def auto_range(self, ch: int) -> bool:
        """Read whether channel `ch` ranges automatically."""
        self._channel(ch)
        return self._number(f":SENS{ch}:POW:RANG:AUTO?") != 0

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
        if on:
            self._triggered.discard(ch)
        else:
            self._triggered.add(ch)

    def initiate(self, ch: int) -> None:
        """Take one measurement on channel `ch` now (read it with fetch_power_dbm)."""
        self._channel(ch)
        self.command(f":INIT{ch}:IMM")

    # ----- readings -------------------------------------------------------------------------

    def _ensure_dbm(self, ch: int) -> None:
        """Readings need dBm and an absolute reference; checked once per channel."""
        if ch not in self._unit_dbm:
            if self._number(f":SENS{ch}:POW:UNIT?") != 0:
                raise DeviceError(f"channel {ch} reports in W; call set_unit_dbm({ch}) first",
                                  device=self.name)
            self._unit_dbm.add(ch)
        if ch not in self._absolute:
            if self._number(f":SENS{ch}:POW:REF:STAT?") != 0:
                raise DeviceError(f"channel {ch} reports dB relative to a reference; call "
                                  f"set_reference_relative({ch}, False) first",
                                  device=self.name)
            self._absolute.add(ch)

    def set_reference_relative(self, ch: int, on: bool) -> None:
        """Report channel `ch` in dB against its reference (on) or absolute (off)."""
        self._channel(ch)
        self.command(f":SENS{ch}:POW:REF:STAT {1 if on else 0}")
        if on:
            self._absolute.discard(ch)
        else:
            self._absolute.add(ch)

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
        value = self._number(f":{verb}{ch}:POW?", extra_s)
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
        if ch not in self._absolute and self._number(f":SENS{ch}:POW:REF:STAT?") != 0:
            return "dB"
        self._absolute.add(ch)
        if ch in self._unit_dbm:
            return "dBm"
        return "W" if self._number(f":SENS{ch}:POW:UNIT?") != 0 else "dBm"

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
            self._resync = True
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
        with self._lock:
            if self.logging_state(ch).running:
                raise DeviceError(f"logging on channel {ch} is still running; call "
                                  "wait_for_logging() first", device=self.name)
            unit = self._log_unit.get(ch) or self._unit_of(ch)
            reference_dbm = self._number(f":SENS{ch}:POW:REF?") if unit == "dB" else 0.0
            command = f":SENS{ch}:FUNC:RES?"
            self.write(command)
            payload = self._read_block(command)
        values = np.frombuffer(payload, dtype="<f4").astype(np.float64)
        if unit == "W":
            return values.astype(np.float32)
        too_low = values > TOO_LOW_THRESHOLD
        watts = 10.0 ** ((np.where(too_low, -300.0, values) + reference_dbm) / 10.0) * 1e-3
        return np.where(too_low, 0.0, watts).astype(np.float32)

    def _read_block(self, command: str) -> bytes:
        """Read one IEEE-488.2 definite-length block of float32 values and its newline."""
        inst = self._require()
        with self._io(command):
            head = inst.read_bytes(2, break_on_termchar=False)
            if head[:1] != b"#" or not head[1:2].isdigit() or head[1:2] == b"0":
                self._resync = True
                raise ProtocolError(f"{command!r} answered {head!r}...; expected an IEEE-488.2 "
                                    "definite-length block", device=self.name)
            digits = inst.read_bytes(int(head[1:2]), break_on_termchar=False)
            if not digits.isdigit():
                self._resync = True
                raise ProtocolError(f"{command!r}: bad block length {digits!r}",
                                    device=self.name)
            length = int(digits)
            payload = inst.read_bytes(length, break_on_termchar=False) if length else b""
            end = inst.read_bytes(1, break_on_termchar=False)
        logger.debug("%s << block of %d bytes", self.name, length)
        if end != b"\n" or length % 4:
            self._resync = True
            raise ProtocolError(f"{command!r}: block of {length} bytes ends with {end!r}; "
                                "expected whole float32 values and a newline",
                                device=self.name)
        return payload
