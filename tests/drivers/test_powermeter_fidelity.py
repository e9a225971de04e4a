"""The meter emulator where it follows the N774x programming guide beyond the common path:
terminators, READ? timing, status registers, ALL queries, range, reference, zeroing,
trigger nodes and configuration, SYST:TIME/PRESet; and the driver's READ timeout."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from fakes import FakeClock
from hypothesis import given
from hypothesis import strategies as st

from oddl.drivers.emulators.powermeter import PowerMeterEmulator
from oddl.drivers.emulators.powermeter_model import TOO_LOW_READING
from oddl.drivers.emulators.powermeter_serve import powermeter_connection_handler
from oddl.drivers.emulators.scpi import LineSplitter, ScpiError, parse_ieee_block, parse_number
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.powermeter import PowerMeter


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def emu(clock: FakeClock) -> PowerMeterEmulator:
    return PowerMeterEmulator(power_source=lambda ch: -10.0 - ch, clock=clock, noise_db=0.0)


def ask(emu: PowerMeterEmulator, line: str) -> str:
    answer = emu.handle_line(line)
    assert isinstance(answer, str), (line, answer, emu.error_codes())
    return answer


def floats(answer: object) -> list[float]:
    assert isinstance(answer, bytes)
    payload = parse_ieee_block(answer)
    return list(struct.unpack(f"<{len(payload) // 4}f", payload))


# --- program messages on the wire -----------------------------------------------------------

def test_line_splitter_takes_lf_cr_and_crlf_across_chunks() -> None:
    overlong: list[int] = []
    lines = LineSplitter(16, lambda: overlong.append(1))
    assert lines.feed(b"A\nB\r") == [(b"A", b"\n"), (b"B", b"\r")]
    # the LF after that CR is not a new line: it finishes B's CR-LF
    assert lines.feed(b"\nC\r\nD") == [(None, b"\n"), (b"C", b"\r\n")]
    assert lines.feed(b"\r") == [(b"D", b"\r")]
    assert lines.feed(b"E\n") == [(b"E", b"\n")]
    assert lines.feed(b"x" * 20) == [] and overlong == [1]
    assert lines.feed(b"yyy\nF\n") == [(b"F", b"\n")]        # rest of the long line dropped
    assert lines.feed(b"\n") == [(b"", b"\n")]              # a bare LF is an empty line


@pytest.fixture
def served(emu: PowerMeterEmulator) -> Iterator[tuple[str, int]]:
    with TcpEmulatorServer(powermeter_connection_handler(emu), name="pm-fid") as server:
        yield server.address


def _exchange(address: tuple[str, int], data: bytes, until: bytes, count: int) -> bytes:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        got = b""
        while got.count(until) < count:
            chunk = sock.recv(4096)
            assert chunk, got
            got += chunk
        return got


def test_each_answer_ends_with_the_terminator_of_its_line(served: tuple[str, int]) -> None:
    got = _exchange(served, b"*OPC?\r:SENS1:POW:UNIT?\r\n:SYST:ERR?\n", b"\n", 2)
    assert got == b'1\r+0\r\n+0,"No error"\n'
    block = _exchange(served, b":READ:POW:ALL:CONF?\r", b"\r", 1)
    assert parse_ieee_block(block[:-1]) == struct.pack("<8H", 1, 1, 2, 1, 3, 1, 4, 1)


def test_numbers_with_units_and_spaces(emu: PowerMeterEmulator) -> None:
    assert emu.handle_line(":SENS1:POW:ATIM 0.001 s;:SENS1:POW:WAV 1550 nm;"
                           ":SENS1:POW:RANG -20 dBm;:SENS1:POW:REF -3.5 DBM") is None
    assert float(ask(emu, ":SENS1:POW:ATIM?")) == pytest.approx(1e-3)
    assert float(ask(emu, ":SENS1:POW:WAV?")) == pytest.approx(1550e-9)
    assert float(ask(emu, ":SENS1:POW:RANG?")) == -20.0
    assert float(ask(emu, ":SENS1:POW:REF?")) == -3.5
    assert emu.error_codes() == []
    with pytest.raises(ScpiError) as bad:
        parse_number("5 parsecs", {"": 1.0}, 0, 10, 0)
    assert bad.value.code == -131


# --- READ? timing -------------------------------------------------------------------------------

def test_read_takes_one_averaging_time_only_in_triggered_mode(emu: PowerMeterEmulator) -> None:
    emu.handle_line(":SENS2:POW:ATIM 0.25S")
    assert emu.process(b":READ2:POW?").delay_s == 0.0       # continuous: identical to FETCh
    emu.handle_line(":INIT2:CONT OFF")
    reply = emu.process(b":READ2:POW?")
    assert reply.delay_s == pytest.approx(0.25)
    assert float(reply.data or b"") == pytest.approx(-12.0)
    assert emu.process(b":FETC2:POW?").delay_s == 0.0
    emu.handle_line(":INIT1:CONT OFF;:SENS1:POW:ATIM 0.1S")
    assert emu.process(b":READ:POW:ALL?").delay_s == pytest.approx(0.25)   # the slowest one


def test_read_answer_comes_after_the_averaging_time_on_the_wire() -> None:
    emu = PowerMeterEmulator(power_source=lambda ch: -5.0, noise_db=0.0)
    with TcpEmulatorServer(powermeter_connection_handler(emu), name="pm-read") as server:
        started = time.monotonic()
        got = _exchange(server.address, b":INIT1:CONT OFF;:SENS1:POW:ATIM 0.6S\n:READ1:POW?\n",
                        b"\n", 1)
        assert time.monotonic() - started >= 0.6          # never earlier than the measurement
        assert float(got) == pytest.approx(-5.0)


def test_driver_read_timeout_follows_the_averaging_time() -> None:
    emu = PowerMeterEmulator(power_source=lambda ch: -5.0, noise_db=0.0)
    with TcpEmulatorServer(powermeter_connection_handler(emu), name="pm-drv") as server:
        host, port = server.address
        with PowerMeter(f"TCPIP0::{host}::{port}::SOCKET", timeout_s=1.0) as pm:
            pm.set_unit_dbm(1)
            pm.set_averaging_time_s(1, 1.5)   # longer than the 1 s VISA timeout
            assert pm.read_power_dbm(1) == pytest.approx(-5.0)
            assert emu.handle_line(":INIT1:CONT?") == "+0"   # the driver measures triggered
            assert pm.errors() == []


# --- status registers ---------------------------------------------------------------------------

def test_esr_stb_ese_sre(emu: PowerMeterEmulator) -> None:
    assert ask(emu, "*ESR?;*STB?") == "+0;+0"
    emu.handle_line("FOO;:SENS1:POW:WAV 1NM")               # -113 command, -222 execution
    assert ask(emu, "*STB?") == "+4"                          # error queue not empty
    emu.handle_line("*ESE 48;*SRE 32")
    assert ask(emu, "*ESE?;*SRE?") == "+48;+32"
    assert ask(emu, "*STB?") == "+100"                        # 4 + ESB 32 + MSS 64
    assert ask(emu, "*ESR?") == "+48"
    assert ask(emu, "*ESR?") == "+0"                          # read and cleared
    emu.handle_line("*OPC")
    assert ask(emu, "*ESR?") == "+1"
    emu.handle_line("*CLS")
    assert ask(emu, "*STB?;SYST:ERR?") == '+0;+0,"No error"'


# --- readings of all channels -------------------------------------------------------------------

def test_all_channel_queries(clock: FakeClock) -> None:
    emu = PowerMeterEmulator(power_source=lambda ch: None if ch == 4 else -10.0 - ch,
                             clock=clock, noise_db=0.0)
    emu.handle_line(":SENS2:POW:UNIT W")
    watts = floats(emu.handle_line(":FETC:POW:ALL?"))
    assert watts[:3] == pytest.approx([10 ** (-(10 + ch) / 10) * 1e-3 for ch in (1, 2, 3)],
                                      rel=1e-6)
    assert abs(watts[3]) < 1e-9                               # dark: floor noise in W
    csv = [float(v) for v in ask(emu, ":FETC:POW:ALL:CSV?").split(",")]
    assert csv[0] == pytest.approx(-11.0) and csv[1] == pytest.approx(watts[1], rel=1e-6)
    assert csv[3] == TOO_LOW_READING
    assert len(floats(emu.handle_line(":READ:POW:ALL?"))) == 4
    channel_unit = PowerMeterEmulator(power_source=lambda ch: -3.0, clock=clock, noise_db=0.0,
                                      all_block_unit="channel")
    assert floats(channel_unit.handle_line(":READ:POW:ALL?")) == [-3.0] * 4
    with pytest.raises(ValueError, match="all_block_unit"):
        PowerMeterEmulator(all_block_unit="dbm")


# --- range, gain, reference, zero ---------------------------------------------------------------

def test_range_rounds_to_10_db_steps_and_ends_auto_ranging(emu: PowerMeterEmulator) -> None:
    assert float(ask(emu, ":SENS1:POW:RANG?")) == -10.0       # auto: what -11 dBm needs
    emu.handle_line(":SENS1:POW:RANG -14")
    assert ask(emu, ":SENS1:POW:RANG:AUTO?") == "+0"
    assert float(ask(emu, ":SENS1:POW:RANG?")) == -10.0
    emu.handle_line(":SENS1:POW:RANG MIN")
    assert float(ask(emu, ":SENS1:POW:RANG?")) == -30.0
    emu.handle_line(":SENS1:POW:RANG 30DBM;:SENS1:POW:GAIN:AUTO 0")
    assert emu.error_codes() == [-222]
    assert ask(emu, ":SENS1:POW:GAIN:AUTO?;:SENS2:POW:GAIN:AUTO?") == "+0;+1"


def test_relative_reference_reports_db(emu: PowerMeterEmulator) -> None:
    emu.handle_line(":SENS1:POW:REF -20DBM;:SENS1:POW:REF:STAT ON;:SENS1:POW:UNIT W")
    assert ask(emu, ":SENS1:POW:REF:STAT?") == "+1"
    assert float(ask(emu, ":FETC1:POW?")) == pytest.approx(9.0)   # -11 dBm against -20 dBm
    emu.handle_line(":SENS1:POW:REF:STAT OFF")
    assert float(ask(emu, ":FETC1:POW?")) == pytest.approx(10 ** -1.1 * 1e-3, rel=1e-6)


def test_zeroing_needs_a_dark_input(clock: FakeClock) -> None:
    light = {1: -3.0}
    emu = PowerMeterEmulator(power_source=light.get, clock=clock, noise_db=0.0)
    emu.handle_line(":SENS1:CORR:COLL:ZERO;:SENS2:CORR:COLL:ZERO")
    assert ask(emu, ":SENS1:CORR:COLL:ZERO?;:SENS2:CORR:COLL:ZERO?") == "+1;+0"
    light.clear()
    emu.handle_line(":SENS:CORR:COLL:ZERO:ALL")
    assert ask(emu, ":SENS:CORR:COLL:ZERO:ALL?") == "+0"
    emu.handle_line(":SENS1:CORR:COLL:ZERO 5")
    assert emu.error_codes() == [-108]


# --- triggering ---------------------------------------------------------------------------------

def _start_cme_logging(emu: PowerMeterEmulator, ch: int) -> None:
    emu.handle_line(f":TRIG{ch}:INP CME;:SENS{ch}:FUNC:PAR:LOGG 2,1MS;"
                    f":SENS{ch}:FUNC:STAT LOGG,STAR")


def test_trigger_nodes_follow_the_configuration(emu: PowerMeterEmulator,
                                                clock: FakeClock) -> None:
    assert ask(emu, ":TRIG:CONF?") == "DEF"
    _start_cme_logging(emu, 1)
    emu.handle_line(":TRIG NODEB")                 # output connector: not looped back
    clock.t += 1
    assert ask(emu, ":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    emu.handle_line(":TRIG NODEA")                 # as a pulse on the input connector
    clock.t += 1
    assert ask(emu, ":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    assert floats(emu.handle_line(":SENS1:FUNC:RES?")) == [-11.0, -11.0]

    emu.handle_line(":TRIG:CONF 3")                # loop-back: NODEB comes back as input
    assert ask(emu, ":TRIG:CONF?") == "LOOP"
    _start_cme_logging(emu, 2)
    emu.handle_line(":TRIG 2")
    clock.t += 1
    assert ask(emu, ":SENS2:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"

    emu.handle_line(":TRIG:CONF DIS")              # connectors disabled: nothing arrives
    _start_cme_logging(emu, 3)
    emu.handle_line(":TRIG NODEA")
    emu.trigger(3)
    clock.t += 1
    assert ask(emu, ":SENS3:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    emu.handle_line(":TRIG NODEC;:TRIG:CONF SOMETIMES")
    assert emu.error_codes() == [-224, -224]


# --- system -------------------------------------------------------------------------------------

def test_system_time_set_and_read(clock: FakeClock) -> None:
    wall = [time.mktime((2026, 3, 1, 8, 15, 30, 0, 0, -1))]
    emu = PowerMeterEmulator(clock=clock, wall_clock=lambda: wall[0])
    assert ask(emu, ":SYST:TIME?") == "+8,+15,+30"
    emu.handle_line(":SYST:TIME 17,45,0")
    assert ask(emu, ":SYST:TIME?") == "+17,+45,+0"
    wall[0] += 61
    assert ask(emu, ":SYST:TIME?") == "+17,+46,+1"
    emu.handle_line(":SYST:TIME 24,0,0;:SYST:TIME 1,2")
    assert emu.error_codes() == [-222, -109]


def test_preset_restores_settings_keeps_errors(emu: PowerMeterEmulator) -> None:
    emu.handle_line(":SENS1:POW:WAV 1310NM;:TRIG:CONF PASS;:SENS2:POW:GAIN:AUTO 0;FOO")
    emu.handle_line(":SYST:PRES")
    assert float(ask(emu, ":SENS1:POW:WAV?")) == pytest.approx(1550e-9)
    assert ask(emu, ":TRIG:CONF?;:SENS2:POW:GAIN:AUTO?") == "DEF;+1"
    assert emu.error_codes() == [-113]


def test_wavelength_all_sets_every_channel_and_stops_logging(emu: PowerMeterEmulator) -> None:
    emu.handle_line(":SENS3:FUNC:PAR:LOGG 100,1S;:SENS3:FUNC:STAT LOGG,STAR")
    emu.handle_line(":SENS:POW:WAV:ALL 1310NM")
    assert [float(ask(emu, f":SENS{n}:POW:WAV?")) for n in (1, 2, 3, 4)] == \
        pytest.approx([1310e-9] * 4)
    assert ask(emu, ":SENS3:FUNC:STAT?") == "NONE,COMPLETE"
    emu.handle_line(":SENS:POW:WAV:ALL 2000NM")
    assert emu.error_codes() == [-222]


@given(st.lists(st.tuples(st.text(alphabet="ABC:?;*1 ", max_size=12),
                          st.sampled_from([b"\n", b"\r", b"\r\n"])), max_size=8),
       st.lists(st.integers(min_value=1, max_value=7), max_size=10))
def test_line_splitter_result_does_not_depend_on_chunking(
        lines: list[tuple[str, bytes]], cuts: list[int]) -> None:
    stream = b"".join(text.encode() + end for text, end in lines)
    whole = LineSplitter(1 << 16, lambda: None).feed(stream)
    ambiguous = any(end == b"\r" and nxt == ("", b"\n")   # CR then an empty LF line is CR-LF
                    for (_, end), nxt in zip(lines, lines[1:], strict=False))
    if not ambiguous:
        assert whole == [(text.encode(), end) for text, end in lines]
    pieces, at = [], 0
    for cut in cuts:
        pieces.append(stream[at:at + cut])
        at += cut
    pieces.append(stream[at:])
    splitter = LineSplitter(1 << 16, lambda: None)
    merged: list[tuple[bytes, bytes]] = []
    for piece in pieces:
        for line, end in splitter.feed(piece):
            if line is None:   # a late LF completes the CR of the line before
                assert merged[-1][1] == b"\r"
                merged[-1] = (merged[-1][0], b"\r\n")
            else:
                merged.append((line, end))
    assert merged == whole


def test_crlf_split_across_reads_still_gets_a_crlf_answer(served: tuple[str, int]) -> None:
    with socket.create_connection(served, timeout=10) as sock:
        sock.sendall(b"*OPC?\r")
        got = b""
        while not got.endswith(b"\r"):
            got += sock.recv(64)
        sock.sendall(b"\n:SENS1:POW:WAV 1310NM\r")       # a setting: no answer, no stray LF
        time.sleep(0.2)
        sock.sendall(b"\n*OPC?\r\n")
        while got.count(b"1") < 2 or not got.endswith(b"\r\n"):
            got += sock.recv(64)
    assert got == b"1\r\n1\r\n"
