"""Tests of the power meter emulator: SCPI parser, error queue, readings, logging, faults, CLI."""

from __future__ import annotations

import argparse
import math
import socket
import struct
import sys
import time
from collections.abc import Iterator

import pytest
from fakes import FakeClock
from helpers import close_child, first_line, start_child, stop_with_sigterm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import ConfigError
from drivers.emulators.powermeter import (
    ERROR_QUEUE_SIZE,
    MAX_LINE_BYTES,
    TOO_LOW_READING,
    PowerMeterEmulator,
    add_arguments,
    ieee_block,
    parse_ieee_block,
    powermeter_connection_handler,
)
from drivers.emulators.tcpserve import TcpEmulatorServer


class Optics:
    """A mutable stand-in for the lasers and WSS: dBm per meter channel, None = dark."""

    def __init__(self) -> None:
        self.dbm: dict[int, float | None] = {}

    def __call__(self, channel: int) -> float | None:
        return self.dbm.get(channel)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(500.0)


@pytest.fixture
def optics() -> Optics:
    return Optics()


@pytest.fixture
def emu(clock: FakeClock, optics: Optics) -> PowerMeterEmulator:
    return PowerMeterEmulator(power_source=optics, clock=clock, noise_db=0.0)


def errors(emu: PowerMeterEmulator) -> list[int]:
    """Drain the queue over SCPI and return the codes."""
    codes = []
    while True:
        answer = emu.handle_line("SYST:ERR?")
        assert isinstance(answer, str)
        code = int(answer.split(",")[0])
        if code == 0:
            return codes
        codes.append(code)


def value(emu: PowerMeterEmulator, line: str) -> float:
    answer = emu.handle_line(line)
    assert isinstance(answer, str), (line, answer, emu.error_codes())
    return float(answer)


def fresh(emu: PowerMeterEmulator, ch: int, header: str = "READ{}:POW?") -> float:
    """READ? on a channel that does not measure continuously: a new measurement each time."""
    return value(emu, f":INIT{ch}:CONT OFF;:" + header.format(ch))


# --- identity, common commands, parser ---------------------------------------------------------

def test_idn_names_model_by_channel_count() -> None:
    assert PowerMeterEmulator().handle_line("*IDN?") == \
        "Keysight Technologies,N7744A,EMU0000001,1.0.0-emu"
    eight = PowerMeterEmulator(channels=8, serial_number="MY123")
    assert eight.handle_line("*idn?") == "Keysight Technologies,N7745A,MY123,1.0.0-emu"
    with pytest.raises(ValueError, match="1..8"):
        PowerMeterEmulator(channels=9)


@pytest.mark.parametrize("setting, query", [
    (":SENS1:POW:WAV 1310NM", ":SENS1:POW:WAV?"),
    (":SENSe1:POWer:WAVelength 1310nm", ":SENSe1:POWer:WAVelength?"),
    ("sens1:pow:wav 1.31UM", "SENSE1:POWER:WAVELENGTH?"),
    ("SENS:POW:WAV 1.31E-6", "sens1:chan1:pow:wav?"),
    (":SENSE1:CHANNEL1:POWER:WAVELENGTH 1310 NM", ":SENS:POW:WAV?"),
    ("SENS1:POW:WAV 1310000PM", ":sens1:pow:wav?"),
])
def test_long_short_forms_case_and_colon_are_equivalent(emu: PowerMeterEmulator, setting: str,
                                                         query: str) -> None:
    assert emu.handle_line(setting) is None
    assert value(emu, query) == pytest.approx(1310e-9)
    assert errors(emu) == []


def test_settings_read_back_with_units(emu: PowerMeterEmulator) -> None:
    assert emu.handle_line(":SENS2:POW:ATIM 1MS;:SENS2:POW:RANG:AUTO 0;:SENS2:CORR 0.5DB") is None
    assert value(emu, ":SENS2:POW:ATIM?") == pytest.approx(1e-3)
    assert emu.handle_line(":SENS2:POW:RANG:AUTO?") == "+0"
    assert value(emu, ":SENSe2:CORRection:LOSS:INPut:MAGNitude?") == pytest.approx(0.5)
    assert emu.handle_line(":SENS2:POW:ATIM 250 US;:SENS2:POW:RANG:AUTO ON") is None
    assert value(emu, ":SENS2:POW:ATIM?") == pytest.approx(250e-6)
    assert emu.handle_line(":SENS2:POW:RANG:AUTO?") == "+1"
    assert emu.handle_line(":SENS2:POW:UNIT W;:SENS2:POW:UNIT?") == "+1"
    assert emu.handle_line(":TRIG2:INP SMEasure;:TRIG2:OUTP avg;:TRIG2:INP?;:TRIG2:OUTP?") == \
        "SME;AVG"
    assert emu.handle_line(":INIT2:CONT OFF;:INIT2:CONT?") == "+0"
    assert emu.handle_line(":SENS2:POW:ATIM MAX;:SENS2:POW:WAV MIN") is None
    assert value(emu, ":SENS2:POW:ATIM?") == pytest.approx(10.0)
    assert value(emu, ":SENS2:POW:WAV?") == pytest.approx(1250e-9)
    # other channels are untouched
    assert value(emu, ":SENS1:POW:ATIM?") == pytest.approx(0.1)
    assert errors(emu) == []


