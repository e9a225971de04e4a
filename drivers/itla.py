"""Driver for OIF-ITLA-MSA tunable lasers (01.2 / 01.3 / micro-ITLA) over any byte transport.

Layers, innermost first, each in its own module:

- ``oddl.drivers.itla_frames``: the frame codec (pure): ``bip4``, ``encode_request``,
  ``decode_reply``, the MHz register parts.
- ``oddl.drivers.itla_registers``: the register table ``REGISTERS`` / ``register(name_or_addr)``,
  NOP error codes, ``ItlaStatus``.
- ``oddl.drivers.itla_link``: ``ItlaLink``, one request/reply exchange at a time under a lock, with
  XE turned into ``ItlaExecutionError``, CII retried for ``ItlaTimeouts.startup_s``
  (``oddl.drivers.itla_timeouts``), LstRsp retries and NOP-byte resynchronisation; registers by
  name, AEA strings, pending waits.
- here: ``ItlaDriver``, the laser: identity, limits, grid, tuning with time-to-lock, power,
  output and read-back. It holds its ``ItlaLink`` (``driver.link``) and implements
  ``oddl.drivers.interfaces.TunableTransceiver``.

Rules and sources: docs/reference/devices/itla.md. Frequencies are in THz (registers: THz, 0.1 GHz, MHz
parts), powers in dBm (registers: dBm x 100), times in seconds.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Self

from oddl.common.errors import DeviceError, DeviceTimeout, SafetyLimitError
from oddl.drivers.interfaces import DeviceIdentity, TransceiverState
from oddl.drivers.itla_frames import (
    SENA,
    Status,
    join_mhz,
    split_mhz,
)
from oddl.drivers.itla_link import ItlaLink
from oddl.drivers.itla_registers import (
    DIS_BIT,
    FREQ_BIT,
    LATCH_MASK,
    ItlaExecutionError,
    ItlaLimits,
    ItlaStatus,
)
from oddl.drivers.itla_timeouts import ItlaTimeouts
from oddl.drivers.transport import Transport

logger = logging.getLogger(__name__)

__all__ = ["ItlaDriver"]


class ItlaDriver:
    """An OIF ITLA laser behind `transport`; implements ``TunableTransceiver``.

    The driver holds its ``link`` (an ``ItlaLink``, built from the same arguments): the
    exchanges, their lock, link recovery and registers by name are the link's; the driver keeps
    the laser's state (limits, grid, tuning history). Used as a context manager, leaving the
    block calls ``shutdown()`` (output off, then close); ``close()`` alone leaves the light as
    it is.
    """

    def __init__(self, transport: Transport, name: str = "itla", *,
                 timeout_s: float | None = None, retries: int = 2,
                 poll_interval_s: float = 0.01, timeouts: ItlaTimeouts | None = None,
                 recover_link: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.link = ItlaLink(transport, name, timeout_s=timeout_s, retries=retries,
                             poll_interval_s=poll_interval_s, timeouts=timeouts,
                             recover_link=recover_link, clock=clock, sleep=sleep)
        self.name = name
        self.tune_history: deque[float] = deque(maxlen=10_000)
        """Measured time-to-lock of each set_channel, seconds (newest last)."""
        self.last_time_to_lock_s: float | None = None
        self._limits: ItlaLimits | None = None
        self._grid: tuple[int, int] | None = None  # (first channel MHz, spacing MHz)

    # -- context management --

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def close(self) -> None:
        """Release the link; the optical state is left as it is. Safe to call twice."""
        self.link.close()

    def shutdown(self) -> None:
        """Switch the output off (best effort, failures logged), then close the link."""
        try:
            if not self.link.closed:
                self.disable_output()
        except DeviceError as exc:
            logger.warning("%s: could not switch the output off on shutdown: %s", self.name, exc)
        finally:
            self.close()

    def _aea_words(self, name: str) -> tuple[int, ...]:
        raw = self.link.read_aea(name)
        return tuple(int.from_bytes(raw[i:i + 2], "big", signed=True)
                     for i in range(0, len(raw) - 1, 2))

    def last_response(self) -> int:
        """LstResp (0x13): the data word of the reply the module sent before this one."""
        return self.link.read_register("LstResp")

    def temperatures_c(self) -> tuple[float, ...]:
        """Temps (0x58, AEA): module temperatures in degC, in the module's technology order
        (technology 1: laser chip, case)."""
        return tuple(w / 100 for w in self._aea_words("Temps"))

    def currents_ma(self) -> tuple[float, ...]:
        """Currents (0x57, AEA): module currents in mA, in the module's technology order
        (technology 1: TEC, laser diode)."""
        return tuple(w / 10 for w in self._aea_words("Currents"))

    # -- identity and limits --

    def identify(self) -> DeviceIdentity:
        """Sync with a NOP, then read DevTyp, MFGR, Model, SerNo (and dates/releases if present)."""
        with self.link.locked():
            self.link.nop()
            kind = self.link.read_string("DevTyp")
            mfgr = self.link.read_string("MFGR")
            model = self.link.read_string("Model")
            serno = self.link.read_string("SerNo")
            extra: list[tuple[str, str]] = []
            for name, key in (("MFGDate", "mfg_date"), ("Release", "release"),
                              ("RelBack", "release_backwards")):
                try:
                    extra.append((key, self.link.read_string(name)))
                except ItlaExecutionError as exc:
                    if exc.error.mnemonic != "RNI":
                        raise
        logger.info("%s: %s %s %s serial %s", self.name, kind, mfgr, model, serno)
        return DeviceIdentity(kind=kind, manufacturer=mfgr, model=model, serial_number=serno,
                              extra=tuple(extra))

    def limits(self, refresh: bool = False) -> ItlaLimits:
        """Read (once, then cached) LFL/LFH, OPSL/OPSH, LGrid and FTFR."""
        if self._limits is not None and not refresh:
            return self._limits
        with self.link.locked():
            low = join_mhz(self.link.read_register("LFL1"), self.link.read_register("LFL2"),
                            self.link.read_optional("LFL3"))
            high = join_mhz(self.link.read_register("LFH1"), self.link.read_register("LFH2"),
                             self.link.read_optional("LFH3"))
            opsl = self.link.read_register("OPSL") / 100
            opsh = self.link.read_register("OPSH") / 100
            lgrid_mhz = self.link.read_register("LGrid") * 100 + self.link.read_optional("LGrid2")
            ftfr = self.link.read_optional("FTFR")
        self._limits = ItlaLimits(low / 1e6, high / 1e6, opsl, opsh, lgrid_mhz / 1e3, ftfr)
        return self._limits

    # -- grid and tuning --

    def grid(self, refresh: bool = False) -> tuple[float, float]:
        """(first channel THz, spacing GHz) as set in FCF and GRID (cached after first read)."""
        if self._grid is None or refresh:
            with self.link.locked():
                fcf = join_mhz(self.link.read_register("FCF1"), self.link.read_register("FCF2"),
                                self.link.read_optional("FCF3"))
                spacing = self.link.read_register("GRID") * 100 + self.link.read_optional("GRID2")
            self._grid = (fcf, spacing)
        return self._grid[0] / 1e6, self._grid[1] / 1e3

    def output_enabled(self) -> bool:
        """True when ResEna has SENA set."""
        return bool(self.link.read_register("ResEna") & SENA)

    def configure_grid(self, first_thz: float, spacing_ghz: float) -> None:
        """Set the first-channel frequency (THz) and grid spacing (GHz); the output must be off.

        Writes FTF = 0, FCF1/FCF2/FCF3 and GRID/GRID2 (MSA tuning steps 4-5), and clears
        ChannelH so that the next Channel write selects an absolute channel on this grid.
        """
        lim = self.limits()
        fcf = round(first_thz * 1e6)
        spacing = round(spacing_ghz * 1e3)
        if not round(lim.min_thz * 1e6) <= fcf <= round(lim.max_thz * 1e6):
            raise SafetyLimitError(f"{self.name}: first channel {first_thz} THz is outside the "
                                   f"laser's range {lim.min_thz}..{lim.max_thz} THz; nothing "
                                   "was sent")
        if abs(spacing) < round(lim.min_grid_ghz * 1e3) or spacing == 0:
            raise SafetyLimitError(f"{self.name}: grid spacing {spacing_ghz} GHz is below the "
                                   f"laser's minimum {lim.min_grid_ghz} GHz; nothing was sent")
        with self.link.locked():
            if self.output_enabled():
                raise DeviceError("cannot change the grid while the output is on (the module "
                                  "would answer CIE); call disable_output() first",
                                  device=self.name)
            self._grid = None
            thz, ghz10, mhz = split_mhz(fcf)
            self.link.write_optional("FTF", 0)
            self.link.write_register("FCF1", thz)
            self.link.write_register("FCF2", ghz10)
            self.link.write_optional("FCF3", mhz)
            coarse = int(math.copysign(abs(spacing) // 100, spacing))
            self.link.write_register("GRID", coarse)
            self.link.write_optional("GRID2", spacing - coarse * 100)
            self.link.write_optional("ChannelH", 0)
            self._grid = (fcf, spacing)
        logger.info("%s: grid %.6f THz + n x %.3f GHz", self.name, fcf / 1e6, spacing / 1e3)

    def channel_frequency_thz(self, channel: int) -> float:
        """Frequency of `channel` on the configured grid: FCF + (channel - 1) x GRID."""
        first, spacing = self.grid()
        return (round(first * 1e6) + (channel - 1) * round(spacing * 1e3)) / 1e6

    def set_channel(self, channel: int, timeout: float | None = None) -> float:
        """Tune to `channel`, wait until the operation is done (and locked, if the output is on),
        and return the measured time-to-lock in seconds (`timeout` default: timeouts.lock_s).

        The sequence is the lean one the MSA allows: the Channel write (CP while the laser
        retunes), NOP polls until the pending flags clear, then one StatusW read for DIS and
        WFREQ; nothing else is read.
        """
        if channel < 1 or channel > 0xFFFFFFFF:
            raise SafetyLimitError(f"{self.name}: channel {channel} is not 1..4294967295; "
                                   "nothing was sent")
        lim = self.limits()
        freq = self.channel_frequency_thz(channel)
        if not lim.min_thz - 1e-9 <= freq <= lim.max_thz + 1e-9:
            raise SafetyLimitError(f"{self.name}: channel {channel} is {freq:.6f} THz, outside "
                                   f"the laser's range {lim.min_thz}..{lim.max_thz} THz; "
                                   "nothing was sent")
        limit = self.link.timeouts.lock_s if timeout is None else timeout
        with self.link.locked():
            start = self.link.clock()
            if channel > 0xFFFF:
                self.link.write_register("ChannelH", channel >> 16, wait=False)
            status = self.link.write_register("Channel", channel & 0xFFFF, wait=False)
            self._wait_settled(status, start + limit, f"tuning to channel {channel}")
            elapsed = self.link.clock() - start
        self.last_time_to_lock_s = elapsed
        self.tune_history.append(elapsed)
        logger.debug("%s: channel %d (%.6f THz) locked in %.1f ms", self.name, channel, freq,
                     elapsed * 1000)
        return elapsed

    def _wait_settled(self, status: Status, deadline: float, what: str) -> None:
        """After a tuning or enable write answered `status`: poll NOP (from one poll interval
        after a CP reply) until nothing is pending, then read StatusW once: DIS means the output is off (fine unless the write answered CP,
        i.e. light was being tuned), WFREQ means not yet on frequency (poll again).
        """
        if status != Status.CP:
            statusw = self.link.read_register("StatusW")
            if statusw & DIS_BIT:
                return  # output off: the module stored the setting, there is nothing to lock
        else:
            self.link.pause()  # CP: the operation has only just started
        while True:
            self.link.wait_pending_until(deadline, what)
            statusw = self.link.read_register("StatusW")
            if statusw & DIS_BIT:
                st = ItlaStatus(0, statusw, 0)
                raise DeviceError(f"output is off after {what} (latched: "
                                  f"{', '.join(st.latched) or 'none'}); the module may have "
                                  "reset (MRL) or shut down on a fatal alarm; read status() and "
                                  "enable the output again", device=self.name)
            if not statusw & FREQ_BIT:
                return
            if self.link.clock() >= deadline:
                raise DeviceTimeout(f"not locked after {what} (StatusW 0x{statusw:04X}: "
                                    f"{', '.join(ItlaStatus(0, statusw, 0).alarms)}); check the "
                                    "laser's temperature and the target frequency, or allow a "
                                    "longer timeout", device=self.name)
            self.link.pause()
    # -- power and output --

    def set_power_dbm(self, dbm: float) -> None:
        """Set the output power set-point in dBm (0.01 dB steps), inside OPSL..OPSH."""
        lim = self.limits()
        if not (math.isfinite(dbm) and lim.min_power_dbm <= dbm <= lim.max_power_dbm):
            raise SafetyLimitError(f"{self.name}: power {dbm} dBm is outside the laser's range "
                                   f"{lim.min_power_dbm}..{lim.max_power_dbm} dBm; nothing was "
                                   "sent")
        self.link.write_register("PWR", round(dbm * 100))

    def enable_output(self, timeout: float | None = None) -> None:
        """Switch the output on (ResEna = SENA) and wait until it is stable and locked
        (`timeout` default: timeouts.enable_s; cold modules take tens of seconds)."""
        limit = self.link.timeouts.enable_s if timeout is None else timeout
        with self.link.locked():
            start = self.link.clock()
            try:
                self.link.write_register("ResEna", SENA, wait=False)
            except ItlaExecutionError as exc:
                if exc.error.mnemonic != "CIP":
                    raise
                # already enabling (a resent write after a lost reply): wait for it as well
            # Whatever the write answered, the light must be on, settled and locked after.
            self._wait_settled(Status.CP, start + limit, "enabling the output")
        logger.info("%s: output on", self.name)

    def disable_output(self, timeout: float | None = None) -> None:
        """Switch the output off (ResEna = 0)."""
        self.link.write_register("ResEna", 0, timeout=timeout)
        logger.info("%s: output off", self.name)

    def clear_latches(self) -> None:
        """Clear the latched status bits (write ones to StatusF/StatusW bits 7-0)."""
        with self.link.locked():
            self.link.write_register("StatusF", LATCH_MASK)
            self.link.write_register("StatusW", LATCH_MASK)

    # -- read-back --

    def frequency_thz(self) -> float:
        """Laser frequency from LF1/LF2/LF3, THz."""
        with self.link.locked():
            mhz = join_mhz(self.link.read_register("LF1"), self.link.read_register("LF2"),
                            self.link.read_optional("LF3"))
        return mhz / 1e6

    def power_dbm(self) -> float:
        """Measured output power (OOP), dBm."""
        return self.link.read_register("OOP") / 100

    def status(self) -> ItlaStatus:
        """Read StatusF, StatusW and NOP."""
        with self.link.locked():
            f = self.link.read_register("StatusF")
            w = self.link.read_register("StatusW")
            n = self.link.nop()
        return ItlaStatus(f, w, n)

    def channel(self) -> int:
        """Current channel (ChannelH:Channel; ChannelH read as 0 if absent)."""
        with self.link.locked():
            return self.link.read_optional("ChannelH") << 16 | self.link.read_register("Channel")

    def state(self) -> TransceiverState:
        """Read channel, frequency, power, output and lock state back from the device."""
        with self.link.locked():
            channel = self.channel()
            freq = self.frequency_thz()
            power = self.power_dbm()
            enabled = self.output_enabled()
            statusw = self.link.read_register("StatusW")
            nop = self.link.nop()
        # StatusW carries DIS and WFREQ (the tighter frequency threshold); StatusF adds
        # nothing to "locked", so it is not read here (status() reads both).
        locked = enabled and ItlaStatus(0, statusw, nop).locked
        return TransceiverState(channel=channel, frequency_thz=freq, power_dbm=power,
                                output_enabled=enabled, locked=locked)
