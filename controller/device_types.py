"""What the device manager takes and gives: a ``Configuration``, a ``TransactionError`` when one
could not be applied, and the ``DeviceEvent`` entries of its log."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from oddl.common.errors import DeviceError
from oddl.drivers.interfaces import Route

__all__ = ["Configuration", "DeviceEvent", "TransactionError", "describe_change"]


class TransactionError(DeviceError):
    """A configuration could not be applied; `report` says what happened to every device."""

    def __init__(self, message: str, report: list[str]):
        super().__init__(message + "\n  " + "\n  ".join(report) if report else message)
        self.report = report


@dataclass(frozen=True)
class Configuration:
    """Target state: transmitter → channel, WSS → {channel: Route}, and each optical circuit
    switch's cross-connects, switch → {ingress port: egress port} (the unit's numbering:
    ingress 1..N, egress N+1..2N). In a change, a switch's map names the ingress ports it
    sets; egress `0` disconnects that ingress port."""

    channels: Mapping[str, int] = field(default_factory=dict)
    wss_tables: Mapping[str, Mapping[int, Route]] = field(default_factory=dict)
    connections: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    def merged_over(self, base: Configuration) -> Configuration:
        """This configuration with everything it does not name taken from `base`."""
        tables = {w: dict(t) for w, t in base.wss_tables.items()}
        for w, t in self.wss_tables.items():
            tables.setdefault(w, {}).update(t)
        connections = {s: dict(c) for s, c in base.connections.items()}
        for s, c in self.connections.items():
            table = connections.setdefault(s, {})
            table.update(c)
            for ingress in [i for i, e in table.items() if e == 0]:
                del table[ingress]
        return Configuration({**base.channels, **self.channels}, tables, connections)


@dataclass
class DeviceEvent:
    """One entry of the device log."""

    time_ns: int
    device: str
    action: str
    ok: bool
    detail: str = ""

def describe_change(before: Configuration, after: Configuration) -> str:
    """What `after` changes over `before`, e.g. 'tx0 ch 3→5, wss0 table' (or 'no change')."""
    changes = [f"{tx} ch {before.channels.get(tx)}→{ch}" for tx, ch in after.channels.items()
               if before.channels.get(tx) != ch]
    changes += [f"{w} table" for w, t in after.wss_tables.items()
                if dict(t) != dict(before.wss_tables.get(w, {}))]
    changes += [f"{s} connections" for s, c in after.connections.items()
                if dict(c) != dict(before.connections.get(s, {}))]
    return ", ".join(changes) or "no change"
