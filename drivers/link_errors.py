"""Typed errors for a device link that cannot carry exchanges at all (as opposed to a device
that answers wrongly or late): callers such as ``oddl probe`` branch on these types."""

from __future__ import annotations

from oddl.common.errors import DeviceError

__all__ = ["CannotOpen", "NoConnection"]


class CannotOpen(DeviceError):
    """The device's resource (serial port, socket URL, VISA resource) could not be opened."""


class NoConnection(DeviceError):
    """The connection to an opened device failed (the peer closed it, the session is gone)."""
