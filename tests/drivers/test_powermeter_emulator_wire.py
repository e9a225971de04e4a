"""Tests of the power meter emulator on the wire: parser fuzzing, TCP transport, faults, CLI."""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
from collections.abc import Iterator

import pytest
from fakes import FakeClock, Optics
from helpers import close_child, first_line, start_child, stop_with_sigterm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oddl.common.errors import ConfigError
from oddl.drivers.emulators.powermeter import PowerMeterEmulator
from oddl.drivers.emulators.powermeter_serve import (
    MAX_LINE_BYTES,
    add_arguments,
    powermeter_connection_handler,
)
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(500.0)


@pytest.fixture
def emu(clock: FakeClock, optics: Optics) -> PowerMeterEmulator:
    return PowerMeterEmulator(power_source=optics, clock=clock, noise_db=0.0)


@pytest.fixture
def optics() -> Optics:
    return Optics()


# --- fuzzing -------------------------------------------------------------------------------

VALID_LINES = [
    "*IDN?", "*RST", "*CLS", "*OPC?", ":SYST:ERR?", ":SENS1:POW:WAV 1550NM",
    ":SENSe2:POWer:WAVelength?", ":SENS1:POW:UNIT 0", ":SENS3:POW:ATIM 1MS",
    ":SENS1:POW:RANG:AUTO 1", ":SENS1:CORR 0.5DB", ":FETC1:POW?", ":READ2:POW?",
    ":INIT1:CONT ON", ":INIT1:IMM", ":TRIG1:INP SME", ":TRIG1:OUTP DIS",
    ":SENS1:FUNC:PAR:LOGG 10,0.0001S", ":SENS1:FUNC:STAT LOGG,STAR", ":SENS1:FUNC:STAT?",
    ":SENS1:FUNC:RES?", ":FETC:POW:ALL?", ":READ:POW:ALL:CSV?", ":READ:POW:ALL:CONF?",
    ":SENS2:POW:RANG -20DBM", ":SENS2:POW:GAIN:AUTO?", ":SENS1:POW:REF:STAT 1",
    ":SENS1:CORR:COLL:ZERO", ":TRIG NODEA", ":TRIG:CONF LOOP", ":SYST:TIME 1,2,3",
    ":SYST:TIME?", ":SYST:PRES", "*ESR?", "*STB?", "*ESE 60", ":SENS:POW:WAV:ALL 1550 nm",
]


def fuzz_emulator() -> PowerMeterEmulator:
    return PowerMeterEmulator(power_source=lambda ch: -5.0 if ch % 2 else None,
                              clock=FakeClock(500.0), seed=3)


def check_answer(emu: PowerMeterEmulator, line: str) -> None:
    answer = emu.handle_line(line)
    assert answer is None or isinstance(answer, str | bytes)
    codes = emu.error_codes()
    assert -300 not in codes, f"emulator bug on {line!r}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=80))
def test_fuzz_random_text_never_raises(line: str) -> None:
    check_answer(fuzz_emulator(), line)


@st.composite
def mutated_lines(draw: st.DrawFn) -> str:
    line = list(draw(st.sampled_from(VALID_LINES)))
    alphabet = st.sampled_from(list(":;?*, 0123456789.eE+-#NMSUDBAZsenpow\t\x00\u00b5"))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["insert", "delete", "replace", "duplicate"]))
        at = draw(st.integers(0, max(len(line) - 1, 0)))
        if op == "insert":
            line.insert(at, draw(alphabet))
        elif op == "delete" and line:
            del line[at]
        elif op == "replace" and line:
            line[at] = draw(alphabet)
        elif op == "duplicate" and line:
            line[at:at] = line[at:]
    return "".join(line)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_lines(), min_size=1, max_size=5))
def test_fuzz_mutated_scpi_never_raises(lines: list[str]) -> None:
    emu = fuzz_emulator()
    for line in lines:
        check_answer(emu, line)
    assert emu.handle_line("*IDN?") is not None   # the session survives


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"XX[A-Z]{0,6}[0-9]{0,2}(:[A-Za-z]{1,8}[0-9]{0,2}){0,3}\??", fullmatch=True))
def test_fuzz_unknown_headers_are_queued_as_undefined(line: str) -> None:
    emu = fuzz_emulator()
    assert emu.handle_line(line) is None
    assert emu.error_codes() == [-113]


# --- TCP transport and faults --------------------------------------------------------------

@pytest.fixture
def served(emu: PowerMeterEmulator) -> Iterator[tuple[PowerMeterEmulator, tuple[str, int]]]:
    with TcpEmulatorServer(powermeter_connection_handler(emu), name="pm-test") as server:
        yield emu, server.address


