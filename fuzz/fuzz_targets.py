"""Fuzz targets: every parser that takes bytes from outside, fed arbitrary input.

Each target takes one input (bytes) and returns normally, or raises one of the errors the
parser documents for bad input (its `allowed` tuple). Anything else (an IndexError deep in a
handler, a RecursionError, an emulator that raises instead of answering an error reply, a
gRPC method that would answer UNKNOWN) is a crash. Targets hold their state (an emulator, a
controller) for the whole run, as the real process would.

Run by `fuzz/run.py` (coverage-guided, with atheris) and by `tests/e2e/test_fuzz_smoke.py`
(a few hundred random and mutated inputs each, inside `make test`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import zmq

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "testbeds" / "emulated-4node.toml"


class Crash(AssertionError):
    """The target misbehaved on this input without raising (e.g. the fabric stopped)."""


@dataclass
class Target:
    """One parser under fuzzing: `run(data)`, the errors bad input may raise, seed inputs."""

    name: str
    make: Callable[[], Callable[[bytes], None]]
    allowed: tuple[type[BaseException], ...] = ()
    seeds: list[bytes] = field(default_factory=list)
    close: Callable[[], None] = lambda: None


def _lines(data: bytes) -> list[str]:
    return data.decode("latin-1").replace("\r", "\n").split("\n")[:64]


# ---- devices ----------------------------------------------------------------------------
def _itla_emulator() -> Callable[[bytes], None]:
    from oddl.drivers.emulators.itla import ItlaEmulator

    emu = ItlaEmulator()

    def run(data: bytes) -> None:
        # the first byte picks raw frames (mostly bad checksums) or frames with the BIP-4
        # checksum set, which reach the register logic
        fix = bool(data[:1]) and data[0] & 1
        body = data[1:]
        whole = len(body) - len(body) % 4  # the serial layer cuts the stream into frames
        for i in range(0, min(whole, 4 * 64), 4):
            frame = body[i:i + 4]
            emu.handle_frame(_bip4(frame) if fix else frame)
    return run


def _bip4(frame: bytes) -> bytes:
    """The frame with its checksum nibble set (OIF-ITLA-MSA BIP-4)."""
    b0 = frame[0] & 0x0F
    bip8 = b0 ^ frame[1] ^ frame[2] ^ frame[3]
    return bytes([b0 | (((bip8 >> 4) ^ (bip8 & 0x0F)) << 4), *frame[1:]])


def _itla_reply() -> Callable[[bytes], None]:
    from oddl.drivers.itla_frames import decode_reply, decode_request

    def run(data: bytes) -> None:
        for decode in (decode_reply, decode_request):
            try:
                decode(data[:8])
            except _protocol_error():
                pass
    return run


def _protocol_error() -> type[BaseException]:
    from oddl.common.errors import ProtocolError

    return ProtocolError


def _wss_emulator() -> Callable[[bytes], None]:
    from oddl.drivers.emulators.wss import WssEmulator

    emu = WssEmulator()
    emu.settle_s = 0.0

    def run(data: bytes) -> None:
        for line in _lines(data):
            emu.handle_line(line)
    return run


def _wss_replies() -> Callable[[bytes], None]:
    from oddl.drivers.wss_codec import parse_error_line, parse_rra

    def run(data: bytes) -> None:
        for line in _lines(data):
            parse_error_line(line)
            try:
                parse_rra(line, device="fuzz")
            except _protocol_error():
                pass
    return run


def _scpi_emulator() -> Callable[[bytes], None]:
    from oddl.drivers.emulators.powermeter import PowerMeterEmulator

    emu = PowerMeterEmulator()

    def run(data: bytes) -> None:
        for raw in data.split(b"\n")[:64]:
            emu.process(raw)
    return run


def _scpi_block() -> Callable[[bytes], None]:
    from oddl.drivers.emulators.scpi import parse_ieee_block

    def run(data: bytes) -> None:
        try:
            parse_ieee_block(data)
        except ValueError:
            pass
    return run


# ---- configuration and agent inputs ------------------------------------------------------
def _testbed_file() -> Callable[[bytes], None]:
    from oddl.common.config import parse_testbed

    def run(data: bytes) -> None:
        parse_testbed(data.decode("utf-8", errors="replace"))
    return run


def _local_api() -> Callable[[bytes], None]:
    from oddl.agents.local_api.wire import parse_allreduce

    def run(data: bytes) -> None:
        try:
            header = json.loads(data)
        except (ValueError, RecursionError):
            return  # the agent answers bad-request (agents/agent.py _on_api)
        parse_allreduce(header)
    return run


def _chunk_head() -> Callable[[bytes], None]:
    import struct

    from oddl.agents.links.stream_wire import HEAD_BYTES, ChunkHead

    def run(data: bytes) -> None:
        try:
            ChunkHead.unpack(data[:HEAD_BYTES])
        except (ValueError, struct.error):
            pass
    return run


# ---- the emulated fabric, over its real socket ---------------------------------------------
@dataclass
class _FabricHarness:
    tb: Any
    sock: zmq.Socket
    sent: int = 0

    def run(self, data: bytes) -> None:
        parts = data.split(b"\x00|", 3)
        kind = parts[0][:1] if parts and parts[0] else b"D"
        self.sock.send_multipart([kind, *parts[1:]] if len(parts) > 1 else [kind, data])
        self.sent += 1
        if self.sent % 500 == 0:
            self.alive()

    def alive(self) -> None:
        """The fabric still answers a heartbeat (a frame that crashed its loop would not)."""
        self.sock.send_multipart([b"H"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.sock.poll(1000) and self.sock.recv_multipart()[0] == b"H":
                return
        raise Crash("the fabric stopped answering heartbeats: a recent frame broke its loop")

    def close(self) -> None:
        self.sock.close(0)
        self.tb.close()


def _fabric() -> tuple[Callable[[bytes], None], Callable[[], None]]:
    from oddl.common.config import load_testbed
    from oddl.drivers.emulators.host import start_emulated_testbed

    tb = start_emulated_testbed(load_testbed(CONFIG))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"n0")
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(tb.fabric.address)
    h = _FabricHarness(tb, sock)
    h.alive()
    return h.run, h.close


# ---- every gRPC request, through the controller's servicer -------------------------------
ALLOWED_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
                 grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                 grpc.StatusCode.ABORTED, grpc.StatusCode.PERMISSION_DENIED,
                 grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OUT_OF_RANGE,
                 grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED}


class Aborted(Exception):
    """What `context.abort` raises in gRPC (the call ends with this status)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code


