"""Emulator of an OIF-ITLA-MSA tunable laser, byte for byte the protocol of ``oddl.drivers.itla``.

Layers, innermost first:

- ``ItlaEmulator.respond(frame)`` / ``handle_frame(frame)``: the frame-level core. It takes one
  4-byte request and returns the 4-byte reply (None: no answer); ``respond`` also returns the
  delay before the reply goes out. State lives behind one lock; time comes from the injected
  ``clock``.
- ``ItlaEmulator.optical_output(now)``: the physical read-out for the optical fabric.
- ``ItlaRegisterModel`` (``oddl.drivers.emulators.itla_register_model``): the registers behind
  the core, which the emulator owns; the rules reconstructed where the MSA text was not at
  hand are in ``oddl.drivers.emulators.itla_register_rules``.
- ``itla_serve``: ``itla_connection_handler(emulator)`` serves the core over TCP
  (``TcpEmulatorServer``), ``serve_pty(emulator)`` on a pseudo-terminal any serial-port
  software can open, ``add_arguments(parser)`` / ``run(args)`` are the ``oddl emulate itla``
  hooks; ``python -m oddl.drivers.emulators.itla_serve`` runs it stand-alone.

Behaviour taken from the MSA: frame layout and BIP-4 checksum; statuses OK/XE/AEA/CP; NOP
error codes; strings served through AEA (the read returns AEA and the byte count, EAR returns
two bytes per read, reading past the end is XE with ERE); FCF/GRID writes with the output on are
XE with CIE; a request with a bad checksum is not executed and is answered with the CE flag; a
request with the LstRsp bit gets the previous reply again without executing anything. Frames
are found by counting bytes only (no inter-byte timeout): a lost byte shifts the frames until
the host sends single NOP bytes. After power-up and MR, for ``startup_s``, every command but a
NOP read is XE with CII (NOP's MRDY reads 0). Currents (0x57) and Temps (0x58) are AEA words.
See docs/reference/devices/itla.md for each rule, its source and where published clients disagree.

Fault injection (``ItlaFaults``), checked in this order for each received frame:
a pending reset (``reset_next``) restores the power-on state and the frame is lost; no-answer
faults drop the frame unexecuted; otherwise the frame is executed, and then garbage faults
replace the reply with four random bytes with a wrong checksum (the real reply stays the "last
response", so LstRsp recovers it), truncation faults send only the first two bytes, and error
faults (``error_next_write``) turn the next valid writes into XE/EXF. ``late_s`` delays every
reply; ``late_next`` delays only the next k replies by ``late_next_s``. ``stuck_pending`` keeps
pending operations from ever finishing. ``lose_byte`` drops the second byte of the next k
chunks received from the host (before framing). Random draws come from ``random.Random(seed)``
only.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oddl.common.errors import ConfigError
from oddl.drivers.emulators.faults import LinkFaults
from oddl.drivers.emulators.itla_register_model import ItlaRegisterModel, ItlaTiming
from oddl.drivers.itla_frames import checksum_ok

logger = logging.getLogger(__name__)

__all__ = [
    "ItlaEmulator",
    "ItlaFaults",
    "OpticalOutput",
]


@dataclass(frozen=True)
class OpticalOutput:
    """The light leaving the laser: frequency (THz) and power (dBm)."""

    frequency_thz: float
    power_dbm: float


@dataclass
class ItlaFaults(LinkFaults):
    """Faults to inject; set fields from a test (``emu.faults.no_answer = 2``) or from config.

    Counters count down by one per received frame (``error_next_write`` per valid write). A
    garbage answer is four random bytes with a bad checksum, executed all the same; a reset
    turns the output off.
    """

    LABEL = "itla"

    late_next: int = 0
    """Delay only the next k answers, by ``late_next_s``."""
    late_next_s: float = 0.0
    """Delay used by ``late_next``."""
    truncate: int = 0
    """Execute the next k frames but send only the first two bytes of the answer."""
    lose_byte: int = 0
    """Lose one byte (the second) of each of the next k chunks received from the host: the
    module's frame boundary slips until the host resynchronises (MSA: single NOP bytes)."""
    error_next_write: int = 0
    """Refuse the next k otherwise valid writes with XE / EXF (execution failure)."""
    stuck_pending: bool = False
    """Pending operations never finish (until this is cleared, or a reset / output off)."""


