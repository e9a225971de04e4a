"""Tests of the WSS emulator: line core, optics read-out, faults, TCP and CLI hooks (fuzzing:
test_wss_emulator_fuzz)."""

from __future__ import annotations

import argparse
import re
import socket
import sys

import pytest
from fakes import FakeClock
from fakes import lab_wss as lab
from helpers import close_child, first_line, start_child, stop_with_sigterm

from oddl.common.errors import ConfigError
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.emulators.wss import MAX_LINE, WssEmulator, WssFaults
from oddl.drivers.emulators.wss_serve import add_arguments, wss_connection_handler
from oddl.drivers.interfaces import BLOCKED_DB, Route

BLOCKED = Route(99, BLOCKED_DB)
@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def emu(clock: FakeClock) -> WssEmulator:
    return lab(clock=clock, settle_s=0.1)


def centre(emu: WssEmulator, channel: int) -> float:
    return emu.centre_thz(channel)


# --- commands ---------------------------------------------------------------------------------------

def test_identity_queries(emu: WssEmulator) -> None:
    assert emu.handle_line("SNO?") == ["SNO?", "SN000001", "OK"]
    assert emu.handle_line("MFD?\r\n") == ["MFD?", "2024-01-01", "OK"]
    assert emu.handle_line("  sno?  ") == ["  sno?  ", "SN000001", "OK"]
    assert emu.handle_line("FWR?") == ["FWR?", "1.0.0", "OK"]
    assert emu.handle_line("HWR?") == ["HWR?", "1.0.0", "OK"]
    assert emu.handle_line("OSS?") == ["OSS?", "0x0000", "OK"]


def test_power_up_state_is_all_blocked(emu: WssEmulator) -> None:
    echo, result, ok = emu.handle_line("RRA?")
    assert (echo, ok) == ("RRA?", "OK")
    assert result == ";".join(f"{ch},99,99.9" for ch in range(1, 49))
    assert all(r == BLOCKED for r in emu.active_table().values())
    assert emu.route(centre(emu, 1)) is None


def test_staging_does_not_change_route_or_rra(emu: WssEmulator) -> None:
    before = emu.handle_line("RRA?")
    assert emu.handle_line("URA 1,2,0.0;2,3,4.5") == ["URA 1,2,0.0;2,3,4.5", "OK"]
    assert emu.route(centre(emu, 1)) is None
    assert emu.handle_line("RRA?") == before
    assert emu.staged_table()[2] == Route(3, 4.5)
    assert emu.active_table()[2] == BLOCKED


def test_rsw_changes_route_after_settle(emu: WssEmulator, clock: FakeClock) -> None:
    emu.handle_line("URA 1,2,0.0;2,3,4.5")
    assert emu.handle_timed("RSW") == [(0.0, "RSW"), (0.1, "OK")]
    assert emu.settling()
    assert emu.route(centre(emu, 1)) is None  # settling: light undefined
    assert emu.route(centre(emu, 1), now=clock.t + 0.0999) is None
    assert emu.handle_line("RRA?")[1].startswith("1,2,0.0;2,3,4.5;3,99,99.9")
    clock.t += 0.1
    assert not emu.settling()
    assert emu.route(centre(emu, 1)) == Route(2, 0.0)
    assert emu.route(centre(emu, 2)) == Route(3, 4.5)
    assert emu.route(centre(emu, 3)) is None  # still blocked


def test_second_rsw_restarts_settle(emu: WssEmulator, clock: FakeClock) -> None:
    emu.handle_line("URA 1,1,0.0")
    emu.handle_line("RSW")
    clock.t += 0.08
    emu.handle_line("RSW")
    clock.t += 0.05  # 0.13 s after the first RSW: the first period would be over
    assert emu.route(centre(emu, 1)) is None
    clock.t += 0.06
    assert emu.route(centre(emu, 1)) == Route(1, 0.0)


def test_route_none_when_blocked_by_attenuation_or_port_99(emu: WssEmulator,
                                                          clock: FakeClock) -> None:
    emu.handle_line("URA 1,2,99.9;2,99,0.0;3,4,25.0")
    emu.handle_line("RSW")
    clock.t += 1
    assert emu.route(centre(emu, 1)) is None
    assert emu.route(centre(emu, 2)) is None
    assert emu.route(centre(emu, 3)) == Route(4, 25.0)