def test_compound_line_answers_joined_by_semicolon(emu: PowerMeterEmulator) -> None:
    assert emu.handle_line("*OPC?;:SENS1:POW:UNIT?;*TST?") == "1;+0;0"
    assert emu.handle_line("") is None
    assert emu.handle_line("  ;  ") is None
    assert errors(emu) == []


@pytest.mark.parametrize("line, code", [
    ("FOO", -113),
    (":SENS1:POW:WAVX?", -113),
    ("SENS1::POW:WAV?", -113),
    (":FETC1:POW", -113),                  # query-only header used as a setting
    (":INIT1:IMM?", -113),                 # setting-only header used as a query
    ("*FOO", -113),
    (":SYST1:ERR?", -113),                 # SYSTem takes no suffix
    (":SENS5:POW:WAV?", -114),             # 4-channel meter
    (":SENS0:POW:WAV?", -114),
    (":SENS1:CHAN2:POW:WAV?", -114),
    (":SENS1:POW:WAV", -109),
    (":SENS1:POW:WAV 1310NM,5", -108),
    (":SENS1:POW:WAV? MAX", -108),
    ("*IDN? 1", -108),
    (":SENS1:POW:WAV abc", -104),
    (":SENS1:POW:WAV 1310XX", -131),
    (":SENS1:POW:ATIM 1KS", -131),
    (":SENS1:POW:WAV 2000NM", -222),
    (":SENS1:POW:WAV 1550", -222),          # base unit is metres
    (":SENS1:POW:ATIM 0.1US", -222),
    (":SENS1:POW:WAV 1E999", -222),
    (":SENS1:FUNC:PAR:LOGG 0,1MS", -222),
    (":SENS1:POW:UNIT 2", -224),
    (":SENS1:POW:RANG:AUTO MAYBE", -224),
    (":TRIG1:INP NOW", -224),
    (":SENS1:FUNC:STAT LOGG,GO", -224),
    (":SENS1:POW:WAV\x011310NM", -101),
    ("*IDN?\u00e9", -101),
])
def test_bad_input_queues_the_standard_code(emu: PowerMeterEmulator, line: str,
                                            code: int) -> None:
    assert emu.handle_line(line) is None   # no answer, no exception
    assert errors(emu) == [code]
    assert emu.handle_line(":SENS1:POW:WAV?") is not None  # still serving


def test_error_queue_order_messages_cls_and_overflow(emu: PowerMeterEmulator) -> None:
    emu.handle_line("FOO;:SENS1:POW:WAV 1NM")
    assert emu.handle_line("SYST:ERR:COUN?") == "+2"
    assert emu.handle_line("SYSTem:ERRor:NEXT?") == '-113,"Undefined header"'
    assert emu.handle_line(":syst:err?") == '-222,"Data out of range"'
    assert emu.handle_line("SYST:ERR?") == '+0,"No error"'   # Keysight signs the code
    emu.handle_line("FOO")
    emu.handle_line("*CLS")
    assert errors(emu) == []
    for _ in range(ERROR_QUEUE_SIZE + 5):
        emu.handle_line("FOO")
    codes = errors(emu)
    assert len(codes) == ERROR_QUEUE_SIZE
    assert codes[-1] == -350 and set(codes[:-1]) == {-113}


def test_rst_restores_defaults_but_keeps_error_queue(emu: PowerMeterEmulator) -> None:
    emu.handle_line(":SENS3:POW:WAV 1310NM;:SENS3:POW:UNIT 1;:INIT3:CONT 0;FOO")
    assert emu.handle_line("*RST") is None
    assert value(emu, ":SENS3:POW:WAV?") == pytest.approx(1550e-9)
    assert emu.handle_line(":SENS3:POW:UNIT?;:INIT3:CONT?;:TRIG3:INP?") == "+0;+1;IGN"
    assert errors(emu) == [-113]


