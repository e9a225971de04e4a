"""Fuzzing the gRPC API and the remaining parsers: every input gets a clean answer.

Every RPC of the Controller service gets random messages built from its protobuf descriptor
(node ids and job ids mixed with random text, NaN and huge numbers, empty and long repeats);
the controller must answer with OK or a deliberate error status — never UNKNOWN or INTERNAL
(an unhandled exception) — and keep serving. The testbed-file parser and the agent's local
API get the same treatment. Bounded numbers of cases keep CI fast.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import zmq
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oddl.common.config import load_testbed, parse_testbed
from oddl.common.errors import ConfigError
from oddl.common.tracing import TRACE
from oddl.controller.server import ControllerServer
from oddl.drivers.emulators.host import start_emulated_testbed
from oddl.protos import oddl_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "testbeds" / "emulated-4node.toml"
SERVICE = pb.DESCRIPTOR.services_by_name["Controller"]
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED,
           grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAVAILABLE}
WORDS = ["n0", "n1", "n2", "n3", "n9", "laser0", "wss0", "pm0", "job-1", "job-2", "ring",
         "halving-doubling", "wrht", "totientperms", "parameter-server", "optical", "ideal",
         "<f4", "<i8", "wavelengths", "degree", "", "💡", "x" * 300]


@pytest.fixture(scope="module")
def controller() -> Iterator[tuple[ControllerServer, grpc.Channel]]:
    tb = start_emulated_testbed(load_testbed(CONFIG))
    for wss in tb.switches.values():
        wss.settle_s = 0.002
    server = ControllerServer(tb.resolved, "127.0.0.1:0", metrics_listen=None)
    server.start()
    channel = grpc.insecure_channel(server.address)
    yield server, channel
    channel.close()
    server.stop()
    tb.close()


def _scalar(field: FieldDescriptor) -> st.SearchStrategy:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(WORDS), st.text(max_size=40))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                         st.sampled_from([0.0, -1.0, 99.9, 1e300, math.nan]))
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.one_of(st.integers(0, 10), st.integers(0, 2**32 - 1))
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.one_of(st.integers(0, 10), st.integers(0, 2**64 - 1))
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32):
        return st.integers(-2**31, 2**31 - 1)
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64):
        return st.one_of(st.integers(-10, 10), st.integers(-2**63, 2**63 - 1))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    raise AssertionError(f"unhandled field type {t}")


def _fill(msg, data: st.DataObject, depth: int = 0) -> None:
    """Set random values on a random subset of the message's fields (recursively)."""
    for field in msg.DESCRIPTOR.fields:
        if not data.draw(st.booleans(), label=f"set {field.name}"):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, value_f = (field.message_type.fields_by_name[n] for n in ("key", "value"))
            for _ in range(data.draw(st.integers(0, 3))):
                key = data.draw(st.sampled_from(WORDS) if key_f.type == FieldDescriptor.TYPE_STRING
                                else _scalar(key_f))
                if value_f.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(getattr(msg, field.name)[key], data, depth + 1)
                elif value_f.type == FieldDescriptor.TYPE_STRING:
                    getattr(msg, field.name)[key] = data.draw(st.sampled_from(WORDS + ["4", "-1"]))
                else:
                    getattr(msg, field.name)[key] = data.draw(_scalar(value_f))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth > 2:
                continue
            if field.is_repeated:
                for _ in range(data.draw(st.integers(0, 3))):
                    _fill(getattr(msg, field.name).add(), data, depth + 1)
            else:
                _fill(getattr(msg, field.name), data, depth + 1)
        elif field.is_repeated:
            getattr(msg, field.name).extend(data.draw(st.lists(_scalar(field), max_size=6)))
        else:
            setattr(msg, field.name, data.draw(_scalar(field)))


TRACE_ROOT = tempfile.mkdtemp(prefix="oddl-fuzz-trace-")
"""Where a fuzzed trace start with an absolute folder records (never the working folder)."""


@pytest.fixture(scope="module", autouse=True)
def _remove_trace_root() -> Iterator[None]:
    yield
    shutil.rmtree(TRACE_ROOT, ignore_errors=True)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_rpc_answers_cleanly(controller, data):
    server, channel = controller
    method = data.draw(st.sampled_from([m for m in SERVICE.methods]), label="rpc")
    request_cls = getattr(pb, method.input_type.name)
    response_cls = getattr(pb, method.output_type.name)
    request = request_cls()
    _fill(request, data)
    if method.name == "SetTrace" and os.path.isabs(request.dir):
        # a start records into that folder on this host (relative ones are refused): keep it
        # inside a folder of the test's own
        request.dir = os.path.join(TRACE_ROOT, request.dir.lstrip("/"))
    path = f"/{SERVICE.full_name}/{method.name}"
    if method.server_streaming:
        call = channel.unary_stream(path, request_serializer=request_cls.SerializeToString,
                                    response_deserializer=response_cls.FromString)
        try:
            for _ in call(request, timeout=0.3):
                pass
        except grpc.RpcError as exc:
            assert exc.code() in ALLOWED | {grpc.StatusCode.DEADLINE_EXCEEDED}, exc
        return
    call = channel.unary_unary(path, request_serializer=request_cls.SerializeToString,
                               response_deserializer=response_cls.FromString)
    try:
        call(request, timeout=15)
    except grpc.RpcError as exc:
        assert exc.code() in ALLOWED, f"{method.name}({request}) -> {exc.code()}: {exc.details()}"
        assert exc.details(), "an error status must say what is wrong"
    finally:
        if TRACE.on:  # the controller runs in this process: its recording must not go on
            TRACE.stop()


def test_controller_still_serves_after_the_fuzzing(controller):
    server, channel = controller
    from oddl.protos import oddl_pb2_grpc as pb_grpc

    stub = pb_grpc.ControllerStub(channel)
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert status.testbed == "emulated-4node"
    devices = stub.GetDeviceState(pb.GetDeviceStateRequest(), timeout=10)
    assert all(d.reachable for d in devices.devices)


_VALID = CONFIG.read_text()


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_testbed_parser_never_crashes(data):
    """Mutated testbed files either load or raise ConfigError naming the file."""
    lines = _VALID.splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["drop", "dup", "mutate", "junk"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "mutate" and "=" in lines[i]:
            key = lines[i].split("=", 1)[0]
            value = data.draw(st.sampled_from(['"x"', "-1", "1e999", "[1, 2]", "true", "{}",
                                              '"emulated"', "193.35", "0", "nan", '"n0"']))
            lines[i] = f"{key}= {value}"
        else:
            lines.insert(i, data.draw(st.text(max_size=30)))
    try:
        parse_testbed("\n".join(lines), "fuzz.toml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.toml")


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_agent_local_api_answers_garbage(local_agent, frames):
    sock = local_agent
    sock.send_multipart(frames)
    assert sock.poll(10000), "the agent did not answer"
    reply = sock.recv_multipart()
    assert reply[0] in (b"ok", b"error")


@pytest.fixture(scope="module")
def local_agent(controller) -> Iterator[zmq.Socket]:
    from oddl.agents.agent import Agent

    server, _ = controller
    agent = Agent(server.cfg, "n0", server.address)
    agent.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(agent.local_api)
    yield sock
    sock.close(0)
    agent.close()