class ItlaEmulator:
    """An emulated ITLA: a 4-byte frame in, a 4-byte reply out, with timed tuning.

    The laser covers ``channels`` channels from ``first_thz`` at ``spacing_ghz`` (that is its
    LFL..LFH range); the grid registers start on that grid, channel 1, output off.

    Timing, all from the caller's configuration: ``time_to_lock_s`` (a channel or fine-tune
    change with the output on), ``enable_time_s`` (output enable to stable light; default: the
    same as ``time_to_lock_s``), both plus ``U(0, lock_jitter_s)``, and ``startup_s``, the
    initialisation window after power-up or a module reset (MR) during which every command but
    a NOP read is refused with XE / CII. Real modules take seconds for each; the emulated
    testbed uses milliseconds and no start-up window.
    """

    def __init__(self, *, serial_number: str = "EMU-0001", first_thz: float = 193.1,
                 spacing_ghz: float = 100.0, channels: int = 48, time_to_lock_s: float = 0.001,
                 lock_jitter_s: float = 0.0, enable_time_s: float | None = None,
                 startup_s: float = 0.0, seed: int = 0, power_dbm: float = 10.0,
                 power_range_dbm: tuple[float, float] = (6.0, 13.5),
                 min_grid_ghz: float = 6.25, fine_tune_mhz: int = 6000,
                 manufacturer: str = "oddl emulated photonics", model: str = "ITLA-EMU-1",
                 clock: Callable[[], float] = time.monotonic,
                 faults: ItlaFaults | None = None) -> None:
        enable = time_to_lock_s if enable_time_s is None else enable_time_s
        times = {"time_to_lock_s": time_to_lock_s, "lock_jitter_s": lock_jitter_s,
                 "enable_time_s": enable, "startup_s": startup_s}
        bad = [f"{k}={v}" for k, v in times.items() if not (math.isfinite(v) and v >= 0)]
        if channels < 1 or spacing_ghz == 0 or bad:
            raise ConfigError(f"ITLA emulator: channels={channels}, spacing_ghz={spacing_ghz}"
                              f"{', ' if bad else ''}{', '.join(bad)}; expected channels >= 1, "
                              "a non-zero spacing and times >= 0 s")
        low_dbm, high_dbm = power_range_dbm
        if not low_dbm <= power_dbm <= high_dbm:
            raise ConfigError(f"ITLA emulator: power_dbm={power_dbm} is outside "
                              f"power_range_dbm={power_range_dbm}")
        first = round(first_thz * 1e6)
        last = first + (channels - 1) * round(spacing_ghz * 1e3)
        self.serial_number = serial_number
        self.timing = ItlaTiming(time_to_lock_s=time_to_lock_s, enable_time_s=enable,
                                 startup_s=startup_s, lock_jitter_s=lock_jitter_s)
        """The module's timing; a change applies from the next operation (startup_s: reset)."""
        self.faults = faults if faults is not None else ItlaFaults()
        self.on_change: Callable[[], None] | None = None
        """Called after every request (the emulated fabric recomputes where light goes)."""
        self._clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        strings = {"devtyp": "CW ITLA", "mfgr": manufacturer, "model": model,
                   "serno": serial_number, "mfgdate": "2024-01-01", "release": "1.3.0",
                   "relback": "1.0.0"}
        self._registers = ItlaRegisterModel(
            serial_number=serial_number, timing=self.timing,
            frequency_range_mhz=(min(first, last), max(first, last)),
            power_range=(round(low_dbm * 100), round(high_dbm * 100)),
            min_grid_mhz=round(min_grid_ghz * 1e3), fine_tune_mhz=fine_tune_mhz,
            defaults=(first, round(spacing_ghz * 1e3), round(power_dbm * 100)),
            strings=strings, clock=clock, rng=self._rng, faults=lambda: self.faults)

    # -- state --
    def reset(self) -> None:
        """Power-cycle: every register back to its power-on value, output off, MRL latched."""
        with self._lock:
            self._registers.power_on()
        logger.info("ITLA emulator %s: reset", self.serial_number)

    def inject(self, **changes: object) -> None:
        """Set fault fields by name (ConfigError for unknown names or bad values)."""
        with self._lock:
            self.faults = self.faults.merged(changes)
    # -- physical read-out and inspection --

    def optical_output(self, now: float | None = None) -> OpticalOutput | None:
        """The light out at `now` (default: the clock), or None when dark (off, pending, reset)."""
        with self._lock:
            light = self._registers.light(self._clock() if now is None else now)
        if light is None:
            return None
        mhz, power = light
        return OpticalOutput(mhz / 1e6, power / 100)

    def snapshot(self) -> dict[str, Any]:
        """The emulated state as plain values (for tests and logs)."""
        with self._lock:
            return self._registers.snapshot(self._clock())

    # -- frames --

    def handle_frame(self, frame: bytes) -> bytes | None:
        """Answer one 4-byte request (None: no answer). Any reply delay is ignored here."""
        return self.respond(frame)[0]

    def respond(self, frame: bytes) -> tuple[bytes | None, float]:
        """Answer one 4-byte request: (reply or None, seconds to wait before sending it)."""
        if self.on_change is None:
            return self._respond(frame)
        before = self._light_state()
        try:
            return self._respond(frame)
        finally:
            if self._light_state() != before:
                self.on_change()

    def _light_state(self) -> tuple[Any, ...]:
        """What the emitted light depends on (compared around a request: reads change none)."""
        with self._lock:
            return self._registers.light_state()

    def transitions(self, now: float) -> list[float]:
        """Future instants at which the light changes by itself (the end of a tuning)."""
        with self._lock:
            until = self._registers.pending_until()
        return [] if until is None or until <= now else [until]

    def _respond(self, frame: bytes) -> tuple[bytes | None, float]:
        if len(frame) != 4:
            raise ValueError(f"ITLA frames are 4 bytes, got {len(frame)}")
        with self._lock:
            f = self.faults
            delay = f.late_s
            if f.late_next > 0:
                f.late_next -= 1
                delay += f.late_next_s
            if f.reset_next:
                f.reset_next = False
                self._registers.power_on()
                logger.info("ITLA emulator %s: injected reset", self.serial_number)
                return None, 0.0
            if f.drop_answer(self._rng):
                return None, 0.0
            reply = self._registers.execute(frame, self._clock())
            if f.garble_answer(self._rng):
                return self._garbage(), delay
            if f.truncate > 0:
                f.truncate -= 1
                return reply[:2], delay
            return reply, delay

    def lose_bytes(self, data: bytes) -> bytes:
        """What of `data` reaches the module's UART (the ``lose_byte`` fault drops one byte)."""
        with self._lock:
            if self.faults.lose_byte > 0 and len(data) >= 2:
                self.faults.lose_byte -= 1
                logger.info("ITLA emulator %s: lost byte %02X of %s", self.serial_number,
                            data[1], data.hex(" "))
                return data[:1] + data[2:]
        return data

    def _garbage(self) -> bytes:
        raw = bytearray(self._rng.randbytes(4))
        if checksum_ok(bytes(raw)):
            raw[0] ^= 0x10  # make sure the checksum nibble is wrong
        return bytes(raw)



if __name__ == "__main__":  # the command line is itla_serve's
    raise SystemExit("the itla emulator's command is `python -m oddl.drivers.emulators.itla_serve` "
                     "(or `oddl emulate itla`)")
