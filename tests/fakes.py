"""Shared test doubles."""

from __future__ import annotations


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