def test_route_passband_edges(emu: WssEmulator, clock: FakeClock) -> None:
    emu.handle_line("URA 1,1,0.0;2,2,0.0;48,3,0.0")
    emu.handle_line("RSW")
    clock.t += 1
    f1 = 193.1
    assert emu.route(f1 - 0.0499) == Route(1, 0.0)
    assert emu.route(f1 + 0.0499) == Route(1, 0.0)
    assert emu.route(f1 + 0.0501) == Route(2, 0.0)
    assert emu.route(f1 - 0.0501) is None  # below channel 1's passband
    f48 = centre(emu, 48)
    assert f48 == pytest.approx(197.8)
    assert emu.route(f48 + 0.0499) == Route(3, 0.0)
    assert emu.route(f48 + 0.0501) is None  # above the last channel
    assert emu.route(float("nan")) is None


def test_factory_plan_numbers_50ghz_channels_from_0() -> None:
    emu = WssEmulator(settle_s=0.0)
    assert emu.channel_at(191.35) == 0
    assert emu.channel_at(191.35 + 43 * 0.05) == 43
    assert emu.centre_thz(95) == pytest.approx(196.10)
    assert emu.channel_at(191.35 + 95 * 0.05 + 0.03) is None
    assert emu.handle_line("CHW?") == ["CHW?", "50", "OK"]
    result = emu.handle_line("RRA?")[1]
    assert result == ";".join(f"{ch},99,99.9" for ch in range(96))
    assert emu.handle_line("URA 96,1,0.0")[-1] == "RER"
    assert emu.handle_line("URA 0,1,0.0;95,4,0.0")[-1] == "OK"


def test_plan_is_configurable() -> None:
    emu = WssEmulator(first_channel=21, first_thz=192.1, spacing_ghz=100.0, channels=40)
    assert emu.channel_at(192.1) == 21 and emu.channel_at(196.0) == 60
    assert emu.handle_line("CHW?")[1] == "100"
    assert emu.handle_line("URA 20,1,0.0")[-1] == "RER"
    assert emu.handle_line("URA 60,1,0.0")[-1] == "OK"


def test_active_table_is_a_copy(emu: WssEmulator) -> None:
    table = emu.active_table()
    table[1] = Route(1, 0.0)
    assert emu.active_table()[1] == BLOCKED


def test_ura_updates_only_listed_channels(emu: WssEmulator) -> None:
    emu.handle_line("URA 1,1,0.0;2,1,0.0")
    emu.handle_line("URA 2,3,1.0;")
    staged = emu.staged_table()
    assert staged[1] == Route(1, 0.0) and staged[2] == Route(3, 1.0)


@pytest.mark.parametrize("line, code", [
    ("URA 1,1,0.0;49,1,0.0", "RER"),
    ("URA 1,1,0.0;0,1,0.0", "RER"),
    ("URA 1,1,0.0;2,5,0.0", "RER"),
    ("URA 1,1,0.0;2,0,0.0", "RER"),
    ("URA 1,1,0.0;2,98,0.0", "RER"),
    ("URA 1,1,0.0;2,1,25.1", "RER"),
    ("URA 1,1,0.0;2,1,50", "RER"),
    ("URA 1,1,0.0;2,1,1.05", "AER"),
    ("URA 1,1,0.0;1,2,0.0", "VER"),
    ("URA 1,1,0.0;2,1", "AER"),
    ("URA 1,1,0.0;;2,1,0.0", "AER"),
    ("URA 1,1,0.0; 2,1,0.0", "AER"),
    ("URA 1,1,-1.0", "AER"),
    ("URA 1,1,0.0;2,1,1e1", "AER"),
    ("URA", "AER"),
    ("URA ;", "AER"),
    ("RSW now", "AER"),
    ("SNO? 1", "AER"),
    ("HELLO", "CER"),
    ("URA1,1,0.0", "CER"),
    ("x" * (MAX_LINE + 1), "AER"),
    ("CHW 25", "RER"),
    ("CHW x", "AER"),
    ("DCC 1=1:8", "VER"),  # not in flexgrid mode
    ("SUS XYZ", "VER"),
    ("RES 1", "AER"),
])
def test_bad_lines_get_error_and_change_nothing(emu: WssEmulator, line: str, code: str) -> None:
    emu.handle_line("URA 3,4,2.0")
    staged, active = emu.staged_table(), emu.active_table()
    reply = emu.handle_line(line)
    assert reply == [reply[0], code]
    assert emu.staged_table() == staged and emu.active_table() == active
    assert emu.handle_line("SNO?")[-1] == "OK"  # still serving


