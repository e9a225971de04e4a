"""A device host: the process that drives one rack's transmitters for the controller
(`oddl devices host`, decision record 0036).

It opens the real driver of each laser the testbed file gives it (on that machine's serial
lines) and serves them on ZeroMQ (ROUTER) to the controller's `DeviceHostLink`: single driver
calls, each on a pool thread so a transaction's lasers tune at once, and batched retunes
(one request per slot edge, every laser tuned in parallel here, each answered with its
time-to-lock or its error). One thread owns the socket; the workers hand their replies back
through an in-process queue socket. A laser whose resource is ``emulated`` gets an emulator
in this process, on a TCP port of its own, driven by the same real driver: one emulator
process per device host, as a rack's lasers answer on their own machine.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import zmq

from oddl.common.config import EMULATED, DeviceConfig, DeviceHostConfig, TestbedConfig
from oddl.common.errors import ConfigError, DeviceError, OddlError
from oddl.controller.device_drivers import open_driver
from oddl.drivers.device_host_link import METHODS, encode_result, error_reply

logger = logging.getLogger(__name__)


def host_config(cfg: TestbedConfig, host_id: str) -> DeviceHostConfig:
    """The device host `host_id` of the testbed file, or ConfigError listing the known ones."""
    for h in cfg.device_hosts:
        if h.id == host_id:
            return h
    known = ", ".join(h.id for h in cfg.device_hosts) or "none"
    raise ConfigError(f"{cfg.path}: no device host {host_id!r} (device hosts: {known}); "
                      "add a [[device_hosts]] entry or fix the name")


def check_listen(listen: str, insecure: bool) -> None:
    """ConfigError for a non-loopback `listen` without `insecure`: the device host's wire is
    not authenticated, and whoever reaches it can tune the rack's lasers."""
    host = listen.rpartition(":")[0].strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not insecure:
        raise ConfigError(f"device host listen address {listen!r} is not loopback, and its "
                          "wire is not authenticated (anyone who reaches the port can tune the "
                          "rack's lasers): keep it on a control network only the controller "
                          "reaches and pass --insecure, or run it on loopback")


