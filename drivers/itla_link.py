"""The ITLA transaction layer: one request/reply exchange at a time, with link recovery.

``ItlaLink`` sends a frame and reads its reply under a lock; XE is turned into an
``ItlaExecutionError`` carrying the NOP error code (CII, "initialising", is retried for
``ItlaTimeouts.startup_s``); corrupt replies are retried with the LstRsp bit (the module resends
its last reply instead of executing the command again); silence or a shifted frame boundary is
recovered by single NOP bytes (``resync()``); a module that answers none of them is a
``DeviceTimeout``. On top of the exchanges it reads and writes registers by name, AEA strings
and words, and waits for pending operations. The laser itself (tuning, power, output) is
``oddl.drivers.itla.ItlaDriver``. Rules and sources: docs/reference/devices/itla.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Self

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError
from oddl.drivers.command_trace import traced
from oddl.drivers.itla_frames import (
    FRAME_LEN,
    NOP_ERROR_MASK,
    PENDING_MASK,
    Reply,
    Status,
    decode_reply,
    encode_request,
)
from oddl.drivers.itla_registers import Access, ItlaExecutionError, Register, nop_error, register
from oddl.drivers.itla_timeouts import ItlaTimeouts
from oddl.drivers.transport import OwnedTransport, Transport

logger = logging.getLogger(__name__)

__all__ = ["ItlaLink"]

_NOP = register("NOP")
_EAR = register("EAR")
_RESENA = register("ResEna")


class _Silent(Exception):
    """No complete reply came back for one attempt (nothing, or only part of a frame)."""


class _Damaged(Exception):
    """A reply came back with a bad checksum: the module answered, ask for it again (LstRsp)."""


class _RequestRefused(_Damaged):
    """The reply has CE set: the module saw a bad checksum in the request and did not run it."""


class ItlaLink:
    """Request/reply exchanges with an OIF ITLA module behind `transport`, and its registers.

    One lock covers each request/reply exchange (and multi-frame sequences such as string
    reads), so a link can be shared between threads.

    Link recovery: a reply with a bad checksum is fetched again with the LstRsp bit; a CE reply
    (the module saw a bad checksum) resends the request once. Silence, a partial reply, a
    second CE or replies for the wrong register mean the frame boundary may have slipped (a
    byte lost on the wire): the link resynchronises the way the MSA and vendors describe, by
    sending single NOP bytes (0x00) until a 4-byte reply comes back, then repeats the request
    (a write is first read back, so a write whose reply was lost is not executed twice).
    """

    def __init__(self, transport: Transport, name: str = "itla", *,
                 timeout_s: float | None = None, retries: int = 2,
                 poll_interval_s: float = 0.01, timeouts: ItlaTimeouts | None = None,
                 recover_link: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.timeouts = replace(timeouts) if timeouts is not None else ItlaTimeouts()
        """This link's own copy: changing it changes no other link."""
        if timeout_s is not None:
            self.timeouts = replace(self.timeouts, reply_s=timeout_s)
        self.name = name
        self.retries = retries
        self.recover_link = recover_link
        """False: no resynchronisation, silence is a DeviceTimeout at once (for probing a
        port at several baud rates, where nothing is framed anyway)."""
        self.poll_interval_s = poll_interval_s
        self.resyncs = 0
        """How many times the link was resynchronised (single NOP bytes)."""
        self.clock = clock
        """The link's time source (seconds); the driver measures its waits with it too."""
        self._port = OwnedTransport(transport, name)
        self._sleep = sleep
        self._absent: set[int] = set()  # optional registers this module answered RNI for

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the link; the laser's state is left as it is. Safe to call twice."""
        self._port.close()

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._port.closed

    def pause(self) -> None:
        """Sleep one poll interval (between polls of a pending operation)."""
        self._sleep(self.poll_interval_s)

    @property
    def timeout_s(self) -> float:
        """Reply timeout of one exchange, seconds (``timeouts.reply_s``)."""
        return self.timeouts.reply_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self.timeouts.reply_s = value

    # -- exchanges --

    def locked(self) -> AbstractContextManager[Transport]:
        """Hold the link for one exchange or a sequence (DeviceError once it is closed)."""
        return self._port.held()

    def _transact(self, reg: Register, data: int, write: bool) -> Reply:
        """Send one request and return its reply, recovering the link (no XE handling)."""
        request = encode_request(reg.address, data, write)
        op = f"write {reg.name}={data}" if write else f"read {reg.name}"
        resend = request
        problems: list[str] = []
        ce_seen = False
        for attempt in range(self.retries + 1):
            self._port.transport.reset_input()
            self._port.transport.write(resend)
            try:
                reply = self._read_reply(reg.address)
            except _Silent as exc:
                problems.append(str(exc))
                logger.warning("%s: %s attempt %d: %s", self.name, op, attempt + 1, exc)
                if not self.recover_link:
                    raise DeviceTimeout(
                        f"no reply to {op} within {self.timeout_s * 1000:.0f} ms; check the "
                        "cable, the baud rate and that the laser (or its emulator) is powered "
                        "and running", device=self.name) from None
                if not self.resync():
                    raise DeviceTimeout(
                        f"no reply to {op} within {self.timeout_s * 1000:.0f} ms, nor to "
                        f"{FRAME_LEN} single NOP bytes; check the cable, the baud rate and that "
                        "the laser (or its emulator) is powered and running",
                        device=self.name) from None
                if write and (done := self._already_written(reg, data)) is not None:
                    return done
                resend = request
                continue
            except _Damaged as exc:
                damage = exc
            else:
                if attempt:
                    logger.info("%s: %s recovered after %d retries", self.name, reg.name, attempt)
                return reply
            problems.append(str(damage))
            logger.warning("%s: %s attempt %d: %s", self.name, op, attempt + 1, damage)
            if isinstance(damage, _RequestRefused) and not ce_seen:
                # The module did not execute the request: send it again as it was.
                ce_seen = True
                resend = request
            elif isinstance(damage, _RequestRefused):
                # CE again: most likely a byte was lost and the module's frames are shifted.
                if self.recover_link:
                    self.resync()
                    if write and (done := self._already_written(reg, data)) is not None:
                        return done
                resend = request
            else:
                # The module answered but the reply was damaged: ask for that answer again
                # (LstRsp), so a write is never executed twice.
                resend = encode_request(reg.address, data, write, last_response=True)
        if self.recover_link:
            self.resync()  # leave the link framed for the next command
        raise ProtocolError(
            f"{len(problems)} exchanges for {op} failed ({'; '.join(problems)}); check the "
            "baud rate, cable and grounding; a write may or may not have been executed, so "
            "read the register back", device=self.name)

    def resync(self) -> bool:
        """Re-establish framing: send single NOP bytes (0x00), each followed by one reply
        timeout, until a 4-byte reply arrives (at most 4 bytes). True when the module answered.

        Whatever the module had buffered (0-3 bytes of a damaged frame) is completed by these
        bytes, so its next frame starts with the host's next request.
        """
        with self.locked():
            self.resyncs += 1
            for sent in range(1, FRAME_LEN + 1):
                self._port.transport.reset_input()
                self._port.transport.write(b"\x00")
                try:
                    raw = self._port.transport.read_exact(FRAME_LEN, self.timeout_s)
                except DeviceTimeout:
                    continue
                logger.info("%s: link resynchronised after %d NOP byte(s) (reply %s)",
                            self.name, sent, raw.hex(" "))
                return True
            logger.warning("%s: no reply to %d single NOP bytes", self.name, FRAME_LEN)
            return False

    def _already_written(self, reg: Register, data: int) -> Reply | None:
        """After a lost write reply: the reply the write would have had if the register
        already holds `data` (so the write is not sent twice), else None."""
        if reg.address in (0x00, _RESENA.address) or reg.access is Access.RO:
            return None  # NOP and resets cannot be told apart by reading back
        try:
            back = self._transact(reg, 0, False)
        except (ProtocolError, DeviceTimeout):
            return None
        if back.status != Status.OK or back.data != data & 0xFFFF:
            return None
        nop = self._transact(_NOP, 0, False)
        pending = nop.status == Status.CP or bool(nop.data & PENDING_MASK)
        logger.info("%s: %s already holds %d; the write had been executed", self.name,
                    reg.name, data)
        return Reply(Status.CP if pending else Status.OK, False, reg.address, data & 0xFFFF)

    def _read_reply(self, address: int) -> Reply:
        """One attempt: the reply for this register. Raises _Silent when no complete reply for
        it came back, _Damaged (_RequestRefused for CE) when the reply cannot be used."""
        deadline = time.monotonic() + self.timeout_s
        stale = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise DeviceTimeout("reply timed out", device=self.name)
                raw = self._port.transport.read_exact(FRAME_LEN, remaining)
            except DeviceTimeout as exc:
                if stale:
                    raise _Silent(f"{stale} reply(ies) for another register, then "
                                  "silence") from exc
                raise _Silent(f"no complete reply within {self.timeout_s * 1000:.0f} "
                              "ms") from exc
            try:
                reply = decode_reply(raw)
            except ProtocolError:
                raise _Damaged(f"bad checksum in reply {raw.hex(' ')}") from None
            if reply.ce:
                raise _RequestRefused("CE: the module saw a bad checksum in the request")
            if reply.register == address:
                return reply
            # A reply for another register: most likely a late answer to an earlier request
            # still in the pipe. Skip it and keep reading for ours.
            stale += 1
            logger.warning("%s: skipping reply for register 0x%02X while waiting for 0x%02X",
                           self.name, reply.register, address)
            if stale >= 4:
                raise _Silent(f"{stale} replies echo the wrong register")

    def _exchange(self, reg: Register, data: int = 0, write: bool = False) -> Reply:
        """One exchange (on the trace when it records: `oddl.drivers.command_trace`)."""
        return traced(self.name, f"itla {'write' if write else 'read'} {reg.name}",
                      lambda: self._exchange_once(reg, data, write),
                      lambda reply: f"{reply.status.name} 0x{reply.data:04X}")

    def _exchange_once(self, reg: Register, data: int = 0, write: bool = False) -> Reply:
        """One exchange; XE becomes ItlaExecutionError with the NOP error code and a remedy.

        CII (the module is still initialising after power-up or a reset) is retried every
        poll interval for up to ``timeouts.startup_s``.
        """
        started: float | None = None
        while True:
            with self.locked():
                reply = self._transact(reg, data, write)
                if reply.status != Status.XE:
                    return reply
                code = self._transact(_NOP, 0, False).data & NOP_ERROR_MASK
            err = nop_error(code)
            now = self.clock()
            started = now if started is None else started
            if err.mnemonic != "CII" or now - started >= self.timeouts.startup_s:
                break
            logger.debug("%s: module initialising (CII); retrying %s", self.name, reg.name)
            self.pause()
        op = f"write {reg.name} = {data}" if write else f"read {reg.name}"
        extra = ""
        if err.mnemonic == "CII":
            extra = (f" (still initialising after {self.timeouts.startup_s:.3g} s; raise "
                     "timeouts.startup_s if the module needs longer)")
        raise ItlaExecutionError(f"{op} refused: {err.label} (NOP error {code}); {err.remedy}"
                                 f"{extra}", device=self.name, error=err, register=reg,
                                 write=write, value=data)

    # -- registers --

    def nop(self) -> int:
        """Read NOP: pending flags (15-8), MRDY (4) and the last error code (3-0)."""
        return self._exchange(_NOP).data

    def read_register(self, name_or_addr: str | int) -> int:
        """Read a register; signed registers are returned signed. String registers: read_string."""
        reg = register(name_or_addr)
        reply = self._exchange(reg)
        return reply.signed if reg.signed else reply.data

    def write_register(self, name_or_addr: str | int, value: int, *, wait: bool = True,
                       timeout: float | None = None) -> Status:
        """Write a register; on CP wait (if `wait`, at most `timeout` s, default
        ``timeouts.lock_s``) until the operation is done. Returns the status.

        Read-only registers are refused before anything is sent.
        """
        reg = register(name_or_addr)
        if reg.access is Access.RO:
            raise DeviceError(f"{reg.name} (0x{reg.address:02X}) is read-only; nothing was sent",
                              device=self.name)
        low, high = (-0x8000, 0x7FFF) if reg.signed else (0, 0xFFFF)
        if not low <= value <= high:
            raise ValueError(f"{reg.name} value {value} is outside {low}..{high}")
        reply = self._exchange(reg, value, write=True)
        if reply.status == Status.CP and wait:
            self.wait_pending(timeout)
        return reply.status

    def read_optional(self, name: str) -> int:
        """Read a register that older modules lack (01.3 MHz parts): RNI reads as 0, and the
        register is not asked for again on this link."""
        reg = register(name)
        if reg.address in self._absent:
            return 0
        try:
            return self.read_register(reg.address)
        except ItlaExecutionError as exc:
            if exc.error.mnemonic == "RNI":
                self._absent.add(reg.address)
                return 0
            raise

    def write_optional(self, name: str, value: int) -> None:
        """Write a 01.3 MHz part; a module without the register is fine when the value is 0."""
        try:
            self.write_register(name, value)
        except ItlaExecutionError as exc:
            if exc.error.mnemonic == "RNI" and value == 0:
                return
            raise

    def read_aea(self, name_or_addr: str | int, max_len: int = 256) -> bytes:
        """Read an AEA register (strings, Currents, Temps): read it, then EAR two bytes at a
        time until the announced length (or XE/ERE from a module that stops early)."""
        reg = register(name_or_addr)
        with self.locked():
            reply = self._exchange(reg)
            if reply.status == Status.OK:
                return b""  # a module without AEA data for this register
            if reply.status != Status.AEA:
                raise ProtocolError(f"{reg.name} answered {reply.status.name}, not AEA; it is "
                                    "not an AEA register on this module", device=self.name)
            length = min(reply.data, max_len)
            buf = bytearray()
            while len(buf) < length:
                word = self._transact(_EAR, 0, False)
                if word.status == Status.XE:  # end of data (ERE): some modules stop early
                    self._transact(_NOP, 0, False)
                    break
                buf += word.data.to_bytes(2, "big")
        return bytes(buf[:length])

    def read_string(self, name_or_addr: str | int, max_len: int = 256) -> str:
        """Read a string register through AEA (NUL-terminated ASCII)."""
        raw = self.read_aea(name_or_addr, max_len)
        return raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()

    def wait_pending(self, timeout: float | None = None) -> float:
        """Poll NOP until no operation is pending; return the seconds waited
        (`timeout` default: timeouts.lock_s)."""
        start = self.clock()
        limit = self.timeouts.lock_s if timeout is None else timeout
        self.wait_pending_until(start + limit, "the pending operation")
        return self.clock() - start

    def wait_pending_until(self, deadline: float, what: str) -> None:
        """Poll NOP until no operation is pending; DeviceTimeout naming `what` at `deadline`."""
        while True:
            reply = self._exchange(_NOP)
            if reply.status != Status.CP and not reply.data & PENDING_MASK:
                return
            if self.clock() >= deadline:
                raise DeviceTimeout(
                    f"{what} still pending at the deadline (NOP 0x{reply.data:04X}); switch "
                    "the output off (disable_output()) or reset the module, then retry; if "
                    "the module is just slow, raise the timeout (timeouts.lock_s / enable_s)",
                    device=self.name)
            self.pause()