@pytest.mark.parametrize("line", ["", "   ", "\t"])
def test_empty_lines_get_no_answer(emu: WssEmulator, line: str) -> None:
    assert emu.handle_line(line) == []


def test_echo_is_sanitised(emu: WssEmulator) -> None:
    assert emu.handle_line("SN\x00O?\u00e9")[0] == "SN?O??"


# --- faults ---------------------------------------------------------------------------------------

def test_no_answer_for_next_k_lines_and_not_executed(emu: WssEmulator) -> None:
    emu.faults.no_answer = 2
    assert emu.handle_line("URA 1,1,0.0") == []
    assert emu.handle_line("SNO?") == []
    assert emu.staged_table()[1] == BLOCKED
    assert emu.handle_line("SNO?")[-1] == "OK"
    assert emu.faults.no_answer == 0


def test_no_answer_always(emu: WssEmulator) -> None:
    emu.inject(no_answer_always=True)
    assert all(emu.handle_line("SNO?") == [] for _ in range(5))
    emu.inject(no_answer_always=False)
    assert emu.handle_line("SNO?")[-1] == "OK"


def test_late_answer_delays_every_line(emu: WssEmulator) -> None:
    emu.faults.late_s = 0.5
    assert emu.handle_timed("SNO?") == [(0.5, "SNO?"), (0.5, "SN000001"), (0.5, "OK")]
    assert emu.handle_timed("RSW") == [(0.5, "RSW"), (pytest.approx(0.6), "OK")]
    assert emu.handle_timed("FOO")[0][0] == 0.5


def test_garbage_answer(emu: WssEmulator) -> None:
    emu.faults.garbage = 1
    reply = emu.handle_line("URA 1,1,0.0")
    assert len(reply) == 1
    assert any(ord(c) > 0x7E for c in reply[0])
    assert "\r" not in reply[0] and "\n" not in reply[0]
    assert emu.staged_table()[1] == BLOCKED
    assert emu.handle_line("URA 1,1,0.0") == ["URA 1,1,0.0", "OK"]


def test_error_line_on_next_command(emu: WssEmulator) -> None:
    emu.faults.error_next = 1
    assert emu.handle_line("URA 1,1,0.0") == ["URA 1,1,0.0", "VER"]
    assert emu.staged_table()[1] == BLOCKED
    assert emu.handle_line("URA 1,1,0.0")[-1] == "OK"


def test_reset_clears_both_tables_and_loses_the_line(emu: WssEmulator, clock: FakeClock) -> None:
    emu.handle_line("URA 1,1,0.0;2,2,3.0")
    emu.handle_line("RSW")
    emu.handle_line("URA 3,3,0.0")
    emu.faults.reset_next = True
    assert emu.handle_line("SNO?") == []
    assert not emu.faults.reset_next
    blocked = {ch: BLOCKED for ch in range(1, 49)}
    assert emu.active_table() == blocked and emu.staged_table() == blocked
    assert not emu.settling()
    assert emu.route(centre(emu, 1)) is None


def _pattern(seed: int, **faults: float) -> list[tuple[str, ...]]:
    emu = lab(seed=seed, faults=WssFaults(**faults))
    return [tuple(emu.handle_line("SNO?")) for _ in range(60)]


def test_random_faults_are_seeded() -> None:
    a = _pattern(5, drop_probability=0.3, garbage_probability=0.3)
    assert a == _pattern(5, drop_probability=0.3, garbage_probability=0.3)
    assert a != _pattern(6, drop_probability=0.3, garbage_probability=0.3)
    kinds = {"none" if not r else "ok" if r[-1] == "OK" else "garbage" for r in a}
    assert kinds == {"none", "ok", "garbage"}


