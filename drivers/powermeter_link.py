"""The power meter's SCPI session over VISA: one exchange at a time, the error queue, resync.

``PowerMeterLink`` opens the pyvisa resource, sends commands and queries under a lock, turns
VISA failures into typed errors (``DeviceTimeout``, ``DeviceError``, ``ProtocolError``), checks
the error queue (SYST:ERR?) after each setting, and after a timeout or garbage makes sure no
late answer is taken for the next query (reconnect, or drain a wrapped resource). It also reads
IEEE-488.2 definite-length blocks. The meter's functions are ``oddl.drivers.powermeter.PowerMeter``, which holds its link.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import pyvisa
from pyvisa import constants
from pyvisa.errors import InvalidSession, VisaIOError
from pyvisa.resources import MessageBasedResource

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError
from oddl.common.tracing import TRACE
from oddl.drivers.command_trace import traced
from oddl.drivers.link_errors import CannotOpen, NoConnection

logger = logging.getLogger(__name__)

__all__ = ["DRAIN_QUIET_MS", "MAX_DRAIN_READS", "MAX_ERRORS_DRAINED", "PowerMeterLink"]

MAX_ERRORS_DRAINED = 64
DRAIN_QUIET_MS = 100
"""After a timeout, the link counts as clean once it stayed silent this long."""
MAX_DRAIN_READS = 256


def _open_resource(resource: str, backend: str, timeout_s: float,
                   name: str) -> tuple[pyvisa.ResourceManager, MessageBasedResource]:
    """Open `resource` with pyvisa `backend`: (its resource manager, the open resource)."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s={timeout_s}: use a positive number of seconds")
    try:
        rm = pyvisa.ResourceManager(backend)
        try:
            inst = rm.open_resource(resource, read_termination="\n", write_termination="\n",
                                    timeout=round(timeout_s * 1000))
        except Exception:
            rm.close()
            raise
    except Exception as exc:  # pyvisa-py raises a bare Exception when it cannot connect
        raise CannotOpen(f"cannot open {resource!r} ({exc}); check the resource string "
                          "in the testbed file and that the meter (or its emulator) is "
                          "running", device=name) from exc
    if not isinstance(inst, MessageBasedResource):
        inst.close()
        rm.close()
        raise DeviceError(f"{resource!r} is not a message-based VISA resource; use a "
                          "TCPIP SOCKET or INSTR resource", device=name)
    return rm, inst


