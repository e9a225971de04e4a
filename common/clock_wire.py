"""The clock exchange over UDP: the controller's time service and the agent's probe share it.

A gRPC round trip through Python costs ~200 µs even on loopback, so an offset measured over
gRPC is bounded to ±100 µs at best; one UDP datagram each way costs ~10 µs on loopback and
tens of µs on a LAN. The request is ``ODCK`` and a random 8-byte nonce; the reply is ``ODCK``,
the same nonce, and the controller's receive and send times (ns, big-endian). A reply whose
nonce is not the one sent is ignored, so nobody off the path can feed an agent a time. The
receive time is the kernel's (SO_TIMESTAMPNS) where the system gives it, so the wake-up of the
reading thread does not count as network delay.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

MAGIC = b"ODCK"
REQUEST = struct.Struct("!4s8s")
REPLY = struct.Struct("!4s8sqq")
_TIMESPEC = struct.Struct("@ll")
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", None)


def enable_kernel_stamps(sock: socket.socket) -> None:
    """Ask for kernel receive timestamps on `sock` (where the system has them)."""
    if _SO_TIMESTAMPNS is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        except OSError:
            pass


def recv_stamped(sock: socket.socket, size: int = 64) -> tuple[bytes, Any, int]:
    """(datagram, sender, receive time on the system clock in ns): the kernel's stamp when
    `enable_kernel_stamps` took, else the time now."""
    data, ancillary, _flags, sender = sock.recvmsg(size, socket.CMSG_SPACE(_TIMESPEC.size))
    now = time.time_ns()
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack(raw[:_TIMESPEC.size])
            return data, sender, sec * 1_000_000_000 + nsec
    return data, sender, now


def reply_to(request: bytes, received_ns: int) -> bytes | None:
    """The reply to a request datagram (None for anything that is not one)."""
    if len(request) != REQUEST.size:
        return None
    magic, nonce = REQUEST.unpack(request)
    if magic != MAGIC:
        return None
    return REPLY.pack(MAGIC, nonce, received_ns, time.time_ns())


def parse_reply(reply: bytes, nonce: bytes) -> tuple[int, int] | None:
    """(controller receive ns, controller send ns) of a reply to `nonce`, else None."""
    if len(reply) != REPLY.size:
        return None
    magic, got, t2, t3 = REPLY.unpack(reply)
    if magic != MAGIC or got != nonce:
        return None
    return t2, t3