class _Context:
    """The part of grpc.ServicerContext the servicer uses; a call that is not active (streams
    return after what is queued)."""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        if code not in ALLOWED_CODES:
            raise Crash(f"the servicer aborted with {code.name}: {details}")
        raise Aborted(code, details)

    def is_active(self) -> bool:
        return False

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def set_code(self, code: grpc.StatusCode) -> None:
        if code not in ALLOWED_CODES:
            raise Crash(f"the servicer set {code.name}")

    def set_details(self, details: str) -> None:
        pass

    def auth_context(self) -> dict:
        return {}

    def invocation_metadata(self) -> tuple:
        return ()


class _Controller:
    """One controller on the emulated devices, shared by the gRPC targets of a process."""

    lock = threading.Lock()
    server: Any = None
    tb: Any = None
    users = 0

    @classmethod
    def acquire(cls) -> Any:
        with cls.lock:
            if cls.server is None:
                from oddl.common.config import load_testbed
                from oddl.controller.server import ControllerServer
                from oddl.drivers.emulators.host import start_emulated_testbed

                cls.tb = start_emulated_testbed(load_testbed(CONFIG))
                for wss in cls.tb.switches.values():
                    wss.settle_s = 0.002
                cls.server = ControllerServer(cls.tb.resolved, "127.0.0.1:0",
                                              metrics_listen=None)
                cls.server.start()
            cls.users += 1
            return cls.server

    @classmethod
    def release(cls) -> None:
        with cls.lock:
            cls.users -= 1
            if cls.users == 0 and cls.server is not None:
                cls.server.stop()
                cls.tb.close()
                cls.server = cls.tb = None


