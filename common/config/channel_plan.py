"""A WSS module's own fixed-grid channel plan, and the map from the testbed's channels to it.

The controller, the scheduler and the operator name channels by the testbed's grid (channel
``n`` at ``[grid] first_thz + (n-1)·spacing``). A WSS module numbers its channels by its own
plan: a module in its factory fixed grid numbers from 0 at 50 GHz (docs/reference/devices/wss.md). A
testbed file states that plan per switch (``module_plan``), and the driver sends each testbed
channel as the module channel centred on the same frequency. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FixedPlan", "UnmappedChannel", "channel_map"]

MATCH_GHZ = 1.0
"""How far (GHz) a module channel's centre may sit from a testbed channel's and still be it."""


@dataclass(frozen=True)
class FixedPlan:
    """A fixed-grid channel plan: numbers ``first_channel ..`` centred every `spacing_ghz`."""

    first_channel: int
    first_thz: float
    spacing_ghz: float
    channels: int

    @property
    def last_channel(self) -> int:
        """The highest channel number of the plan."""
        return self.first_channel + self.channels - 1

    def centre_thz(self, channel: int) -> float:
        """Centre frequency (THz) of `channel`."""
        return self.first_thz + (channel - self.first_channel) * self.spacing_ghz / 1000.0

    def contains(self, channel: int) -> bool:
        """Whether `channel` is one of the plan's channels."""
        return self.first_channel <= channel <= self.last_channel

    def window_thz(self) -> tuple[float, float]:
        """Low and high edge of the plan's passbands."""
        half = self.spacing_ghz / 2000.0
        return self.first_thz - half, self.centre_thz(self.last_channel) + half

    def channel_at(self, thz: float, tolerance_ghz: float = MATCH_GHZ) -> int | None:
        """The channel centred within `tolerance_ghz` of `thz`, or None."""
        n = self.first_channel + round((thz - self.first_thz) * 1000.0 / self.spacing_ghz)
        if not self.contains(n) or abs(self.centre_thz(n) - thz) * 1000.0 > tolerance_ghz:
            return None
        return n

    def describe(self) -> str:
        """``channels 0..95, 191.3500-196.1000 THz every 50 GHz``."""
        return (f"channels {self.first_channel}..{self.last_channel}, "
                f"{self.first_thz:.4f}-{self.centre_thz(self.last_channel):.4f} THz "
                f"every {self.spacing_ghz:g} GHz")


@dataclass(frozen=True)
class UnmappedChannel:
    """A testbed channel whose frequency is the centre of no channel of the module's plan."""

    channel: int
    thz: float


def channel_map(testbed: FixedPlan, allowed: tuple[int, int], module_plan: FixedPlan
                ) -> tuple[dict[int, int], list[UnmappedChannel]]:
    """Map the `allowed` channels (low, high) of the `testbed` grid onto `module_plan`'s.

    Returns the map (testbed channel → module channel) and the testbed channels with no module
    channel at their frequency, in order.
    """
    mapped: dict[int, int] = {}
    missing: list[UnmappedChannel] = []
    for ch in range(allowed[0], allowed[1] + 1):
        thz = testbed.centre_thz(ch)
        module = module_plan.channel_at(thz)
        if module is None:
            missing.append(UnmappedChannel(ch, thz))
        else:
            mapped[ch] = module
    return mapped, missing
