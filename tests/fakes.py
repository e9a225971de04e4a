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
