"""The OCS emulator on its own wire: what a lab's SCPI client sees, line by line.

Most tests call ``handle_line`` with a hand-moved clock (switching time without sleeping);
the TCP tests speak to ``ocs_connection_handler`` over a loopback socket; the process tests
start ``python -m oddl.drivers.emulators.ocs_serve`` and read its JSON ready line.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeClock
from helpers import serving, stop_with_sigterm

from oddl.common.errors import ConfigError
from oddl.drivers.emulators.ocs import OcsEmulator
from oddl.drivers.emulators.ocs_serve import ocs_connection_handler
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer

NO_ERROR = '0,"No error"'


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
def emu(clock: FakeClock) -> OcsEmulator:
    return OcsEmulator(16, switch_s=0.025, clock=clock, serial_number="EMU42")


def ask(emu: OcsEmulator, line: str) -> list[str]:
    """The answer lines to `line` (CR-LF stripped)."""
    out = []
    for _, data in emu.handle_line(line):
        if data is not None:
            assert data.endswith(b"\r\n"), data
            out.append(data[:-2].decode("ascii"))
    return out


def errors(emu: OcsEmulator) -> list[int]:
    codes = emu.error_codes()
    ask(emu, "*CLS")
    return codes


# ----- identity and the connection commands ----------------------------------------------------

def test_identity_names_the_size_in_the_model_code(emu: OcsEmulator) -> None:
    assert ask(emu, "*IDN?") == ["Polatis,N-OST-16x16-LA1-DMHNS,EMU42,0.0.0-emu"]
    assert ask(emu, ":OXC:SWIT:SIZE?") == ["16,16"]


@pytest.mark.parametrize("header", [":OXC:SWITch:CONNect:ADD", "oxc:swit:conn:add",
                                    ":Oxc:Swit:Conn:Add", "OXC:SWITCH:CONNECT:ADD"])
def test_long_and_short_forms_in_any_case(emu: OcsEmulator, header: str) -> None:
    ask(emu, f"{header} (@1,2),(@17,18)")
    assert ask(emu, ":oxc:swit:conn:stat?") == ["(@1,2),(@17,18)"]
    assert errors(emu) == []


def test_state_and_port_answers(emu: OcsEmulator) -> None:
    assert ask(emu, ":OXC:SWITch:CONNect:STATe?") == ["(@),(@)"]
    ask(emu, ":oxc:swit:conn:add (@3,1),(@20,17)")
    assert ask(emu, ":oxc:swit:conn:stat?") == ["(@1,3),(@17,20)"]  # by ingress
    assert ask(emu, ":oxc:swit:conn:port? 3") == ['"20"']
    assert ask(emu, ":oxc:swit:conn:port? 17") == ['"1"']  # either side
    assert ask(emu, ":oxc:swit:conn:port? 2") == ['""']  # no connection: empty
    assert errors(emu) == []


def test_only_replaces_the_table_and_add_leaves_it(emu: OcsEmulator, clock: FakeClock) -> None:
    ask(emu, ":oxc:swit:conn:add (@1,2),(@17,18)")
    clock.advance(1)
    ask(emu, ":oxc:swit:conn:only (@2,3),(@18,19)")
    assert emu.connections == {2: 18, 3: 19}
    assert emu.switch.busy_until == pytest.approx(clock() + 0.025)  # 2->18 stayed as it was
    ask(emu, ":oxc:swit:conn:add (@4),(@20)")
    assert emu.connections == {2: 18, 3: 19, 4: 20}


def test_subtract_by_pairs_or_by_ports(emu: OcsEmulator) -> None:
    ask(emu, ":oxc:swit:conn:add (@1,2,3,4),(@17,18,19,20)")
    ask(emu, ":oxc:swit:conn:sub (@1),(@17)")
    ask(emu, ":OXC:SWITch:CONNect:SUBtract (@2,3),(@)")  # a published client's form
    assert emu.connections == {4: 20}
    ask(emu, ":oxc:swit:conn:sub (@4),(@21)")  # not that pair: refused, kept
    assert emu.connections == {4: 20} and errors(emu) == [-221]
    ask(emu, ":oxc:swit:disc:all")
    assert emu.connections == {}


@pytest.mark.parametrize(("line", "code"), [
    (":oxc:swit:conn:add (@1),(@18)", -221),  # ingress 1 is in use
    (":oxc:swit:conn:add (@5),(@17)", -221),  # egress 17 is in use
    (":oxc:swit:conn:add (@5,5),(@20,21)", -221),  # a port twice
    (":oxc:swit:conn:add (@33),(@20)", -222),  # no such port
    (":oxc:swit:conn:add (@20),(@5)", -222),  # egress given as ingress
    (":oxc:swit:conn:only (@5,6),(@20)", -224),  # one egress per ingress
    (":oxc:swit:conn:add (@5;6),(@20)", -104),  # ';' ends the unit inside the list
    (":oxc:swit:conn:add 5,20", -104),  # connections take channel lists
    (":oxc:swit:conn:add (@x),(@20)", -104),
    (":oxc:swit:conn:add (@5)", -109),
    (":oxc:swit:conn:stat? 1", -108),
    (":oxc:swit:conn:port? 40", -222),
    (":oxc:swit:conn:frob (@5),(@20)", -113),
    (":oxc:swit:conn:add? (@5),(@20)", -113),
])
def test_bad_requests_go_on_the_error_queue_and_change_nothing(emu: OcsEmulator, line: str,
                                                                code: int) -> None:
    ask(emu, ":oxc:swit:conn:add (@1),(@17)")
    assert ask(emu, line) == []
    assert emu.connections == {1: 17}
    assert code in errors(emu)


def test_the_error_queue(emu: OcsEmulator) -> None:
    assert ask(emu, ":SYST:ERR?") == [NO_ERROR]
    ask(emu, ":oxc:swit:conn:add (@40),(@17)")
    ask(emu, ":frob")
    assert ask(emu, "*ESR?") == ["+48"]  # command error (32) and execution error (16)
    assert ask(emu, ":SYSTem:ERRor:NEXT?") == ['-222,"Data out of range"']
    assert ask(emu, ":syst:err?") == ['-113,"Undefined header"']
    assert ask(emu, ":syst:err?") == [NO_ERROR]
    for _ in range(40):
        ask(emu, ":frob")
    assert len(emu.error_codes()) == 30 and emu.error_codes()[-1] == -350
    ask(emu, "*CLS")
    assert ask(emu, ":syst:err:all?") == [NO_ERROR]
    ask(emu, ":frob;:frob")
    assert ask(emu, ":syst:err:all?") == ['-113,"Undefined header",-113,"Undefined header"']


def test_each_query_of_a_line_answers_on_its_own_line(emu: OcsEmulator) -> None:
    assert ask(emu, "*IDN?;:oxc:swit:size?;*OPC?") == [
        "Polatis,N-OST-16x16-LA1-DMHNS,EMU42,0.0.0-emu", "16,16", "1"]


def test_a_unit_without_colon_takes_the_path_of_the_one_before(emu: OcsEmulator) -> None:
    assert ask(emu, ":oxc:swit:conn:only (@1),(@17); stat?") == ["(@1),(@17)"]
    assert ask(emu, ":oxc:swit:conn:add (@2),(@18);port? 18") == ['"2"']
    assert errors(emu) == []


def test_rst_disconnects_and_enables_but_keeps_the_error_queue(emu: OcsEmulator) -> None:
    ask(emu, ":oxc:swit:conn:add (@1),(@17);:oxc:swit:port:dis (@2);:frob")
    ask(emu, "*RST")
    assert emu.connections == {} and ask(emu, ":oxc:swit:port:stat? (@2)") == ["(E)"]
    assert emu.error_codes() == [-113]


# ----- switching time, ports and light ------------------------------------------------------

def test_opc_is_due_after_the_switching_time_of_each_connection(emu: OcsEmulator,
                                                                clock: FakeClock) -> None:
    answers = emu.handle_line(":oxc:swit:conn:add (@1,2,3),(@17,18,19);*OPC?")
    assert answers == [(pytest.approx(clock() + 0.075), b"1\r\n")]
    [(due, data)] = emu.handle_line("*WAI")
    assert data is None and due == pytest.approx(clock() + 0.075)
    clock.advance(0.1)
    assert emu.handle_line("*OPC?") == [(clock(), b"1\r\n")]


def test_light_reaches_the_egress_less_the_loss_once_settled(emu: OcsEmulator,
                                                             clock: FakeClock) -> None:
    emu.set_input_dbm(1, -3.0)
    ask(emu, ":oxc:swit:conn:add (@1),(@17)")
    assert ask(emu, ":pmon:pow? (@1,17,18)") == ["(-3.00,-60.00,-60.00)"]  # still switching
    clock.advance(0.05)
    assert ask(emu, ":PMONitor:POWer? (@1,17,18)") == ["(-3.00,-4.50,-60.00)"]
    ask(emu, ":oxc:swit:port:dis (@17)")
    assert ask(emu, ":pmon:pow? (@17)") == ["(-60.00)"]
    assert ask(emu, ":oxc:swit:port:stat? (@1,17)") == ["(E,D)"]
    ask(emu, ":oxc:swit:port:enab (@17)")
    assert ask(emu, ":pmon:pow? (@17)") == ["(-4.50)"]


def test_power_queries_take_at_most_256_ports() -> None:
    emu = OcsEmulator(130)
    assert ask(emu, f":pmon:pow? (@1:{256})")[0].count(",") == 255
    assert ask(emu, ":pmon:pow? (@1:257)") == [] and emu.error_codes() == [-223]


def test_a_failed_port_refuses_its_connection_and_the_rest_is_made(emu: OcsEmulator) -> None:
    emu.fail_port(2)
    ask(emu, ":oxc:swit:conn:add (@1,2,3),(@17,18,19)")
    assert emu.connections == {1: 17, 3: 19}
    assert ask(emu, ":oxc:swit:port:stat? (@1,2)") == ["(E,F)"]
    assert errors(emu) == [-240]
    emu.fail_port(2, failed=False)
    ask(emu, ":oxc:swit:conn:add (@2),(@18)")
    assert emu.connections == {1: 17, 2: 18, 3: 19}


def test_misroute_fault_leaves_a_connection_unmade_without_an_error(emu: OcsEmulator) -> None:
    emu.inject(misroute_next=1)
    ask(emu, ":oxc:swit:conn:add (@1,2),(@17,18)")
    assert emu.connections == {1: 17} and errors(emu) == []
    ask(emu, ":oxc:swit:conn:add (@2),(@18)")
    assert emu.connections == {1: 17, 2: 18}


def test_faults_are_checked(emu: OcsEmulator) -> None:
    with pytest.raises(ConfigError, match="misroute_next"):
        emu.inject(misroute_next=-1)


def test_a_controller_restart_drops_the_session_and_keeps_the_connections(
        emu: OcsEmulator) -> None:
    ask(emu, ":oxc:swit:conn:add (@1),(@17);:frob")
    emu.inject(reset_next=True)
    assert emu.process(b"*IDN?").drop_connection
    assert emu.connections == {1: 17} and emu.error_codes() == []
    emu.inject(no_answer=1)
    assert emu.process(b":oxc:swit:conn:add (@2),(@18)").answers == ()
    assert emu.connections == {1: 17}  # a lost request is not executed


# ----- the state file ---------------------------------------------------------------------------

def test_connections_outlive_a_restart_through_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "ocs.json"
    first = OcsEmulator(8, state_file=state)
    ask(first, ":oxc:swit:conn:add (@1,2),(@9,10);:oxc:swit:port:dis (@3)")
    second = OcsEmulator(8, state_file=state)
    assert second.connections == {1: 9, 2: 10}
    assert ask(second, ":oxc:swit:port:stat? (@3)") == ["(D)"]
    with pytest.raises(ConfigError, match="--size 8"):
        OcsEmulator(16, state_file=state)
    state.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="not an OCS emulator state file"):
        OcsEmulator(8, state_file=state)


# ----- over TCP -----------------------------------------------------------------------------------

@pytest.fixture
def tcp() -> Iterator[tuple[OcsEmulator, socket.socket]]:
    emu = OcsEmulator(16, switch_s=0.05)
    with TcpEmulatorServer(ocs_connection_handler(emu), name="ocs-emu") as server:
        with socket.create_connection(server.address, timeout=10) as sock:
            yield emu, sock


def read_lines(sock: socket.socket, n: int) -> list[bytes]:
    data = b""
    while data.count(b"\r\n") < n:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data.split(b"\r\n")[:n]


def test_tcp_answers_end_in_crlf_whatever_the_client_sends(tcp: tuple[OcsEmulator, socket.socket]
                                                           ) -> None:
    _, sock = tcp
    sock.sendall(b"*idn?\n:oxc:swit:size?\r\n*OPC?\r")
    assert read_lines(sock, 3) == [b"Polatis,N-OST-16x16-LA1-DMHNS,EMU00001,0.0.0-emu",
                                   b"16,16", b"1"]


def test_tcp_opc_answers_after_the_switching_time(tcp: tuple[OcsEmulator, socket.socket]) -> None:
    emu, sock = tcp
    t0 = time.monotonic()
    sock.sendall(b":oxc:swit:conn:add (@1,2,3,4),(@17,18,19,20)\n*OPC?\n:SYST:ERR?\n")
    assert read_lines(sock, 2) == [b"1", NO_ERROR.encode()]
    assert time.monotonic() - t0 >= 4 * 0.05 * 0.9  # a lower bound: never timing luck
    assert emu.connections == {1: 17, 2: 18, 3: 19, 4: 20}


# ----- the command line ---------------------------------------------------------------------------

def serve_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "oddl.drivers.emulators.ocs_serve", "--listen", "127.0.0.1:0",
            "--size", "16", *extra]


def connect_and_ask(port: int, text: bytes, n: int) -> list[bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(text)
        return read_lines(sock, n)


@pytest.mark.e2e
def test_serve_prints_a_json_ready_line_and_stops_on_sigterm() -> None:
    with serving(serve_argv("--serial", "SN7"), 30, "ocs_serve") as (proc, line):
        ready = json.loads(line)
        assert ready["ready"] is True and ready["size"] == 16 and ready["serial"] == "SN7"
        port = ready["port"]
        assert ready["resource"] == f"TCPIP0::127.0.0.1::{port}::SOCKET"
        assert ready["url"] == f"socket://127.0.0.1:{port}" and ready["state"] is None
        assert connect_and_ask(port, b"*IDN?\n", 1)[0].startswith(b"Polatis,N-OST-16x16")
        assert stop_with_sigterm(proc) == 0


@pytest.mark.e2e
def test_serve_keeps_connections_across_a_killed_process(tmp_path: Path) -> None:
    state = tmp_path / "ocs.json"
    with serving(serve_argv("--state", str(state), "--switch-ms", "1"), 30) as (proc, line):
        port = json.loads(line)["port"]
        assert connect_and_ask(port, b":oxc:swit:conn:only (@1,2),(@17,18)\n*OPC?\n", 1) == [b"1"]
        proc.send_signal(signal.SIGKILL)  # no clean shutdown: the file must already hold it
        proc.wait(timeout=10)
    with serving(serve_argv("--state", str(state)), 30) as (proc, line):
        assert json.loads(line)["state"] == str(state)
        port = json.loads(line)["port"]
        assert connect_and_ask(port, b":oxc:swit:conn:stat?\n", 1) == [b"(@1,2),(@17,18)"]
        assert stop_with_sigterm(proc) == 0


@pytest.mark.e2e
def test_serve_names_a_state_file_of_another_size(tmp_path: Path) -> None:
    state = tmp_path / "ocs.json"
    OcsEmulator(8, state_file=state).handle_line(":oxc:swit:conn:add (@1),(@9)")
    done = subprocess.run(serve_argv("--state", str(state)), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--size 8" in done.stderr