class DeviceHost:
    """Serves the drivers of one device host's lasers (see the module docstring)."""

    def __init__(self, cfg: TestbedConfig, host_id: str, listen: str | None = None,
                 drivers: Mapping[str, Any] | None = None, *, insecure: bool = False):
        self.spec = host_config(cfg, host_id)
        self.cfg = cfg
        bind = listen or self.spec.address
        check_listen(bind, insecure)
        self._emulated: list[Any] = []
        self.drivers: dict[str, Any] = dict(drivers) if drivers is not None else \
            self._open([cfg.device(d) for d in self.spec.devices])
        self._pool = ThreadPoolExecutor(max_workers=max(4, len(self.drivers)),
                                        thread_name_prefix=f"{host_id}-devices")
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(f"tcp://{bind}")
        endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.address = endpoint.removeprefix("tcp://")
        """Where it listens (host:port; port 0 in `listen` becomes the one chosen)."""
        self._done_addr = f"inproc://device-host-{uuid.uuid4().hex}"
        self._done = ctx.socket(zmq.PULL)
        self._done.bind(self._done_addr)
        self._local = threading.local()
        self.served = {"call": 0, "retune": 0, "lasers_retuned": 0}
        """Requests answered, by op (the exit line reports them)."""
        self._pushes: list[zmq.Socket[bytes]] = []
        self._lock = threading.Lock()
        self._closed = False

    def _open(self, devices: list[DeviceConfig]) -> dict[str, Any]:
        """The real driver of each laser; an emulator here first for `emulated` ones."""
        drivers: dict[str, Any] = {}
        failures = []
        for dev in devices:
            try:
                if dev.resource == EMULATED:
                    dev = replace(dev, resource=self._emulate(dev))
                drivers[dev.id] = open_driver(dev, self.cfg.grid)
            except OddlError as exc:
                failures.append(f"{dev.id} ({dev.resource}): {exc}")
        if failures:
            for drv in drivers.values():
                drv.close()
            self._close_emulators()
            raise DeviceError(f"device host {self.spec.id} could not open its devices:\n  "
                              + "\n  ".join(failures))
        return drivers

    def _emulate(self, dev: DeviceConfig) -> str:
        from oddl.drivers.emulators.host import EmulatedTestbed, start_device

        tb = EmulatedTestbed(self.cfg)
        start_device(tb, dev, self.cfg.seed * 1000 + self.spec.devices.index(dev.id),
                     "127.0.0.1", 0)
        self._emulated.append(tb)
        return tb.resources[dev.id]

    def _close_emulators(self) -> None:
        """Stop the emulators (each server wakes its accept thread at once)."""
        for tb in self._emulated:
            tb.close()
        self._emulated.clear()

    # ---- serving ----------------------------------------------------------------------
    def serve(self, stopped: Callable[[], bool]) -> None:
        """Answer the controller until `stopped()`."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._done, zmq.POLLIN)
        while not stopped():
            ready = dict(poller.poll(100))
            if self._done in ready:
                while True:
                    try:
                        self._sock.send_multipart(self._done.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
            if self._sock in ready:
                while True:
                    try:
                        frames = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._pool.submit(self._answer, frames)

    def _answer(self, frames: list[bytes]) -> None:
        """Run one request on this pool thread and hand its reply to the socket's thread."""
        reply = self.handle(frames[-1])
        push: zmq.Socket[bytes] | None = getattr(self._local, "push", None)
        if push is None:
            push = zmq.Context.instance().socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self._done_addr)
            with self._lock:
                self._pushes.append(push)
            self._local.push = push
        push.send_multipart([*frames[:-1], json.dumps(reply).encode()])

    def handle(self, raw: bytes) -> dict[str, Any]:
        """The reply to one request (never raises: a bad request is an error reply)."""
        try:
            req = json.loads(raw)
            if not isinstance(req, dict):
                raise ValueError("not a JSON object")
            if req.get("op") == "retune":
                result = self.retune(req["channels"], float(req.get("timeout", 1.0)))
                with self._lock:
                    self.served["retune"] += 1
                    self.served["lasers_retuned"] += len(result)
                return {"ok": True, "result": result}
            if req.get("op") == "call":
                result = self.call(str(req["device"]), str(req["method"]), req.get("args", []))
                with self._lock:
                    self.served["call"] += 1
                return {"ok": True, "result": result}
            raise ValueError(f"unknown op {req.get('op')!r} (call, retune)")
        except OddlError as exc:
            return {"ok": False, "error": error_reply(exc)}
        except (ValueError, KeyError, TypeError) as exc:
            return {"ok": False, "error": {"type": "ProtocolError", "message": (
                f"device host {self.spec.id}: malformed request ({exc}); use "
                "oddl.drivers.device_host_link.DeviceHostLink")}}
        except Exception as exc:  # a driver's defect: answer it rather than go silent
            logger.exception("device host %s: a request failed unexpectedly", self.spec.id)
            return {"ok": False, "error": {"type": "DeviceError", "message": (
                f"device host {self.spec.id}: internal error ({exc!r}); it keeps serving — "
                "please report this with its log")}}

    def call(self, device: str, method: str, args: list[Any]) -> Any:
        """One driver call of one of this host's lasers."""
        drv = self._driver(device)
        if method not in METHODS:
            raise DeviceError(f"device host {self.spec.id}: {method!r} is not a transmitter "
                              f"call ({', '.join(METHODS)})")
        return encode_result(method, getattr(drv, method)(*args))

    def retune(self, channels: Mapping[str, int], timeout: float) -> dict[str, Any]:
        """Tune the named lasers at once; per laser its time-to-lock or its error."""
        for dev in channels:
            self._driver(dev)
        futures = {dev: self._pool.submit(self._driver(dev).set_channel, int(ch), timeout)
                   for dev, ch in channels.items()}
        out: dict[str, Any] = {}
        for dev, f in futures.items():
            try:
                out[dev] = {"lock_s": float(f.result())}
            except OddlError as exc:
                out[dev] = {"error": error_reply(exc)}
        return out

    def _driver(self, device: str) -> Any:
        drv = self.drivers.get(device)
        if drv is None:
            raise DeviceError(f"device host {self.spec.id} does not drive {device!r} (it "
                              f"drives {', '.join(self.spec.devices)}); check [[device_hosts]] "
                              "in the testbed file the controller runs with")
        return drv

    def close(self) -> None:
        """Close the socket, the drivers (at once: pyserial's socket link pauses 0.3 s as it
        closes) and any emulators; the optical state is left as it is. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        list(self._pool.map(_close_quietly, self.drivers.values()))
        self._pool.shutdown(wait=True)
        with self._lock:
            for push in self._pushes:
                push.close(0)
        self._sock.close(0)
        self._done.close(0)
        self._close_emulators()


def _close_quietly(driver: Any) -> None:
    try:
        driver.close()
    except Exception:  # closing must never raise during shutdown
        logger.exception("closing a driver failed")
