"""`oddl devices probe` against the emulators: ITLA and WSS on pseudo-terminals (and behind a
gate that passes bytes only at one baud rate, as a UART would), the WSS over socket:// and the
power meter over a TCPIP SOCKET."""

from __future__ import annotations

import json
import os
import select
import socket
import termios
import threading
import tty
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import lab_wss

from oddl.cli.main import main
from oddl.common.config import FixedPlan, dump_testbed, load_testbed
from oddl.common.file_access import current_user
from oddl.drivers.emulators.itla import ItlaEmulator
from oddl.drivers.emulators.itla_serve import itla_connection_handler, serve_pty
from oddl.drivers.emulators.powermeter import PowerMeterEmulator
from oddl.drivers.emulators.powermeter_serve import powermeter_connection_handler
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.emulators.wss import WssEmulator
from oddl.drivers.emulators.wss_serve import serve_pty as serve_wss_pty
from oddl.drivers.emulators.wss_serve import wss_connection_handler
from oddl.operator.probe import format_report, probe
from oddl.operator.probe_verdicts import (
    CANNOT_OPEN,
    MISMATCH,
    NO_ANSWER,
    NOT_NAMED,
    OK,
    SKIPPED,
    WRONG_BAUD,
    WRONG_PORT,
)

TESTBED = Path(__file__).resolve().parents[2] / "deploy" / "testbeds" / "emulated-4node.toml"


class BaudGatedPty:
    """A pseudo-terminal in front of a TCP emulator that passes bytes only while the port is
    set to `baud` (a UART at another rate delivers no valid byte)."""

    def __init__(self, address: tuple[str, int], baud: int) -> None:
        self.speed = getattr(termios, f"B{baud}")
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.path = os.ttyname(self.slave)
        self.sock = socket.create_connection(address, timeout=5)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._relay, daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select([self.master, self.sock], [], [], 0.05)
            try:
                if self.master in ready:
                    data = os.read(self.master, 256)
                    if termios.tcgetattr(self.slave)[4] == self.speed:
                        self.sock.sendall(data)
                if self.sock in ready:
                    data = self.sock.recv(256)
                    if not data:
                        return
                    os.write(self.master, data)
            except OSError:
                if self.stop.wait(0.05):
                    return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        for fd in (self.master, self.slave):
            os.close(fd)


@pytest.fixture
def bench() -> Iterator[dict[str, str]]:
    """Emulators on loopback and pseudo-terminals; yields resource names by role."""
    stops: list[Callable[[], None]] = []
    try:
        itla_path, stop = serve_pty(ItlaEmulator(serial_number="ITLA-A"))
        stops.append(stop)
        itla_tcp = TcpEmulatorServer(itla_connection_handler(ItlaEmulator(serial_number="ITLA-B")))
        stops.append(itla_tcp.close)
        gated = BaudGatedPty(itla_tcp.address, 115200)
        stops.append(gated.close)
        # the switches number their channels as the testbed's grid does, but one on its
        # factory plan (50 GHz from channel 0)
        wss = TcpEmulatorServer(wss_connection_handler(lab_wss(serial_number="WSS-1")))
        stops.append(wss.close)
        wss_factory = TcpEmulatorServer(wss_connection_handler(WssEmulator(serial_number="WSS-F")))
        stops.append(wss_factory.close)
        wss_pty, stop = serve_wss_pty(lab_wss(serial_number="WSS-P"))
        stops.append(stop)
        wss_tcp = TcpEmulatorServer(wss_connection_handler(lab_wss(serial_number="WSS-2")))
        stops.append(wss_tcp.close)
        wss_at_57600 = BaudGatedPty(wss_tcp.address, 57600)
        stops.append(wss_at_57600.close)
        meter = TcpEmulatorServer(powermeter_connection_handler(
            PowerMeterEmulator(serial_number="MY-PM-1")))
        stops.append(meter.close)
        silent = socket.create_server(("127.0.0.1", 0))   # accepts, never answers
        stops.append(silent.close)
        free = socket.create_server(("127.0.0.1", 0))     # a port nobody listens on
        free_port = free.getsockname()[1]
        free.close()
        dead_master, dead_slave = os.openpty()           # a serial port with nothing behind it
        tty.setraw(dead_slave)
        stops.append(lambda: (os.close(dead_master), os.close(dead_slave)))
        meter_host, meter_port = meter.address
        yield {
            "itla": itla_path, "itla_at_115200": gated.path, "wss": wss.url,
            "wss_at_57600": wss_at_57600.path, "wss_pty": wss_pty, "wss_factory": wss_factory.url,
            "dead_port": os.ttyname(dead_slave),
            "meter": f"TCPIP0::{meter_host}::{meter_port}::SOCKET",
            "silent_meter": f"TCPIP0::127.0.0.1::{silent.getsockname()[1]}::SOCKET",
            "no_meter": f"TCPIP0::127.0.0.1::{free_port}::SOCKET",
        }
    finally:
        for stop in reversed(stops):
            stop()


