"""Shared test doubles."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivers.emulators.wss import WssEmulator

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


class Optics:
    """A mutable stand-in for the lasers and WSS in front of a power meter: dBm per meter
    channel (`dbm`), None or absent = dark; call it as the meter's power source."""

    def __init__(self) -> None:
        self.dbm: dict[int, float | None] = {}

    def __call__(self, channel: int) -> float | None:
        return self.dbm.get(channel)


def lab_wss(**kw: Any) -> WssEmulator:
    """A WSS emulator on the emulated testbed's plan; `kw` adds or overrides arguments."""
    from drivers.emulators.wss import WssEmulator

    return WssEmulator(**{**LAB_WSS_PLAN, **kw})