def test_faults_from_config() -> None:
    f = WssFaults.from_mapping({"no_answer": 2, "late_s": 0.01, "drop_probability": 0.5})
    assert (f.no_answer, f.late_s, f.drop_probability) == (2, 0.01, 0.5)
    with pytest.raises(ConfigError, match="unknown key.*nope"):
        WssFaults.from_mapping({"nope": 1})
    with pytest.raises(ConfigError, match="no_answer"):
        WssFaults.from_mapping({"no_answer": -1})
    with pytest.raises(ConfigError, match="drop_probability"):
        WssFaults.from_mapping({"drop_probability": 2})
    with pytest.raises(ConfigError, match="reset_next"):
        WssFaults.from_mapping({"reset_next": "yes"})
    with pytest.raises(ConfigError, match="late_s"):
        WssFaults(late_s=float("inf"))
    emu = WssEmulator()
    with pytest.raises(ConfigError, match="unknown"):
        emu.inject(bogus=1)


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ConfigError):
        WssEmulator(ports=0)
    with pytest.raises(ConfigError):
        WssEmulator(max_attenuation_db=100.0)


# --- byte stream ----------------------------------------------------------------------------------

def read_lines(sock: socket.socket, n: int, timeout: float = 2.0) -> list[bytes]:
    sock.settimeout(timeout)
    buf = b""
    while buf.count(b"\r\n") < n:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed after {buf!r}"
        buf += chunk
    return buf.split(b"\r\n")[:n]


def test_connection_handler_lf_and_crlf_lines() -> None:
    emu = WssEmulator(settle_s=0.002)
    with TcpEmulatorServer(wss_connection_handler(emu), name="wss-test") as server, \
            socket.create_connection(server.address, timeout=2) as sock:
        sock.sendall(b"SNO?\n")
        assert read_lines(sock, 3) == [b"SNO?", b"SN000001", b"OK"]
        sock.sendall(b"URA 1,2,")  # a line split across packets
        sock.sendall(b"0.0\r\nRSW\r\n")
        assert read_lines(sock, 4) == [b"URA 1,2,0.0", b"OK", b"RSW", b"OK"]
        sock.sendall(b"BAD\xff\r\n")
        assert read_lines(sock, 2) == [b"BAD?", b"CER"]
        sock.sendall(b"SNO?\r")  # the manual: CR ends a command, LF is optional
        assert read_lines(sock, 3) == [b"SNO?", b"SN000001", b"OK"]
    assert emu.active_table()[1] == Route(2, 0.0)


def test_connection_handler_survives_overlong_line() -> None:
    emu = WssEmulator()
    with TcpEmulatorServer(wss_connection_handler(emu), name="wss-test") as server, \
            socket.create_connection(server.address, timeout=2) as sock:
        sock.sendall(b"U" * (MAX_LINE + 100))
        reply = read_lines(sock, 2)
        assert reply[1] == b"AER"
        sock.sendall(b"\r\nSNO?\r\n")  # the end of the long line, then a good one
        # how much of the long line's tail survives depends on how TCP cut it into reads
        sock.settimeout(2.0)
        buf = b""
        while not buf.endswith(b"SNO?\r\nSN000001\r\nOK\r\n"):
            chunk = sock.recv(4096)
            assert chunk, f"connection closed after {buf[-200:]!r}"
            buf += chunk


# --- CLI hooks ------------------------------------------------------------------------------------

def test_add_arguments_defaults_and_validation() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.listen, args.ports, args.settle_ms, args.serial, args.seed) == (
        "127.0.0.1:0", 4, 100.0, "SN000001", 0)
    assert (args.pty, args.first_channel, args.rra_per_line, args.no_echo) == (
        False, None, 0, False)
    for bad in (["--listen", "nohost"], ["--ports", "0"], ["--settle-ms", "-1"],
                ["--first-channel", "-1"], ["--rra-per-line", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_run_serves_prints_url_and_exits_0_on_sigterm() -> None:
    proc = start_child(
        [sys.executable, "-m", "oddl.drivers.emulators.wss_serve", "--listen", "127.0.0.1:0",
         "--settle-ms", "1", "--serial", "CLI-7", "--ports", "2"], capture_stderr=True)
    try:
        assert proc.stdout is not None
        url = first_line(proc, 10, "the emulator (no address)")
        m = re.fullmatch(r"socket://127\.0\.0\.1:(\d+)", url)
        assert m, url
        with socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=2) as sock:
            sock.sendall(b"SNO?\r\nURA 1,3,0.0\r\n")
            assert read_lines(sock, 5) == [b"SNO?", b"CLI-7", b"OK", b"URA 1,3,0.0",
                                           b"RER"]
        assert stop_with_sigterm(proc, 5) == 0
        assert proc.stdout.read() == ""  # exactly one line on stdout
    finally:
        close_child(proc)