class PowerMeterLink:
    """A SCPI session with a power meter on a pyvisa message-based resource.

    ``open`` opens a resource string (and can reconnect: ``reopen``); the constructor wraps a
    resource that is already open. `on_reconnect` is called whenever the session starts again
    (the meter drops what it cached of the instrument's settings).
    """

    def __init__(self, inst: MessageBasedResource, *, name: str, timeout_s: float,
                 on_reconnect: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self._on_reconnect = on_reconnect
        self.lock = threading.RLock()
        """Held through each exchange (command + its answer); hold it for a sequence."""
        self._inst: MessageBasedResource | None = inst
        self._resync = False
        self._resource_name: str | None = None
        self._backend: str | None = None
        self._rm: pyvisa.ResourceManager | None = None

    @classmethod
    def open(cls, resource: str, *, backend: str, timeout_s: float, name: str,
             on_reconnect: Callable[[], None] = lambda: None) -> PowerMeterLink:
        """Open `resource` with pyvisa `backend`; DeviceError if it cannot be opened."""
        rm, inst = _open_resource(resource, backend, timeout_s, name)
        link = cls(inst, name=name, timeout_s=timeout_s, on_reconnect=on_reconnect)
        link._resource_name, link._backend, link._rm = resource, backend, rm
        return link

    # ----- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the VISA session (the meter keeps its settings). Safe to call twice."""
        inst, self._inst = self._inst, None
        if inst is not None:
            try:
                inst.close()
            except (VisaIOError, InvalidSession, OSError):
                pass
        if self._rm is not None:
            try:
                self._rm.close()
            except (VisaIOError, OSError):
                pass
            self._rm = None

    def reopen(self) -> None:
        """Close and open the resource again (after the meter rebooted or the link dropped)."""
        if self._resource_name is None or self._backend is None:
            raise DeviceError("reopen() needs a meter opened from a resource string; open a "
                              "new pyvisa resource and use from_resource()", device=self.name)
        self.close()
        self._rm, self._inst = _open_resource(self._resource_name, self._backend, self.timeout_s,
                                              self.name)
        self._resync = False
        self._on_reconnect()

    # ----- wire access (the one place frames are logged) -------------------------------------

    def _require(self) -> MessageBasedResource:
        if self._inst is None:
            raise DeviceError("the meter is closed; open a new PowerMeter", device=self.name)
        return self._inst

    @contextmanager
    def _io(self, what: str) -> Iterator[None]:
        """Map VISA failures while doing `what` to typed errors; mark the link for resync."""
        try:
            yield
        except VisaIOError as exc:
            self._resync = True
            if exc.error_code == constants.StatusCode.error_timeout:
                raise DeviceTimeout(f"no answer to {what!r} within {self.timeout_s:g} s; check "
                                    "that the meter is on and reachable", device=self.name
                                    ) from exc
            raise DeviceError(f"{what!r} failed: {exc.description}", device=self.name) from exc
        except UnicodeDecodeError as exc:
            self._resync = True
            raise ProtocolError(f"answer to {what!r} is not ASCII ({exc}); the link carries "
                                "garbage", device=self.name) from exc
        except (InvalidSession, OSError) as exc:
            self._resync = True
            where = self._resource_name or "the resource"
            raise NoConnection(f"{what!r} failed, no connection to {where} ({exc}); check that "
                               "the meter (or its emulator) is running, then call reopen()",
                               device=self.name) from exc

    def _sync(self) -> None:
        """After a timeout or garbage, make sure no late answer is taken for the next one.

        A meter opened from a resource string reconnects, so answers still in flight go to
        the old connection. A wrapped resource is drained instead (read until the link is quiet
        for DRAIN_QUIET_MS), which misses an answer that comes later still. Not viClear:
        pyvisa-py's clear spins forever on a socket the peer has closed.
        """
        if not self._resync:
            return
        inst = self._require()
        if self._resource_name is not None:
            logger.warning("%s: reconnecting to drop late answers", self.name)
            self.reopen()
            return
        saved = inst.timeout
        inst.timeout = DRAIN_QUIET_MS
        try:
            for _ in range(MAX_DRAIN_READS):
                try:
                    stale = inst.read_raw()
                except VisaIOError as exc:
                    if exc.error_code == constants.StatusCode.error_timeout:
                        break
                    raise DeviceError(f"draining a late answer failed: {exc.description}",
                                      device=self.name) from exc
                logger.debug("%s: discarded late answer %r", self.name, stale)
        except (InvalidSession, OSError) as exc:
            raise DeviceError(f"connection lost ({exc}); call reopen()",
                              device=self.name) from exc
        finally:
            with suppress(VisaIOError, InvalidSession, OSError):
                inst.timeout = saved
        self._resync = False

    def write(self, command: str) -> None:
        """Send one SCPI command line without checking the error queue."""
        with self.lock:
            self._require()
            self._sync()
            inst = self._require()
            logger.debug("%s >> %s", self.name, command)
            with self._io(command):
                inst.write(command)

    def _read(self, command: str, extra_s: float = 0.0) -> str:
        inst = self._require()
        with self._io(command):
            if extra_s > 0:  # the answer comes after the measurement (READ?)
                inst.timeout = round((self.timeout_s + extra_s) * 1000)
            try:
                answer = inst.read()
            finally:
                if extra_s > 0:
                    with suppress(VisaIOError, InvalidSession, OSError):
                        inst.timeout = round(self.timeout_s * 1000)
        logger.debug("%s << %s", self.name, answer)
        return answer.strip()

    def _query(self, command: str, *, explain_timeout: bool, extra_s: float = 0.0) -> str:
        with self.lock:
            self.write(command)
            try:
                return self._read(command, extra_s)
            except DeviceTimeout as timeout:
                if not explain_timeout:
                    raise
                try:
                    refused = self.errors()
                except DeviceError:
                    raise timeout from None
                if refused:
                    raise DeviceError(f"{command!r} refused by the meter: "
                                      f"{self._describe(refused)}", device=self.name
                                      ) from timeout
                raise

    def query(self, command: str) -> str:
        """Send a SCPI query and return the answer line (stripped)."""
        if not TRACE.on:
            return self._query(command, explain_timeout=True)
        return traced(self.name, f"meter {command}",
                      lambda: self._query(command, explain_timeout=True))

    def command(self, command: str) -> None:
        """Send a SCPI setting, then raise DeviceError if the meter queued an error for it."""
        with self.lock:
            self.write(command)
            refused = self.errors()
        if refused:
            raise DeviceError(f"{command!r} refused by the meter: {self._describe(refused)}",
                              device=self.name)

    @staticmethod
    def _describe(errors: list[tuple[int, str]]) -> str:
        return "; ".join(f'{code},"{message}"' for code, message in errors)

    def errors(self) -> list[tuple[int, str]]:
        """Drain the meter's error queue (SYST:ERR?) and return (code, message) pairs."""
        found: list[tuple[int, str]] = []
        for _ in range(MAX_ERRORS_DRAINED):
            with self.lock:
                answer = self._query(":SYST:ERR?", explain_timeout=False)
            code_text, sep, message = answer.partition(",")
            try:
                code = int(code_text)
            except ValueError:
                code = None
            if code is None or not sep:
                self._resync = True
                raise ProtocolError(f"SYST:ERR? answered {answer!r}; expected "
                                    '<code>,"<message>"', device=self.name)
            if code == 0:
                return found
            found.append((code, message.strip().strip('"')))
        raise ProtocolError(f"error queue still not empty after {MAX_ERRORS_DRAINED} reads",
                            device=self.name)

    def resync_before_next(self) -> None:
        """An answer made no sense: drop late answers before the next exchange."""
        self._resync = True

    def query_block(self, command: str) -> bytes:
        """Send a query answered by an IEEE-488.2 block of float32 values; return its payload."""
        with self.lock:
            self.write(command)
            return self._read_block(command)

    def number(self, command: str, extra_s: float = 0.0) -> float:
        """Send a query answered by one finite number (`extra_s`: a measurement's time)."""
        answer = self._query(command, explain_timeout=True, extra_s=extra_s)
        try:
            value = float(answer)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            self._resync = True
            raise ProtocolError(f"{command!r} answered {answer!r}; expected a number",
                                device=self.name)
        return value

    def _read_block(self, command: str) -> bytes:
        """Read one IEEE-488.2 definite-length block of float32 values and its newline."""
        inst = self._require()
        with self._io(command):
            head = inst.read_bytes(2, break_on_termchar=False)
            if head[:1] != b"#" or not head[1:2].isdigit() or head[1:2] == b"0":
                self._resync = True
                raise ProtocolError(f"{command!r} answered {head!r}...; expected an IEEE-488.2 "
                                    "definite-length block", device=self.name)
            digits = inst.read_bytes(int(head[1:2]), break_on_termchar=False)
            if not digits.isdigit():
                self._resync = True
                raise ProtocolError(f"{command!r}: bad block length {digits!r}",
                                    device=self.name)
            length = int(digits)
            payload = inst.read_bytes(length, break_on_termchar=False) if length else b""
            end = inst.read_bytes(1, break_on_termchar=False)
        logger.debug("%s << block of %d bytes", self.name, length)
        if end != b"\n" or length % 4:
            self._resync = True
            raise ProtocolError(f"{command!r}: block of {length} bytes ends with {end!r}; "
                                "expected whole float32 values and a newline",
                                device=self.name)
        return payload
