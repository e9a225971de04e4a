"""What the controller needs from each kind of device, whatever its wire protocol.

The device manager only talks to these interfaces; each real driver implements one of them.
Frequencies are in THz, powers in dBm, attenuations in dB, times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

BLOCKED_DB = 99.9
"""WSS attenuation that means 'channel blocked' (flexgrid WSS convention)."""

BLOCKED_PORT = 99
"""WSS out-port that means 'channel blocked by port' (flexgrid WSS convention)."""


@dataclass(frozen=True)
class DeviceIdentity:
    """What a device says about itself."""

    kind: str
    manufacturer: str
    model: str
    serial_number: str
    extra: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TransceiverState:
    """Read-back state of a tunable transmitter."""

    channel: int
    frequency_thz: float
    power_dbm: float
    output_enabled: bool
    locked: bool


@dataclass(frozen=True)
class Route:
    """Where a WSS sends one channel: out-port and attenuation (BLOCKED_DB = blocked)."""

    port: int
    attenuation_db: float = 0.0

    @property
    def blocked(self) -> bool:
        """True when this route carries no light."""
        return self.attenuation_db >= BLOCKED_DB or self.port in (0, BLOCKED_PORT)


@runtime_checkable
class TunableTransceiver(Protocol):
    """A tunable laser / transmitter on a fixed frequency grid."""

    name: str

    def identify(self) -> DeviceIdentity:
        """Read the identity strings."""

    def configure_grid(self, first_thz: float, spacing_ghz: float) -> None:
        """Set the first-channel frequency and grid spacing (output must be off)."""

    def set_channel(self, channel: int, timeout: float = 5.0) -> float:
        """Tune to `channel`, wait until locked, and return the measured time-to-lock (s)."""

    def set_power_dbm(self, dbm: float) -> None:
        """Set the output power set-point."""

    def enable_output(self, timeout: float = 5.0) -> None:
        """Switch the optical output on and wait until it is stable."""

    def disable_output(self, timeout: float = 5.0) -> None:
        """Switch the optical output off."""

    def state(self) -> TransceiverState:
        """Read channel, frequency, power, output and lock state back from the device."""

    def close(self) -> None:
        """Release the link; the optical state is left as it is."""


@runtime_checkable
class WavelengthSelectiveSwitch(Protocol):
    """A 1xK WSS whose active table maps channels to out-ports and attenuations."""

    name: str

    def identify(self) -> DeviceIdentity:
        """Read the identity strings."""

    def stage(self, table: dict[int, Route]) -> None:
        """Load `table` as the staged (not yet active) configuration."""

    def apply(self, timeout: float = 5.0) -> None:
        """Make the staged table active and wait until the optics have settled."""

    def read_active(self) -> dict[int, Route]:
        """Read the active channel table back from the device."""

    def close(self) -> None:
        """Release the link; the optical state is left as it is."""