def _testbed(resources: dict[str, str], timeout_s: float = 0.3,
             **changes: dict[str, object]):
    """The testbed file on these resources. The short default timeout keeps the probes of
    silent ports quick; a test where every device must answer gives a long one, which an
    answer never waits for, so that a loaded machine cannot turn an answer into silence."""
    cfg = load_testbed(TESTBED).with_resources(resources)
    devices = tuple(replace(d, timeout_s=timeout_s, **changes.get(d.id, {}))
                    for d in cfg.devices)
    return replace(cfg, devices=devices)


def test_every_device_identified_on_a_good_bench(bench: dict[str, str]) -> None:
    cfg = _testbed({"laser0": bench["itla"], "wss0": bench["wss"], "pm0": bench["meter"]},
                   timeout_s=10, laser0={"serial": "ITLA-A"}, wss0={"serial": "WSS-1"})
    report = probe(cfg, scan=False)
    by_id = {d.device: d for d in report.devices}
    assert by_id["laser0"].status == OK and by_id["laser0"].identity["serial_number"] == "ITLA-A"
    assert by_id["wss0"].status == OK and by_id["wss0"].identity["serial_number"] == "WSS-1"
    assert by_id["pm0"].status == OK and by_id["pm0"].identity["model"] == "N7744A"
    assert {by_id[f"laser{n}"].status for n in (1, 2, 3)} == {SKIPPED}   # still emulated
    assert report.ok
    assert "4 of 4" not in format_report(report) and "6 of 6 device(s)" in format_report(report)


def test_wrong_port_wrong_baud_and_silence_are_named(bench: dict[str, str]) -> None:
    cfg = _testbed({"laser0": bench["wss"],             # the WSS, not a laser
                    "laser1": bench["itla_at_115200"],  # a laser set to 115200 baud
                    "laser2": bench["dead_port"],       # nothing answers
                    "laser3": "/dev/does-not-exist-oddl",
                    "wss0": bench["itla"],              # a laser, not the WSS
                    "pm0": bench["silent_meter"]},
                   laser1={"baud": 9600})
    report = probe(cfg, scan=False)
    by_id = {d.device: d for d in report.devices}
    assert not report.ok
    laser0 = by_id["laser0"]
    assert (laser0.status, laser0.found_kind) == (WRONG_PORT, "wss")
    assert "answers as a WSS" in laser0.message and "WSS-1" in laser0.message
    laser1 = by_id["laser1"]
    assert (laser1.status, laser1.found_baud) == (WRONG_BAUD, 115200)
    assert "set baud = 115200 for laser1" in laser1.message
    assert by_id["laser2"].status == NO_ANSWER and "powered" in by_id["laser2"].message
    assert by_id["laser3"].status == CANNOT_OPEN
    wss0 = by_id["wss0"]
    assert (wss0.status, wss0.found_kind) == (WRONG_PORT, "itla")
    assert "ITLA-A" in wss0.message
    assert by_id["pm0"].status == NO_ANSWER


def test_a_wss_on_a_serial_port_at_another_baud_rate(bench: dict[str, str]) -> None:
    cfg = _testbed({"wss0": bench["wss_at_57600"]})          # the file says 115200
    report = probe(cfg, scan=False)
    wss0 = {d.device: d for d in report.devices}["wss0"]
    assert (wss0.status, wss0.found_baud) == (WRONG_BAUD, 57600)
    assert wss0.identity is not None and wss0.identity["serial_number"] == "WSS-2"
    assert "set baud = 57600 for wss0" in wss0.message
    good = _testbed({"wss0": bench["wss_at_57600"]}, wss0={"baud": 57600})
    assert {d.device: d.status for d in probe(good, scan=False).devices}["wss0"] == OK


def test_a_wss_on_its_pseudo_terminal_and_a_laser_pointed_at_it(
        bench: dict[str, str]) -> None:
    cfg = _testbed({"wss0": bench["wss_pty"], "laser0": bench["wss_pty"]})
    by_id = {d.device: d for d in probe(cfg, scan=False).devices}
    assert by_id["wss0"].status == OK and by_id["wss0"].identity["serial_number"] == "WSS-P"
    laser0 = by_id["laser0"]
    assert (laser0.status, laser0.found_kind) == (WRONG_PORT, "wss")
    assert "WSS-P" in laser0.message


def test_a_wss_on_another_grid_than_its_channel_numbering(bench: dict[str, str]) -> None:
    cfg = _testbed({"wss0": bench["wss_factory"]})   # 50 GHz module, 100 GHz testbed grid
    wss0 = {d.device: d for d in probe(cfg, scan=False).devices}["wss0"]
    assert wss0.status == MISMATCH and wss0.identity["serial_number"] == "WSS-F"
    assert "50 GHz fixed grid" in wss0.message and "module_plan" in wss0.message
    plan = FixedPlan(first_channel=0, first_thz=191.35, spacing_ghz=50.0, channels=96)
    mapped = _testbed({"wss0": bench["wss_factory"]}, wss0={"module_plan": plan})
    assert {d.device: d.status for d in probe(mapped, scan=False).devices}["wss0"] == OK
    wrong = replace(plan, spacing_ghz=100.0)
    said = {d.device: d for d in probe(_testbed({"wss0": bench["wss_factory"]},
                                                wss0={"module_plan": wrong}),
                                       scan=False).devices}["wss0"]
    assert said.status == MISMATCH and "module_plan says 100 GHz" in said.message