@contextlib.contextmanager
def shared_controller() -> Iterator[None]:
    """Keep one controller running across the gRPC targets used inside (a test module)."""
    _Controller.acquire()
    try:
        yield
    finally:
        _Controller.release()


def _grpc_method(method: Any) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    from google.protobuf.message import DecodeError

    from oddl.protos import oddl_pb2 as pb

    server = _Controller.acquire()
    handler = getattr(server.service, method.name, None)
    request_type = getattr(pb, method.input_type.name)
    streaming = method.server_streaming

    def run(data: bytes) -> None:
        try:
            request = request_type.FromString(data)
        except DecodeError:
            return  # gRPC answers INTERNAL "failed to deserialize" before the servicer
        try:
            if streaming:  # WatchSchedule lives on the event loop (oddl.controller.aio_service):
                # what it does before its stream waits, here on this thread
                if server.service.core.open_stream(request.node_id) is None:
                    _Context().abort(*server.service.not_streaming(request.node_id))
                return
            handler(request, _Context())
        except Aborted:
            pass
    return run, _Controller.release


def all_targets() -> dict[str, Target]:
    """Every target by name."""
    from oddl.common.errors import ConfigError, OperationRefused
    from oddl.protos import oddl_pb2 as pb

    targets = [
        Target("itla-emulator", _itla_emulator,
               seeds=[bytes.fromhex("01 00000000 30300000 81320008"),
                      bytes.fromhex("01 00010000 000b0000 000b0000 31310514")]),
        Target("itla-frames", _itla_reply, seeds=[bytes.fromhex("00000000"),
                                                   bytes.fromhex("31310514")]),
        Target("wss-emulator", _wss_emulator, seeds=[b"SNO?\nRRA?\nURA 1,1,0.0;2,2,3.5\nRSW\n",
                                                     b"URA 3,99,99.9\nRSW\nRRA?"]),
        Target("wss-replies", _wss_replies, seeds=[b"1,1,0.0;2,2,3.5", b"RER", b"^OK$FF66",
                                                   b"1,99,99.9;2,2,3.5"]),
        Target("scpi-emulator", _scpi_emulator, seeds=[
            b"*IDN?\n:SENS1:POW:UNIT 0\n:READ1:POW?\n:SYST:ERR?",
            b":SENS:FUNC:PAR:LOGG 100,0.001\n:SENS:FUNC:STAT LOGG,STAR\n:SENS:FUNC:RES?"]),
        Target("scpi-block", _scpi_block, seeds=[b"#18abcdefgh", b"#0"]),
        Target("testbed-file", _testbed_file, allowed=(ConfigError,),
               seeds=[CONFIG.read_bytes()]),
        Target("local-api", _local_api, allowed=(OperationRefused,),
               seeds=[b'{"dtype": "<f4", "shape": [4, 2], "timeout_s": 5}',
                      b'{"dtype": "<i8", "shape": [3], "shm": "/dev/shm/x", "job": "job-1"}']),
        Target("chunk-head", _chunk_head, seeds=[b"ODC2" + bytes(52), b"ODC1" + bytes(52)]),
    ]
    fab = {}

    def make_fabric() -> Callable[[bytes], None]:
        run, close = _fabric()
        fab["close"] = close
        return run
    targets.append(Target("fabric-frames", make_fabric,
                          seeds=[b'D\x00|{"dst": "n1", "net": "ideal"}\x00|payload',
                                 b"S", b"H", b'D\x00|{"dst": "n9"}\x00|x'],
                          close=lambda: fab.pop("close", lambda: None)()))
    for method in pb.DESCRIPTOR.services_by_name["Controller"].methods:
        closers: dict[str, Callable[[], None]] = {}

        def make(m: Any = method, c: dict = closers) -> Callable[[bytes], None]:
            run, close = _grpc_method(m)
            c["close"] = close
            return run
        seed = getattr(pb, method.input_type.name)().SerializeToString()
        targets.append(Target(f"grpc-{method.name}", make, seeds=[seed, b"\x0a\x02n0"],
                              close=lambda c=closers: c.pop("close", lambda: None)()))
    return {t.name: t for t in targets}