# --- readings follow the optics --------------------------------------------------------------

def test_read_follows_power_source(emu: PowerMeterEmulator, optics: Optics) -> None:
    optics.dbm[1] = -3.0
    assert fresh(emu, 1) == pytest.approx(-3.0)
    optics.dbm[1] = -12.5   # e.g. the WSS attenuates the channel
    assert fresh(emu, 1) == pytest.approx(-12.5)
    optics.dbm[2] = -7.0    # light arrives on another port: channel 1 goes dark
    optics.dbm[1] = None
    assert fresh(emu, 1) == TOO_LOW_READING
    assert fresh(emu, 2, "READ{}:SCALar:POWer:DC?") == pytest.approx(-7.0)
    assert fresh(emu, 3) > 1e20


def test_no_power_source_means_dark_and_floor_means_too_low() -> None:
    assert value(PowerMeterEmulator(), ":READ1:POW?") == TOO_LOW_READING
    emu = PowerMeterEmulator(power_source=lambda ch: -85.0, noise_floor_dbm=-80.0)
    assert fresh(emu, 1) == TOO_LOW_READING
    emu = PowerMeterEmulator(power_source=lambda ch: -75.0, noise_floor_dbm=-80.0,
                             noise_db=0.0)
    assert fresh(emu, 1) == pytest.approx(-75.0)


def test_watt_unit_and_correction(emu: PowerMeterEmulator, optics: Optics) -> None:
    optics.dbm[1] = 0.0
    emu.handle_line(":SENS1:POW:UNIT 1")
    assert fresh(emu, 1) == pytest.approx(1e-3)
    emu.handle_line(":SENS1:POW:UNIT DBM;:SENS1:CORR 1.5DB")
    assert fresh(emu, 1) == pytest.approx(1.5)
    optics.dbm[1] = None
    emu.handle_line(":SENS1:POW:UNIT W")
    assert abs(fresh(emu, 1)) < 1e-9   # floor noise, not the dBm sentinel


def test_noise_is_seeded_and_small(optics: Optics) -> None:
    optics.dbm[1] = -10.0
    a = PowerMeterEmulator(power_source=optics, seed=7, noise_db=0.05)
    b = PowerMeterEmulator(power_source=optics, seed=7, noise_db=0.05)
    ra = [fresh(a, 1) for _ in range(20)]
    rb = [fresh(b, 1) for _ in range(20)]
    assert ra == rb
    assert len(set(ra)) > 1
    assert all(abs(r + 10.0) < 0.5 for r in ra)


def test_fetch_updates_once_per_averaging_period(emu: PowerMeterEmulator, optics: Optics,
                                                 clock: FakeClock) -> None:
    optics.dbm[1] = -3.0
    assert value(emu, ":FETC1:POW?") == pytest.approx(-3.0)
    optics.dbm[1] = -4.0
    assert value(emu, ":FETC1:POW?") == pytest.approx(-3.0)   # same 100 ms period
    clock.t += 0.1
    assert value(emu, ":FETC1:POW?") == pytest.approx(-4.0)


def test_single_measurements_hold_until_initiated(emu: PowerMeterEmulator, optics: Optics,
                                                  clock: FakeClock) -> None:
    optics.dbm[1] = -3.0
    emu.handle_line(":INIT1:CONT OFF")
    optics.dbm[1] = -6.0
    clock.t += 5
    assert value(emu, ":FETC1:POW?") == pytest.approx(-3.0)
    emu.handle_line(":INIT1:IMM")
    assert value(emu, ":FETC1:POW?") == pytest.approx(-6.0)
    optics.dbm[1] = -9.0
    emu.handle_line(":INIT1")
    assert value(emu, ":FETC1:POW?") == pytest.approx(-9.0)
    assert errors(emu) == []


def test_failing_power_source_is_a_device_error_not_a_crash() -> None:
    def broken(channel: int) -> float | None:
        raise RuntimeError("laser model bug")

    emu = PowerMeterEmulator(power_source=broken)
    assert emu.handle_line(":READ1:POW?") is None
    assert errors(emu) == [-300]


# --- logging -------------------------------------------------------------------------------

def block_floats(answer: object) -> list[float]:
    assert isinstance(answer, bytes)
    payload = parse_ieee_block(answer)
    return list(struct.unpack(f"<{len(payload) // 4}f", payload))


