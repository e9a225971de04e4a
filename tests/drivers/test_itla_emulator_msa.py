"""The ITLA emulator's start-up window, timings, monitor registers and byte framing (MSA)."""

from __future__ import annotations

import argparse
import socket
import time

import pytest
from fakes import FakeClock

from oddl.common.errors import ConfigError
from oddl.drivers.emulators.itla import ItlaEmulator
from oddl.drivers.emulators.itla_serve import add_arguments, itla_connection_handler
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.itla_frames import NOP_MRDY, Reply, Status, decode_reply, encode_request
from oddl.drivers.itla_registers import register

CII = 0x5


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(50.0)


def ask(emu: ItlaEmulator, reg: str | int, data: int = 0, write: bool = False) -> Reply:
    raw = emu.handle_frame(encode_request(register(reg).address, data, write))
    assert raw is not None
    return decode_reply(raw)


# --- start-up window ---------------------------------------------------------------------------

def test_power_up_window_refuses_everything_but_nop_with_cii(clock: FakeClock) -> None:
    emu = ItlaEmulator(clock=clock, startup_s=2.0)
    assert ask(emu, "Channel").status is Status.XE
    assert ask(emu, "PWR", 1100, True).status is Status.XE
    nop = ask(emu, "NOP")
    assert (nop.status, nop.data) == (Status.OK, CII)  # served, MRDY clear, error CII
    clock.advance(1.999)
    assert ask(emu, "SerNo").status is Status.XE
    clock.advance(0.001)
    assert ask(emu, "Channel") == Reply(Status.OK, False, 0x30, 1)
    assert ask(emu, "NOP").data == NOP_MRDY
    assert ask(emu, "StatusF").data & 0x80  # XEL latched by the refusals


def test_module_reset_opens_the_window_again(clock: FakeClock) -> None:
    emu = ItlaEmulator(clock=clock, startup_s=1.5)
    clock.advance(1.5)
    assert ask(emu, "PWR", 1200, True).status is Status.OK
    assert ask(emu, "ResEna", 0x01, True).status is Status.OK  # MR is answered, then resets
    assert ask(emu, "PWR").status is Status.XE
    assert ask(emu, "NOP").data & 0x0F == CII
    clock.advance(1.5)
    assert ask(emu, "PWR").signed == 1000  # power-on value
    assert ask(emu, "StatusF").data & 0x20  # MRL


def test_soft_reset_has_no_start_up_window(clock: FakeClock) -> None:
    emu = ItlaEmulator(clock=clock, startup_s=1.0)
    clock.advance(1.0)
    assert ask(emu, "ResEna", 0x02, True).status is Status.OK
    assert ask(emu, "Channel").status is Status.OK


# --- timings from the configuration -----------------------------------------------------------

def test_enable_and_tune_take_their_own_configured_times(clock: FakeClock) -> None:
    emu = ItlaEmulator(clock=clock, time_to_lock_s=0.8, enable_time_s=3.0)
    assert ask(emu, "ResEna", 8, True).status is Status.CP
    clock.advance(2.9)
    assert ask(emu, "NOP").status is Status.CP and emu.optical_output() is None
    clock.advance(0.1)
    assert ask(emu, "NOP").status is Status.OK and emu.optical_output() is not None
    assert ask(emu, "Channel", 2, True).status is Status.CP
    clock.advance(0.7)
    assert ask(emu, "NOP").data & 0x0200  # tune flag still pending
    clock.advance(0.1)
    assert ask(emu, "NOP").data == NOP_MRDY


def test_enable_time_defaults_to_the_time_to_lock(clock: FakeClock) -> None:
    emu = ItlaEmulator(clock=clock, time_to_lock_s=0.25)
    assert emu.timing.enable_time_s == 0.25
    ask(emu, "ResEna", 8, True)
    clock.advance(0.25)
    assert ask(emu, "NOP").status is Status.OK


@pytest.mark.parametrize("kwargs", [{"enable_time_s": -1.0}, {"startup_s": float("nan")},
                                    {"time_to_lock_s": float("inf")}])
def test_bad_timings_are_config_errors_naming_them(kwargs: dict[str, float]) -> None:
    name = next(iter(kwargs))
    with pytest.raises(ConfigError, match=name):
        ItlaEmulator(**kwargs)