def test_another_unit_and_a_missing_meter(bench: dict[str, str]) -> None:
    cfg = _testbed({"laser0": bench["itla"], "pm0": bench["no_meter"]},
                   laser0={"serial": "ITLA-Z"})
    report = probe(cfg, scan=False)
    by_id = {d.device: d for d in report.devices}
    assert by_id["laser0"].status == MISMATCH
    assert "'ITLA-A'" in by_id["laser0"].message and "'ITLA-Z'" in by_id["laser0"].message
    assert by_id["pm0"].status == CANNOT_OPEN and "running" in by_id["pm0"].message


def test_probing_changes_nothing(bench: dict[str, str]) -> None:
    emu = ItlaEmulator(serial_number="ITLA-RO")
    path, stop = serve_pty(emu)
    try:
        emu_before = emu.optical_output()
        meter = PowerMeterEmulator(serial_number="MY-RO")
        with TcpEmulatorServer(powermeter_connection_handler(meter)) as server:
            host, port = server.address
            meter.handle_line(":SENS1:POW:WAV 1310NM;:INIT1:CONT OFF")
            cfg = _testbed({"laser0": path, "pm0": f"TCPIP0::{host}::{port}::SOCKET"})
            report = probe(cfg, scan=False)
            assert report.ok
            assert meter.handle_line(":SENS1:POW:WAV?;:INIT1:CONT?") == "+1.31000000E-06;+0"
        assert emu.optical_output() == emu_before
    finally:
        stop()


def _spy(obj: object, method: str, calls: list[str]) -> None:
    """Record every call of `obj.method` (the emulator still answers as before)."""
    original = getattr(obj, method)

    def recorded(*args: object, **kwargs: object) -> object:
        calls.append(method)
        return original(*args, **kwargs)

    setattr(obj, method, recorded)


def test_the_scan_lists_ports_the_file_does_not_name_and_writes_nothing_to_them() -> None:
    named = ItlaEmulator(serial_number="ITLA-N")
    unnamed_itla = ItlaEmulator(serial_number="ITLA-U")
    unnamed_wss = lab_wss(serial_number="WSS-U")
    calls: dict[str, list[str]] = {"named": [], "itla": [], "wss": []}
    _spy(named, "respond", calls["named"])
    _spy(unnamed_itla, "respond", calls["itla"])
    _spy(unnamed_wss, "handle_timed", calls["wss"])
    named_path, stop_named = serve_pty(named)
    itla_path, stop_itla = serve_pty(unnamed_itla)
    wss_path, stop_wss = serve_wss_pty(unnamed_wss)
    master, slave = os.openpty()         # a bare serial port: any byte written shows up here
    tty.setraw(slave)
    try:
        bare = os.ttyname(slave)
        ports = [{"device": p, "description": "pty", "hwid": "", "serial_number": ""}
                 for p in (named_path, itla_path, wss_path, bare)]
        report = probe(_testbed({"laser0": named_path}), ports=ports)
        assert report.serial_ports == ports
        assert {d.device: d.status for d in report.devices}["laser0"] == OK
        assert calls["named"]               # the named laser was asked: the spies work
        assert [(u.resource, u.status) for u in report.unlisted
                if u.resource.startswith("/dev/")] == [(itla_path, NOT_NAMED),
                                                       (wss_path, NOT_NAMED), (bare, NOT_NAMED)]
        assert all("present, not named by the file" in u.message for u in report.unlisted)
        assert calls["itla"] == [] and calls["wss"] == []
        assert select.select([master], [], [], 0.2)[0] == []   # not a byte to the bare port
        text = format_report(report)
        assert "Present, not named by the testbed file (not queried):" in text
        assert f"  {itla_path}" in text and "answers as" not in text
    finally:
        stop_named()
        stop_itla()
        stop_wss()
        os.close(master)
        os.close(slave)


def test_cli_json_and_exit_codes(bench: dict[str, str], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text(dump_testbed(_testbed({"laser0": bench["itla"], "pm0": bench["meter"]},
                                          timeout_s=10)))
    # judged for this test's own user: the default service user `oddl` may exist here (a
    # lab's host, or the rehearsal's) and may not open a pty only this user owns
    me = current_user()
    assert main(["devices", "probe", "--config", str(good), "--json", "--no-scan",
                 "--service-user", me]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True
    assert {d["device"]: d["status"] for d in out["devices"]}["laser0"] == OK
    bad = tmp_path / "bad.toml"
    bad.write_text(dump_testbed(_testbed({"pm0": bench["silent_meter"]})))
    assert main(["devices", "probe", "--no-scan", "--config", str(bad),
                 "--service-user", me]) == 1
    text = capsys.readouterr().out
    assert "pm0" in text and "NO ANSWER" in text and "fix the ones above" in text
    assert main(["devices", "probe", "--no-scan"]) == 2
    assert "--config" in capsys.readouterr().err