def test_logging_block_format_and_values(emu: PowerMeterEmulator, optics: Optics,
                                         clock: FakeClock) -> None:
    optics.dbm[1] = -10.0
    emu.handle_line(":SENS1:FUNC:PAR:LOGG 5,1MS")
    assert emu.handle_line(":SENS1:FUNC:PAR:LOGG?") == "+5,+1.00000000E-03"
    emu.handle_line(":SENS1:FUNC:STAT LOGG,STAR")
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    assert emu.handle_line(":SENS1:FUNC:RES?") is None
    assert errors(emu) == [-230]
    clock.t += 0.002
    emu.handle_line("*OPC?")   # samples are drawn when the emulator is next asked
    optics.dbm[1] = -20.0
    clock.t += 0.003
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    answer = emu.handle_line(":SENS1:FUNC:RES?")
    assert isinstance(answer, bytes) and answer.startswith(b"#220")
    # the samples are in the unit the channel is set to: dBm here
    assert block_floats(answer) == [-10.0, -10.0, -20.0, -20.0, -20.0]
    emu.handle_line(":SENS1:POW:UNIT W;:SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 0.005
    w_20 = struct.unpack("<f", struct.pack("<f", 1e-5))[0]
    assert block_floats(emu.handle_line(":SENS1:FUNC:RES?")) == [w_20] * 5
    emu.handle_line(":SENS1:POW:UNIT DBM;:SENS1:POW:REF -25DBM;:SENS1:POW:REF:STAT ON;"
                    ":SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 0.005
    assert block_floats(emu.handle_line(":SENS1:FUNC:RES?")) == [5.0] * 5   # dB, relative
    optics.dbm[1] = None
    emu.handle_line(":SENS1:POW:REF:STAT OFF;:SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 0.005
    too_low = struct.unpack("<f", struct.pack("<f", TOO_LOW_READING))[0]
    assert block_floats(emu.handle_line(":SENS1:FUNC:RES?")) == [too_low] * 5
    assert errors(emu) == []


def test_block_helpers_round_trip() -> None:
    assert ieee_block(b"") == b"#10"
    assert parse_ieee_block(ieee_block(b"x" * 1234)) == b"x" * 1234
    for bad in (b"", b"#", b"#0", b"12", b"#2a1x", b"#15abc"):
        with pytest.raises(ValueError):
            parse_ieee_block(bad)


def test_empty_result_before_any_logging(emu: PowerMeterEmulator) -> None:
    assert emu.handle_line(":SENS2:FUNC:RES?") == b"#10"
    assert emu.handle_line(":SENS2:FUNC:STAT?") == "NONE,COMPLETE"


def test_logging_on_triggers(emu: PowerMeterEmulator, optics: Optics,
                             clock: FakeClock) -> None:
    optics.dbm[2] = 0.0
    emu.handle_line(":TRIG2:INP SME;:SENS2:FUNC:PAR:LOGG 3,1MS;:SENS2:FUNC:STAT LOGG,STAR")
    clock.t += 10
    emu.trigger(2)
    emu.trigger(2)
    assert emu.handle_line(":SENS2:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    emu.trigger(2)
    assert emu.handle_line(":SENS2:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    assert len(block_floats(emu.handle_line(":SENS2:FUNC:RES?"))) == 3

    emu.handle_line(":TRIG3:INP CME;:SENS3:FUNC:PAR:LOGG 2,1S;:SENS3:FUNC:STAT LOGG,STAR")
    clock.t += 10
    assert emu.handle_line(":SENS3:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    emu.trigger(3)
    clock.t += 2
    assert emu.handle_line(":SENS3:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    assert errors(emu) == []


def test_setting_or_stop_ends_logging_with_partial_data(emu: PowerMeterEmulator,
                                                        optics: Optics,
                                                        clock: FakeClock) -> None:
    optics.dbm[1] = -1.0
    emu.handle_line(":SENS1:FUNC:PAR:LOGG 10,1S;:SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 3
    emu.handle_line(":SENS1:POW:WAV 1310NM")
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "NONE,COMPLETE"
    assert len(block_floats(emu.handle_line(":SENS1:FUNC:RES?"))) == 3
    emu.handle_line(":SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 1
    emu.handle_line(":SENS1:FUNC:STAT LOGG,STOP")
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "NONE,COMPLETE"
    assert len(block_floats(emu.handle_line(":SENS1:FUNC:RES?"))) == 1
    # a rejected setting does not stop a run
    emu.handle_line(":SENS1:FUNC:STAT LOGG,STAR;:SENS1:POW:WAV 1NM")
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    assert errors(emu) == [-222]


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
            "from drivers.emulators import powermeter as m\n"
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


def test_nan_power_reads_as_no_light() -> None:
    emu = PowerMeterEmulator(power_source=lambda ch: math.nan)
    assert value(emu, ":READ1:POW?") == TOO_LOW_READING
