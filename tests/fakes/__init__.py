"""Shared test doubles."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pyvisa import constants
from pyvisa.errors import VisaIOError

from oddl.common.errors import DeviceTimeout

if TYPE_CHECKING:
    from oddl.drivers.emulators.wss import WssEmulator

LAB_WSS_PLAN = {"first_channel": 1, "first_thz": 193.1, "spacing_ghz": 100.0, "channels": 48}
"""The emulated testbed's WSS plan (channels 1..48 every 100 GHz from 193.1 THz)."""


class FakeClock:
    """A clock the test advances by hand (`advance`), or that moves only when the code under
    test sleeps (`sleep`)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt

    sleep = advance


class JumpClock:
    """A real clock (time.monotonic) the test can jump forward (`jump`): for code that must
    also see time pass by itself, e.g. a published client polling a device."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def jump(self, seconds: float) -> None:
        self.offset += seconds


class Optics:
    """A mutable stand-in for the lasers and WSS in front of a power meter: dBm per meter
    channel (`dbm`), None or absent = dark; call it as the meter's power source."""

    def __init__(self) -> None:
        self.dbm: dict[int, float | None] = {}

    def __call__(self, channel: int) -> float | None:
        return self.dbm.get(channel)


def lab_wss(**kw: Any) -> WssEmulator:
    """A WSS emulator on the emulated testbed's plan; `kw` adds or overrides arguments."""
    from oddl.drivers.emulators.wss import WssEmulator

    return WssEmulator(**{**LAB_WSS_PLAN, **kw})


class ScriptedWire:
    """A scripted device link, after PyMeasure's ``expected_protocol``: a list of (written,
    reply) byte pairs. Every write must be the next expected one (else the test fails); its
    reply (None or b"": silence) then becomes readable. ``assert_all_consumed`` fails on
    pairs never written and on reply bytes never read.

    It is a ``oddl.drivers.transport.Transport`` (ITLA frames, WSS lines); ``visa()`` gives the
    same script as a pyvisa message-based resource (the power meter). Like the serial
    transport, a read that times out loses the bytes it had.
    """

    def __init__(self, pairs: Iterable[tuple[bytes, bytes | None]],
                 name: str = "scripted") -> None:
        self.name = name
        self.closed = False
        self.resets = 0
        """How many times the reader discarded pending input (``reset_input``)."""
        self._pairs = list(pairs)
        self._pending = bytearray()

    def write(self, data: bytes) -> None:
        assert self._pairs, f"unexpected write {data!r}: the script is used up"
        expected, reply = self._pairs.pop(0)
        assert data == expected, f"sent {data!r}, the script expected {expected!r}"
        self._pending += reply or b""

    def take(self, n: int) -> bytes | None:
        """The next `n` reply bytes, or None (and the bytes that were there are lost)."""
        if len(self._pending) < n:
            self._pending.clear()
            return None
        out = bytes(self._pending[:n])
        del self._pending[:n]
        return out

    def take_line(self, terminator: bytes) -> bytes | None:
        """The reply bytes up to and including `terminator`, or None (they are lost)."""
        end = self._pending.find(terminator)
        return self.take(len(self._pending) + 1 if end < 0 else end + len(terminator))

    def read_exact(self, n: int, timeout: float) -> bytes:
        out = self.take(n)
        if out is None:
            raise DeviceTimeout(f"scripted: fewer than {n} reply bytes", device=self.name)
        return out

    def read_line(self, timeout: float, terminator: bytes = b"\n") -> bytes:
        out = self.take_line(terminator)
        if out is None:
            raise DeviceTimeout("scripted: no complete line left", device=self.name)
        return out

    def reset_input(self) -> None:
        self.resets += 1
        self._pending.clear()

    def close(self) -> None:
        self.closed = True

    def visa(self) -> ScriptedVisaResource:
        """This script as a pyvisa resource (lines end in LF both ways)."""
        return ScriptedVisaResource(self)

    def assert_all_consumed(self) -> None:
        assert not self._pairs, f"script pairs never written: {self._pairs!r}"
        assert not self._pending, f"reply bytes never read: {bytes(self._pending)!r}"


class ScriptedVisaResource:
    """A `ScriptedWire` seen as a pyvisa message-based resource; timeouts are VisaIOError."""

    def __init__(self, wire: ScriptedWire) -> None:
        self.wire = wire
        self.timeout = 1000.0

    @property
    def closed(self) -> bool:
        return self.wire.closed

    def write(self, message: str) -> int:
        self.wire.write(message.encode("ascii") + b"\n")
        return len(message)

    def read_raw(self) -> bytes:
        line = self.wire.take_line(b"\n")
        if line is None:
            raise VisaIOError(constants.StatusCode.error_timeout)
        return line

    def read(self) -> str:
        return self.read_raw()[:-1].decode("ascii")

    def read_bytes(self, count: int, break_on_termchar: bool = False) -> bytes:
        out = self.wire.take(count)
        if out is None:
            raise VisaIOError(constants.StatusCode.error_timeout)
        return out

    def close(self) -> None:
        self.wire.close()

    def assert_all_consumed(self) -> None:
        self.wire.assert_all_consumed()