def test_cli_takes_the_timings() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--time-to-lock-ms", "1500", "--enable-ms", "20000",
                              "--startup-ms", "5000", "--jitter-ms", "200"])
    assert (args.time_to_lock_ms, args.enable_ms, args.startup_ms, args.jitter_ms) == (
        1500.0, 20000.0, 5000.0, 200.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--startup-ms", "-1"])


# --- LstResp, Currents, Temps ------------------------------------------------------------------

def test_lstresp_reads_the_data_of_the_previous_reply(clock: FakeClock) -> None:
    emu = ItlaEmulator(clock=clock)
    ask(emu, "PWR", 1150, True)
    assert ask(emu, "LstResp") == Reply(Status.OK, False, 0x13, 1150)
    assert ask(emu, "LstResp").data == 1150  # reading it leaves the last response as it was
    ask(emu, "OPSH")
    assert ask(emu, "LstResp").data == 1350
    assert ask(emu, "LstResp", 1, True).status is Status.XE  # read-only: RNW
    assert ask(emu, "NOP").data & 0x0F == 0x2


def _aea_words(emu: ItlaEmulator, reg: str) -> list[int]:
    first = ask(emu, reg)
    assert first.status is Status.AEA and first.data % 2 == 0
    words = [ask(emu, "EAR").signed for _ in range(first.data // 2)]
    assert ask(emu, "EAR").status is Status.XE  # past the end: ERE
    return words


def test_currents_and_temps_are_aea_words(clock: FakeClock) -> None:
    emu = ItlaEmulator(clock=clock, time_to_lock_s=0.1, power_dbm=10.0)
    assert _aea_words(emu, "Temps") == [3500, 2500]      # 0.01 degC: chip, case
    assert _aea_words(emu, "Currents") == [1500, 0]      # 0.1 mA: TEC, diode (no light)
    ask(emu, "ResEna", 8, True)
    assert _aea_words(emu, "Currents")[1] == 0           # still tuning: no light yet
    clock.advance(0.1)
    assert _aea_words(emu, "Currents") == [1500, 700]    # 30 mA + 4 mA/mW x 10 mW


# --- byte framing: no inter-byte timeout, recovery by single NOP bytes -------------------------

def _read_frame(sock: socket.socket) -> bytes:
    buf = b""
    while len(buf) < 4:
        chunk = sock.recv(4 - len(buf))
        assert chunk, "the emulator closed the connection"
        buf += chunk
    return buf


def test_a_partial_frame_is_kept_until_single_nop_bytes_complete_it() -> None:
    emu = ItlaEmulator()
    with TcpEmulatorServer(itla_connection_handler(emu), name="itla-framing") as srv:
        with socket.create_connection(srv.address, timeout=5.0) as sock:
            # a PWR write that lost its last byte on the wire
            sock.sendall(encode_request(0x31, 1100, write=True)[:3])
            time.sleep(0.7)  # longer than any frame gap: the bytes must still be there
            sock.sendall(encode_request(0x00))
            shifted = decode_reply(_read_frame(sock))
            assert shifted.ce  # 3 old bytes + 1 new one: a bad checksum, not executed
            sock.settimeout(0.3)
            got = b""
            for _ in range(4):  # single NOP bytes until a 4-byte reply comes back
                sock.sendall(b"\x00")
                try:
                    got += sock.recv(4)
                except TimeoutError:
                    continue
                break
            sock.settimeout(5.0)
            while len(got) < 4:
                got += sock.recv(4 - len(got))
            assert decode_reply(got).register == 0x00
            sock.sendall(encode_request(0x31))
            assert decode_reply(_read_frame(sock)) == Reply(Status.OK, False, 0x31, 1000)


def test_lose_byte_fault_shifts_the_frames() -> None:
    emu = ItlaEmulator()
    emu.inject(lose_byte=1)
    with TcpEmulatorServer(itla_connection_handler(emu), name="itla-lose") as srv:
        with socket.create_connection(srv.address, timeout=5.0) as sock:
            sock.sendall(encode_request(0x31))  # arrives as 3 bytes: no reply
            sock.sendall(encode_request(0x30))  # completes the shifted frame: CE
            assert decode_reply(_read_frame(sock)).ce
            assert emu.faults.lose_byte == 0