class Client:
    """A raw line client with a deadline on every read."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=5)
        self.buf = b""

    def send(self, line: bytes) -> None:
        self.sock.sendall(line)

    def line(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise EOFError(self.buf)
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise EOFError(self.buf)
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def close(self) -> None:
        self.sock.close()


def test_tcp_lines_and_binary_block(served: tuple[PowerMeterEmulator, tuple[str, int]],
                                    optics: Optics, clock: FakeClock) -> None:
    emu, address = served
    optics.dbm[1] = -10.0
    c = Client(address)
    c.send(b"*IDN?\r\n:SENS1:POW:WAV 1310NM\n:SENS1:POW:WAV?\n")
    assert c.line().startswith(b"Keysight Technologies,N7744A")
    assert float(c.line()) == pytest.approx(1310e-9)
    c.send(b":SENS1:FUNC:PAR:LOGG 2,1MS\n:SENS1:FUNC:STAT LOGG,STAR\n*OPC?\n")
    assert c.line() == b"1"
    clock.t += 1
    c.send(b":SENS1:FUNC:RES?\n")
    assert c.exact(3) == b"#18"
    assert struct.unpack("<2f", c.exact(8)) == pytest.approx([-10.0, -10.0])   # dBm
    assert c.exact(1) == b"\n"
    c.close()


def test_overlong_line_is_discarded_with_error(
        served: tuple[PowerMeterEmulator, tuple[str, int]]) -> None:
    emu, address = served
    c = Client(address)
    c.send(b"A" * (3 * MAX_LINE_BYTES))
    c.send(b"\n:SYST:ERR?\n:SYST:ERR?\n")
    assert c.line() == b'-223,"Too much data"'
    assert c.line() == b'+0,"No error"'
    c.close()


def test_fault_no_answer_then_recovery(
        served: tuple[PowerMeterEmulator, tuple[str, int]]) -> None:
    emu, address = served
    c = Client(address)
    emu.faults.no_answer = True
    c.send(b":SENS1:POW:WAV 1310NM\n*IDN?\n*OPC?\n")
    assert emu.wait_for_lines(3)
    emu.faults.no_answer = False
    c.send(b":SENS1:POW:WAV?\n")
    # the first answer on the wire is the one after the fault cleared; settings still applied
    assert float(c.line()) == pytest.approx(1310e-9)
    assert emu.wait_for_responses(1)
    assert emu.responses_sent == 1   # nothing was sent while the fault was on
    c.close()


def test_fault_late_answer(served: tuple[PowerMeterEmulator, tuple[str, int]]) -> None:
    emu, address = served
    emu.faults.answer_delay_s = 0.3
    c = Client(address)
    start = time.monotonic()
    c.send(b"*OPC?\n")
    assert c.line() == b"1"
    assert time.monotonic() - start >= 0.3
    c.close()


def test_fault_garbage(served: tuple[PowerMeterEmulator, tuple[str, int]]) -> None:
    emu, address = served
    emu.faults.garbage = True
    c = Client(address)
    c.send(b"*IDN?\n")
    junk = c.line()
    assert not junk.startswith(b"Keysight") and 4 <= len(junk) <= 24
    emu.faults.garbage = False
    c.send(b"*IDN?\n")
    assert c.line().startswith(b"Keysight")
    c.close()


def test_fault_reset_drops_connection_and_restores_power_on_state(
        served: tuple[PowerMeterEmulator, tuple[str, int]]) -> None:
    emu, address = served
    c = Client(address)
    c.send(b":SENS1:POW:WAV 1310NM;FOO\n*OPC?\n")
    assert c.line() == b"1"
    emu.faults.reset_on_next_line = True
    c.send(b"*IDN?\n")
    with pytest.raises(EOFError):
        c.line()
    c.close()
    assert emu.faults.reset_on_next_line is False
    c = Client(address)
    c.send(b":SENS1:POW:WAV?\n:SYST:ERR?\n")
    assert float(c.line()) == pytest.approx(1550e-9)
    assert c.line() == b'+0,"No error"'
    c.close()


def test_inject_sets_faults_by_name(emu: PowerMeterEmulator) -> None:
    emu.inject(no_answer=True, answer_delay_s=0.5)
    assert emu.faults.no_answer and emu.faults.answer_delay_s == 0.5
    emu.inject(no_answer=False)
    assert not emu.faults.no_answer and emu.faults.answer_delay_s == 0.5
    for bad in ({"drop": True}, {"garbage": "yes"}, {"answer_delay_s": -1},
                {"answer_delay_s": float("inf")}):
        with pytest.raises(ConfigError, match="powermeter faults"):
            emu.inject(**bad)
    assert emu.faults.answer_delay_s == 0.5


# --- CLI hooks -----------------------------------------------------------------------------

def test_add_arguments_defaults_and_validation() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.listen, args.channels, args.seed, args.constant_dbm) == \
        ("127.0.0.1:0", 4, 0, None)
    args = parser.parse_args(["--channels", "8", "--constant-dbm", "-3.5", "--seed", "9"])
    assert (args.channels, args.constant_dbm, args.seed) == (8, -3.5, 9)
    for bad in (["--listen", "nope"], ["--channels", "0"], ["--constant-dbm", "nan"],
                ["--noise-db", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


@pytest.mark.e2e
def test_run_prints_resource_serves_and_stops_on_sigterm() -> None:
    code = ("import argparse, sys\n"
            "from oddl.drivers.emulators import powermeter_serve as m\n"
            "p = argparse.ArgumentParser(); m.add_arguments(p)\n"
            "sys.exit(m.run(p.parse_args(sys.argv[1:])))\n")
    with start_child([sys.executable, "-c", code, "--constant-dbm", "-4.25",
                      "--noise-db", "0"], capture_stderr=True) as proc:
        try:
            assert proc.stdout is not None
            line = first_line(proc, 15, "emulator")
            parts = line.split("::")
            assert parts[0] == "TCPIP0" and parts[1] == "127.0.0.1" and parts[3] == "SOCKET"
            c = Client(("127.0.0.1", int(parts[2])))
            c.send(b":READ3:POW?\n")
            assert float(c.line()) == pytest.approx(-4.25)
            c.close()
            assert stop_with_sigterm(proc) == 0
            assert proc.stdout.read() == ""   # exactly one line
        finally:
            close_child(proc)
