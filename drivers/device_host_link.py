"""The controller's side of a device host (decision record 0036): a ZeroMQ link to the process
that drives a rack's transmitters, and a proxy for each of them.

`DeviceHostLink` sends one request and waits for its reply (a REQ socket per calling thread,
so the device manager's pool threads call at once); a host that does not answer within the
timeout fails the call with a `DeviceTimeout` naming the host and its address, and that
thread's socket is replaced (a REQ socket that missed a reply cannot send again).
`RemoteTransceiver` is the `TunableTransceiver` of one laser on a host, so transactions,
roll-back, verify and the device watch run unchanged through it; `DeviceHostLink.retune`
tunes many lasers of the host in one request (one slot edge, one message per rack).

The wire: each request and reply is one JSON frame. Requests ``{"op": "call", "device",
"method", "args"}`` or ``{"op": "retune", "channels": {device: channel}, "timeout"}``;
replies ``{"ok": true, "result": …}`` or ``{"ok": false, "error": {"type", "message"}}``, a
retune's result ``{device: {"lock_s": s} | {"error": {…}}}``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import zmq

from oddl.common.errors import (
    DeviceError,
    DeviceTimeout,
    OddlError,
    ProtocolError,
    SafetyLimitError,
)
from oddl.drivers.interfaces import DeviceIdentity, TransceiverState

METHODS = ("identify", "configure_grid", "set_channel", "set_power_dbm", "enable_output",
           "disable_output", "state")
"""The `TunableTransceiver` calls a device host serves."""

ERRORS: dict[str, type[OddlError]] = {
    cls.__name__: cls for cls in (DeviceError, DeviceTimeout, ProtocolError, SafetyLimitError)}
"""The typed errors a reply may carry (anything else arrives as a DeviceError)."""


def encode_result(method: str, result: Any) -> Any:
    """A driver call's result as JSON (the host's side)."""
    if isinstance(result, DeviceIdentity | TransceiverState):
        return asdict(result)
    return result


def decode_result(method: str, raw: Any) -> Any:
    """The result the driver call returned at the host (the controller's side)."""
    if method == "identify":
        return DeviceIdentity(**{**raw, "extra": tuple(tuple(x) for x in raw.get("extra", ()))})
    if method == "state":
        return TransceiverState(**raw)
    return raw


def error_reply(exc: BaseException) -> dict[str, Any]:
    """The error part of a reply: the typed error's class name and its message."""
    kind = type(exc).__name__ if type(exc).__name__ in ERRORS else "DeviceError"
    return {"type": kind, "message": str(exc)}


def raise_error(error: Mapping[str, Any]) -> OddlError:
    """The typed error a reply's error part names."""
    return ERRORS.get(str(error.get("type")), DeviceError)(str(error.get("message")))


class DeviceHostLink:
    """Requests to one device host (see the module docstring)."""

    def __init__(self, host_id: str, address: str, timeout_s: float = 5.0):
        self.host_id = host_id
        self.address = address
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._sockets: list[zmq.Socket[bytes]] = []
        self._lock = threading.Lock()
        self._closed = False

    def call(self, device: str, method: str, args: list[Any], timeout_s: float) -> Any:
        """One driver call on the host; its result, or the typed error the host raised."""
        reply = self._request({"op": "call", "device": device, "method": method, "args": args},
                              timeout_s, f"{method} of {device}")
        if not reply.get("ok"):
            raise raise_error(reply.get("error") or {})
        return decode_result(method, reply.get("result"))

    def retune(self, channels: Mapping[str, int], timeout_s: float) -> dict[str, float | OddlError]:
        """Tune the host's lasers at once; each laser's time-to-lock, or its error. A host
        that does not answer fails every laser asked, each with the host's error."""
        try:
            reply = self._request({"op": "retune", "channels": dict(channels),
                                   "timeout": timeout_s}, timeout_s, f"retune of {len(channels)} "
                                  "lasers")
            if not reply.get("ok"):
                raise raise_error(reply.get("error") or {})
        except OddlError as exc:
            return dict.fromkeys(channels, exc)
        results = reply.get("result") or {}
        out: dict[str, float | OddlError] = {}
        for dev in channels:
            r = results.get(dev)
            if not isinstance(r, dict):
                out[dev] = ProtocolError(f"device host {self.host_id} at {self.address} "
                                         f"answered nothing for {dev}")
            elif "error" in r:
                out[dev] = raise_error(r["error"])
            else:
                out[dev] = float(r["lock_s"])
        return out

    def _request(self, message: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        sock = self._socket()
        wait_ms = int(1000 * (timeout_s + self.timeout_s))
        try:
            sock.send(json.dumps(message).encode())
            if sock.poll(wait_ms, zmq.POLLIN):
                reply = json.loads(sock.recv())
                if isinstance(reply, dict):
                    return reply
                raise ProtocolError(f"device host {self.host_id} at {self.address} sent "
                                    f"{reply!r} for the {what}")
        except (zmq.ZMQError, ValueError) as exc:
            self._drop(sock)
            raise DeviceError(f"device host {self.host_id} at {self.address}: the {what} "
                              f"failed ({exc})") from exc
        self._drop(sock)
        raise DeviceTimeout(f"device host {self.host_id} at {self.address} did not answer the "
                            f"{what} within {timeout_s + self.timeout_s:.1f} s; check that "
                            f"`oddl devices host --host {self.host_id}` runs there and that "
                            "the controller can reach that address")

    def _socket(self) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] | None = getattr(self._local, "sock", None)
        if sock is None:
            with self._lock:
                if self._closed:
                    raise DeviceError(f"device host {self.host_id}: the link is closed")
                sock = zmq.Context.instance().socket(zmq.REQ)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(f"tcp://{self.address}")
                self._sockets.append(sock)
            self._local.sock = sock
        return sock

    def _drop(self, sock: zmq.Socket[bytes]) -> None:
        """Close a socket whose reply never came (a REQ socket cannot send again)."""
        self._local.sock = None
        with self._lock:
            if sock in self._sockets:
                self._sockets.remove(sock)
        sock.close(0)

    def close(self) -> None:
        """Close every socket of this link."""
        with self._lock:
            self._closed = True
            for sock in self._sockets:
                sock.close(0)
            self._sockets.clear()


class RemoteTransceiver:
    """One laser on a device host, as the `TunableTransceiver` the device manager drives."""

    def __init__(self, link: DeviceHostLink, name: str):
        self.link = link
        self.name = name

    def identify(self) -> DeviceIdentity:
        return self.link.call(self.name, "identify", [], 0.0)

    def configure_grid(self, first_thz: float, spacing_ghz: float) -> None:
        self.link.call(self.name, "configure_grid", [first_thz, spacing_ghz], 0.0)

    def set_channel(self, channel: int, timeout: float = 5.0) -> float:
        return float(self.link.call(self.name, "set_channel", [channel, timeout], timeout))

    def set_power_dbm(self, dbm: float) -> None:
        self.link.call(self.name, "set_power_dbm", [dbm], 0.0)

    def enable_output(self, timeout: float = 5.0) -> None:
        self.link.call(self.name, "enable_output", [timeout], timeout)

    def disable_output(self, timeout: float = 5.0) -> None:
        self.link.call(self.name, "disable_output", [timeout], timeout)

    def state(self) -> TransceiverState:
        return self.link.call(self.name, "state", [], 0.0)

    def close(self) -> None:
        """Nothing to release per laser: the host keeps its driver; the link is closed by
        whoever opened it."""
