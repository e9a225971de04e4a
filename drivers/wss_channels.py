"""Testbed channel numbers on the wire of a WSS module that numbers its channels by its own plan.

The testbed file's ``module_plan`` (``oddl.common.config.channel_plan``) gives, per switch, the
map testbed channel → module channel (same centre frequency). :class:`ChannelNumbering` applies
it to route tables on their way out and to read-backs on their way in. Pure: no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from oddl.drivers.interfaces import Route
from oddl.drivers.wss_codec import InvalidRouteTable

logger = logging.getLogger(__name__)

__all__ = ["ChannelNumbering"]


class ChannelNumbering:
    """One WSS's channel numbering: the identity, or a map from the testbed's channels."""

    def __init__(self, name: str, channel_map: Mapping[int, int] | None = None) -> None:
        self.name = name
        self.map = dict(channel_map) if channel_map is not None else None
        self._unmap = {m: c for c, m in self.map.items()} if self.map is not None else None
        if self.map is not None and len(self._unmap or {}) != len(self.map):
            raise InvalidRouteTable(f"{name}: two testbed channels map onto one module channel")
        self.unmapped_active: dict[int, Route] = {}
        """Module channels of the last read-back that are no testbed channel and pass light."""

    def to_module(self, table: Mapping[int, Route]) -> Mapping[int, Route]:
        """`table` in the module's channel numbers (InvalidRouteTable for an unmapped channel)."""
        if self.map is None:
            return table
        missing = sorted(set(table) - set(self.map))
        if missing:
            raise InvalidRouteTable(
                f"{self.name}: testbed channel {missing[0]} has no channel on the module's plan; "
                f"use channels {min(self.map)}..{max(self.map)} or widen channels_allowed "
                "(module_plan in the testbed file)")
        return {self.map[ch]: route for ch, route in table.items()}

    def from_module(self, active: dict[int, Route]) -> dict[int, Route]:
        """A read-back in testbed channel numbers. Module channels outside the map that pass
        light (not blocked) are kept in `unmapped_active` and logged when they change."""
        if self._unmap is None:
            return active
        unmapped = {m: r for m, r in active.items() if m not in self._unmap and not r.blocked}
        if unmapped != self.unmapped_active:
            logger.info("%s: module channels that are no testbed channel and pass light: %s",
                        self.name, sorted(unmapped) if unmapped else "none")
        self.unmapped_active = unmapped
        return {self._unmap[m]: r for m, r in active.items() if m in self._unmap}

    def refuse_plan_change(self, command: str) -> None:
        """Under a map, a plan change (CHW, DCC) would make the map wrong: refuse it."""
        if self.map is not None:
            raise InvalidRouteTable(
                f"{self.name}: {command} changes the module's channel plan, which the testbed "
                "file's module_plan describes; open the module without module_plan to change it")
