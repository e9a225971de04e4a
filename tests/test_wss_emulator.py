"""Tests of the WSS emulator: line core, optics read-out, faults, fuzzing, TCP and CLI hooks."""

from __future__ import annotations

import argparse
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oddl.drivers.interfaces import BLOCKED_DB, Route
from oddl.drivers.tcpserve import TcpEmulatorServer
from oddl.drivers.wss_emulator import (
    MAX_LINE,
    WssEmulator,
    WssFaults,
    add_arguments,
    wss_connection_handler,
)
from oddl.errors import ConfigError


class FakeClock:
    """A clock the test advances by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def emu(clock: FakeClock) -> WssEmulator:
    return WssEmulator(clock=clock, settle_s=0.1)


def centre(emu: WssEmulator, channel: int) -> float:
    return emu.centre_thz(channel)


# --- commands ---------------------------------------------------------------------------------------

def test_identity_queries(emu: WssEmulator) -> None:
    assert emu.handle_line("SNO?") == ["SNO?", "WSS-EMU-0001", "OK"]
    assert emu.handle_line("MFD?\r\n") == ["MFD?", "2024-01-01", "OK"]
    assert emu.handle_line("  sno?  ") == ["  sno?  ", "WSS-EMU-0001", "OK"]


def test_power_up_state_is_all_blocked(emu: WssEmulator) -> None:
    echo, result, ok = emu.handle_line("RRA?")
    assert (echo, ok) == ("RRA?", "OK")
    assert result == ";".join(f"{ch},0,99.9" for ch in range(1, 49))
    assert all(r == Route(0, BLOCKED_DB) for r in emu.active_table().values())
    assert emu.route(centre(emu, 1)) is None


def test_staging_does_not_change_route_or_rra(emu: WssEmulator) -> None:
    before = emu.handle_line("RRA?")
    assert emu.handle_line("URA 1,2,0.0;2,3,4.5") == ["URA 1,2,0.0;2,3,4.5", "OK"]
    assert emu.route(centre(emu, 1)) is None
    assert emu.handle_line("RRA?") == before
    assert emu.staged_table()[2] == Route(3, 4.5)
    assert emu.active_table()[2] == Route(0, BLOCKED_DB)


def test_rsw_changes_route_after_settle(emu: WssEmulator, clock: FakeClock) -> None:
    emu.handle_line("URA 1,2,0.0;2,3,4.5")
    assert emu.handle_timed("RSW") == [(0.0, "RSW"), (0.1, "OK")]
    assert emu.settling()
    assert emu.route(centre(emu, 1)) is None  # settling: light undefined
    assert emu.route(centre(emu, 1), now=clock.t + 0.0999) is None
    assert emu.handle_line("RRA?")[1].startswith("1,2,0.0;2,3,4.5;3,0,99.9")
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


def test_route_none_when_blocked_by_attenuation_or_port_0(emu: WssEmulator,
                                                          clock: FakeClock) -> None:
    emu.handle_line("URA 1,2,99.9;2,0,0.0;3,4,25.0")
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


def test_grid_parameters() -> None:
    emu = WssEmulator(first_thz=191.35, spacing_ghz=50.0, channels=96, settle_s=0.0)
    assert emu.channel_at(191.35) == 1
    assert emu.channel_at(191.35 + 43 * 0.05) == 44
    assert emu.channel_at(191.35 + 95 * 0.05 + 0.03) is None


def test_active_table_is_a_copy(emu: WssEmulator) -> None:
    table = emu.active_table()
    table[1] = Route(1, 0.0)
    assert emu.active_table()[1] == Route(0, BLOCKED_DB)


def test_ura_updates_only_listed_channels(emu: WssEmulator) -> None:
    emu.handle_line("URA 1,1,0.0;2,1,0.0")
    emu.handle_line("URA 2,3,1.0;")
    staged = emu.staged_table()
    assert staged[1] == Route(1, 0.0) and staged[2] == Route(3, 1.0)


@pytest.mark.parametrize("line, code", [
    ("URA 1,1,0.0;49,1,0.0", 3),
    ("URA 1,1,0.0;0,1,0.0", 3),
    ("URA 1,1,0.0;2,5,0.0", 4),
    ("URA 1,1,0.0;2,1,25.1", 5),
    ("URA 1,1,0.0;2,1,50", 5),
    ("URA 1,1,0.0;2,1,1.05", 5),
    ("URA 1,1,0.0;1,2,0.0", 6),
    ("URA 1,1,0.0;2,1", 2),
    ("URA 1,1,0.0;;2,1,0.0", 2),
    ("URA 1,1,0.0; 2,1,0.0", 2),
    ("URA 1,1,-1.0", 2),
    ("URA 1,1,0.0;2,1,1e1", 2),
    ("URA", 2),
    ("URA ;", 2),
    ("RSW now", 2),
    ("SNO? 1", 2),
    ("", 2),
    ("   ", 2),
    ("HELLO", 1),
    ("URA1,1,0.0", 1),
    ("x" * (MAX_LINE + 1), 2),
])
def test_bad_lines_get_error_and_change_nothing(emu: WssEmulator, line: str, code: int) -> None:
    emu.handle_line("URA 3,4,2.0")
    staged, active = emu.staged_table(), emu.active_table()
    reply = emu.handle_line(line)
    assert len(reply) == 2
    assert reply[1].startswith(f"ERR {code} ")
    assert emu.staged_table() == staged and emu.active_table() == active
    assert emu.handle_line("SNO?")[-1] == "OK"  # still serving


def test_echo_is_sanitised(emu: WssEmulator) -> None:
    assert emu.handle_line("SN\x00O?\u00e9")[0] == "SN?O??"


# --- faults ---------------------------------------------------------------------------------------

def test_no_answer_for_next_k_lines_and_not_executed(emu: WssEmulator) -> None:
    emu.faults.no_answer = 2
    assert emu.handle_line("URA 1,1,0.0") == []
    assert emu.handle_line("SNO?") == []
    assert emu.staged_table()[1] == Route(0, BLOCKED_DB)
    assert emu.handle_line("SNO?")[-1] == "OK"
    assert emu.faults.no_answer == 0


def test_no_answer_always(emu: WssEmulator) -> None:
    emu.inject(no_answer_always=True)
    assert all(emu.handle_line("SNO?") == [] for _ in range(5))
    emu.inject(no_answer_always=False)
    assert emu.handle_line("SNO?")[-1] == "OK"


def test_late_answer_delays_every_line(emu: WssEmulator) -> None:
    emu.faults.late_s = 0.5
    assert emu.handle_timed("SNO?") == [(0.5, "SNO?"), (0.5, "WSS-EMU-0001"), (0.5, "OK")]
    assert emu.handle_timed("RSW") == [(0.5, "RSW"), (pytest.approx(0.6), "OK")]
    assert emu.handle_timed("FOO")[0][0] == 0.5


def test_garbage_answer(emu: WssEmulator) -> None:
    emu.faults.garbage = 1
    reply = emu.handle_line("URA 1,1,0.0")
    assert len(reply) == 1
    assert any(ord(c) > 0x7E for c in reply[0])
    assert "\r" not in reply[0] and "\n" not in reply[0]
    assert emu.staged_table()[1] == Route(0, BLOCKED_DB)
    assert emu.handle_line("URA 1,1,0.0") == ["URA 1,1,0.0", "OK"]


def test_error_line_on_next_command(emu: WssEmulator) -> None:
    emu.faults.error_next = 1
    assert emu.handle_line("URA 1,1,0.0") == ["URA 1,1,0.0", "ERR 7 device fault (injected)"]
    assert emu.staged_table()[1] == Route(0, BLOCKED_DB)
    assert emu.handle_line("URA 1,1,0.0")[-1] == "OK"


def test_reset_clears_both_tables_and_loses_the_line(emu: WssEmulator, clock: FakeClock) -> None:
    emu.handle_line("URA 1,1,0.0;2,2,3.0")
    emu.handle_line("RSW")
    emu.handle_line("URA 3,3,0.0")
    emu.faults.reset_next = True
    assert emu.handle_line("SNO?") == []
    assert not emu.faults.reset_next
    blocked = {ch: Route(0, BLOCKED_DB) for ch in range(1, 49)}
    assert emu.active_table() == blocked and emu.staged_table() == blocked
    assert not emu.settling()
    assert emu.route(centre(emu, 1)) is None


def _pattern(seed: int, **faults: float) -> list[tuple[str, ...]]:
    emu = WssEmulator(seed=seed, faults=WssFaults(**faults))  # type: ignore[arg-type]
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


# --- fuzzing --------------------------------------------------------------------------------------

_ENTRY = re.compile(r"([0-9]+),([0-9]+),([0-9]+(?:\.([0-9]+))?)")


def oracle_accepts(line: str, channels: int = 48, ports: int = 4, max_att: float = 25.0) -> bool:
    """Whether the documented grammar (module docstring) accepts `line`. Independent model."""
    line = line.removesuffix("\n").removesuffix("\r")
    if len(line) > MAX_LINE or "\r" in line or "\n" in line:
        return False
    text = line.strip(" \t")
    if not text or not text.split(" ")[0].split("\t")[0].isascii():
        return False
    head = re.match(r"([^ \t]+)[ \t]*(.*)$", text, re.DOTALL)
    assert head is not None
    word, args = head.group(1).upper(), head.group(2)
    if word in ("SNO?", "MFD?", "RRA?", "RSW"):
        return args == ""
    if word != "URA" or not args:
        return False
    seen: set[int] = set()
    for entry in args.removesuffix(";").split(";"):
        m = _ENTRY.fullmatch(entry)
        if m is None:
            return False
        ch, port, att = int(m.group(1)), int(m.group(2)), Decimal(m.group(3))
        if not 1 <= ch <= channels or not 0 <= port <= ports or ch in seen:
            return False
        seen.add(ch)
        if att != Decimal("99.9") and (att > Decimal(str(max_att))
                                        or (m.group(4) or "0")[1:].strip("0")):
            return False
    return True


def check_reply(emu: WssEmulator, line: str) -> None:
    """Run `line` and check the reply shape, the error/OK verdict and atomicity."""
    staged, active = emu.staged_table(), emu.active_table()
    reply = emu.handle_line(line)
    assert len(reply) >= 2
    assert all(re.fullmatch(r"[\x20-\x7e]*", r) for r in reply)
    accepted = oracle_accepts(line)
    if accepted:
        assert reply[-1] == "OK", (line, reply)
    else:
        assert reply[-1].startswith("ERR "), (line, reply)
        assert emu.staged_table() == staged and emu.active_table() == active


VALID_LINES = ["SNO?", "MFD?", "RRA?", "RSW", "URA 1,1,0.0", "URA 52,3,0.0;3,4,99.9",
               "URA 1,2,0.0;2,3,12.5;48,4,25.0;", "ura 7,0,0"]


@st.composite
def ura_lines(draw: st.DrawFn) -> str:
    entries = draw(st.lists(st.tuples(
        st.integers(1, 48) | st.integers(-2, 60),
        st.integers(0, 4) | st.integers(-1, 6),
        st.sampled_from(["0", "0.0", "12.5", "25.0", "99.9", "99.90", "10.00"])
        | st.sampled_from(["25.1", "3.14", "-1", "1e1", "", "7.", ".5", "100", "99.8"])),
        min_size=0, max_size=6))
    body = ";".join(f"{c},{p},{a}" for c, p, a in entries)
    return "URA " + body + draw(st.sampled_from(["", ";", " ", ";;"]))


@st.composite
def mutated_lines(draw: st.DrawFn) -> str:
    line = draw(st.sampled_from(VALID_LINES) | ura_lines())
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 4]))):
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        pos = draw(st.integers(0, len(line)))
        ch = draw(st.sampled_from(list(";,. \t0123456789?AURSW\x00\u00e9\r\n")) | st.characters())
        if op == "insert":
            line = line[:pos] + ch + line[pos:]
        elif op == "delete":
            line = line[:pos] + line[pos + 1:]
        else:
            line = line[:pos] + ch + line[pos + 1:]
    return line


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(max_size=120))
def test_fuzz_random_text(line: str) -> None:
    check_reply(WssEmulator(settle_s=0.0), line)


@FUZZ
@given(mutated_lines())
def test_fuzz_mutated_lines(line: str) -> None:
    check_reply(WssEmulator(settle_s=0.0), line)


@settings(FUZZ, max_examples=80)
@given(st.lists(mutated_lines(), max_size=8))
def test_fuzz_sequences_keep_serving(lines: list[str]) -> None:
    emu = WssEmulator(settle_s=0.0)
    for line in lines:
        check_reply(emu, line)
    assert emu.handle_line("SNO?")[-1] == "OK"


@FUZZ
@given(st.dictionaries(st.integers(1, 48),
                       st.tuples(st.integers(0, 4), st.integers(0, 250) | st.just(999)),
                       min_size=1, max_size=48))
def test_fuzz_valid_ura_stages_exactly(entries: dict[int, tuple[int, int]]) -> None:
    emu = WssEmulator(settle_s=0.0)
    line = "URA " + ";".join(f"{c},{p},{a / 10:.1f}" for c, (p, a) in entries.items())
    assert emu.handle_line(line) == [line, "OK"]
    staged = emu.staged_table()
    assert all(staged[c] == Route(p, a / 10) for c, (p, a) in entries.items())
    emu.handle_line("RSW")
    assert emu.active_table() == staged


def test_oracle_agrees_on_examples() -> None:
    assert all(oracle_accepts(line) for line in VALID_LINES if "52" not in line)
    assert not oracle_accepts("URA 52,3,0.0")
    assert not oracle_accepts("URA 1,1,3.15")
    assert oracle_accepts("URA 1,1,3.10")


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
        assert read_lines(sock, 3) == [b"SNO?", b"WSS-EMU-0001", b"OK"]
        sock.sendall(b"URA 1,2,")  # a line split across packets
        sock.sendall(b"0.0\r\nRSW\r\n")
        assert read_lines(sock, 4) == [b"URA 1,2,0.0", b"OK", b"RSW", b"OK"]
        sock.sendall(b"BAD\xff\r\n")
        assert read_lines(sock, 2) == [b"BAD?", b"ERR 1 unknown command BAD?"]
    assert emu.active_table()[1] == Route(2, 0.0)


def test_connection_handler_survives_overlong_line() -> None:
    emu = WssEmulator()
    with TcpEmulatorServer(wss_connection_handler(emu), name="wss-test") as server, \
            socket.create_connection(server.address, timeout=2) as sock:
        sock.sendall(b"U" * (MAX_LINE + 100))
        reply = read_lines(sock, 2)
        assert reply[1].startswith(b"ERR 2 ")
        sock.sendall(b"\r\nSNO?\r\n")  # the rest of the long line, then a good one
        tail = read_lines(sock, 5)
        assert tail[-3:] == [b"SNO?", b"WSS-EMU-0001", b"OK"]


# --- CLI hooks ------------------------------------------------------------------------------------

def test_add_arguments_defaults_and_validation() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.listen, args.ports, args.settle_ms, args.serial, args.seed) == (
        "127.0.0.1:0", 4, 100.0, "WSS-EMU-0001", 0)
    for bad in (["--listen", "nohost"], ["--ports", "0"], ["--settle-ms", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_run_serves_prints_url_and_exits_0_on_sigterm() -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "oddl.drivers.wss_emulator", "--listen", "127.0.0.1:0",
         "--settle-ms", "1", "--serial", "CLI-7", "--ports", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(timeout=10), "the emulator printed no address"
        url = proc.stdout.readline().decode().strip()
        m = re.fullmatch(r"socket://127\.0\.0\.1:(\d+)", url)
        assert m, url
        with socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=2) as sock:
            sock.sendall(b"SNO?\r\nURA 1,3,0.0\r\n")
            assert read_lines(sock, 5) == [b"SNO?", b"CLI-7", b"OK", b"URA 1,3,0.0",
                                           b"ERR 4 port 3 out of range 0-2"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert proc.stdout.read() == b""  # exactly one line on stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
