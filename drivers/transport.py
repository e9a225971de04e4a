"""Byte transports that drivers talk through: any pyserial URL, logged frame by frame.

A driver never opens a port itself; it receives a `Transport`. `open_serial` accepts every
`serial.serial_for_url` form: `/dev/ttyUSB0`, `socket://127.0.0.1:5001`, `rfc2217://…`,
`loop://`. Wire frames are logged at DEBUG from this one place, tagged with the device name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import serial

from oddl.common.errors import DeviceError, DeviceTimeout
from oddl.common.file_access import current_user, is_permission_error, permission_advice
from oddl.drivers.link_errors import CannotOpen

logger = logging.getLogger(__name__)


class Transport(Protocol):
    """What a driver needs from a byte link."""

    name: str

    def write(self, data: bytes) -> None:
        """Send all of `data`."""

    def read_exact(self, n: int, timeout: float) -> bytes:
        """Read exactly `n` bytes or raise DeviceTimeout."""

    def read_line(self, timeout: float, terminator: bytes = b"\n") -> bytes:
        """Read up to and including `terminator` or raise DeviceTimeout."""

    def reset_input(self) -> None:
        """Discard bytes already received and not read."""

    def close(self) -> None:
        """Release the link."""


class OwnedTransport:
    """A driver's own link: its `Transport`, the lock held through each exchange, and whether
    the driver closed it.

    ``held()`` holds the lock for one exchange or a sequence of them and refuses a closed link;
    ``close()`` closes the transport once (safe to call twice).
    """

    def __init__(self, transport: Transport, name: str) -> None:
        self.transport = transport
        self.name = name
        self.lock = threading.RLock()
        self.closed = False

    @contextmanager
    def held(self) -> Iterator[Transport]:
        """Hold the link; DeviceError when it was closed."""
        with self.lock:
            if self.closed:
                raise DeviceError("the link is closed; open a new driver", device=self.name)
            yield self.transport

    def close(self) -> None:
        """Release the link; the device's state is left as it is. Safe to call twice."""
        with self.lock:
            if not self.closed:
                self.closed = True
                self.transport.close()
                logger.debug("%s: link closed", self.name)


def open_failure(url: str, exc: BaseException) -> str:
    """Why a serial port did not open, and the fix: its permissions when errno says so."""
    if is_permission_error(exc):
        advice = permission_advice(url, current_user()) if url.startswith("/") else ""
        return (f"cannot open {url!r}: permission denied ({exc}); "
                + (advice or f"the user running this ({current_user()}) may not open it: "
                   "check its owner, group and mode (ls -lL) and the user's groups"))
    return (f"cannot open {url!r} ({exc}); check the resource in the testbed file and "
            "that the device (or its emulator) is running")


class SerialTransport:
    """A pyserial link (any `serial_for_url` URL) with frame logging and typed timeouts."""

    def __init__(self, url: str, *, name: str = "", baudrate: int = 9600, timeout: float = 0.25):
        self.name = name or url
        self.url = url
        self.lock = threading.RLock()
        self._pending = bytearray()  # bytes received beyond the last line
        try:
            self._port = serial.serial_for_url(url, baudrate=baudrate, timeout=timeout)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise CannotOpen(open_failure(url, exc), device=self.name) from exc

    def write(self, data: bytes) -> None:
        """Send all of `data` (logged at DEBUG); DeviceError when the port fails."""
        logger.debug("%s >> %s", self.name, data.hex(" "))
        try:
            self._port.write(data)
            self._port.flush()
        except (serial.SerialException, OSError) as exc:
            raise DeviceError(f"write failed on {self.url}: {exc}", device=self.name) from exc

    def _read_some(self, remaining: float) -> bytes:
        """Block for one byte (up to `remaining` s), then take whatever else is waiting."""
        try:
            self._port.timeout = remaining
            first = self._port.read(1)
            if not first:
                return b""
            self._port.timeout = 0
            return first + self._port.read(4096)
        except (serial.SerialException, OSError) as exc:
            raise DeviceError(f"read failed on {self.url}: {exc}", device=self.name) from exc

    def read_exact(self, n: int, timeout: float) -> bytes:
        """Read exactly `n` bytes within `timeout` s or raise DeviceTimeout."""
        deadline = time.monotonic() + timeout
        buf = bytearray(self._pending[:n])
        del self._pending[:n]
        while len(buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeviceTimeout(
                    f"no answer within {timeout * 1000:.0f} ms (got {len(buf)} of {n} bytes); "
                    "check cabling, baud rate and that the device is powered",
                    device=self.name,
                )
            self._port.timeout = remaining
            try:
                chunk = self._port.read(n - len(buf))
            except (serial.SerialException, OSError) as exc:
                raise DeviceError(f"read failed on {self.url}: {exc}", device=self.name) from exc
            buf += chunk
        logger.debug("%s << %s", self.name, bytes(buf).hex(" "))
        return bytes(buf)

    def read_line(self, timeout: float, terminator: bytes = b"\n") -> bytes:
        """Read up to and including `terminator` within `timeout` s or raise DeviceTimeout."""
        deadline = time.monotonic() + timeout
        buf = self._pending
        while (end := buf.find(terminator)) < 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                got = bytes(buf)
                buf.clear()
                raise DeviceTimeout(
                    f"no complete line within {timeout * 1000:.0f} ms (got {got!r}); "
                    "check cabling, baud rate and that the device is powered",
                    device=self.name,
                )
            buf += self._read_some(remaining)
        line = bytes(buf[:end + len(terminator)])
        del buf[:end + len(terminator)]
        logger.debug("%s << %r", self.name, line)
        return line

    def reset_input(self) -> None:
        """Discard bytes already received and not read."""
        self._pending.clear()
        try:
            self._port.reset_input_buffer()
        except (serial.SerialException, OSError):  # a closed socket cannot be drained
            pass

    def close(self) -> None:
        """Close the port (errors from a port already gone are ignored)."""
        try:
            self._port.close()
        except (serial.SerialException, OSError):
            pass
