"""Serial-only WSS clients against the emulator's pseudo-terminal, as on a bench.

- The published FUTEBOL WSS agent (nerds-ufes/futebol-optical-agent, Apache-2.0): its
  ``finisar_serial_adapter.Adapter`` and ``cli.Serial`` run unchanged from tests/clients and
  configure a flexgrid plan (CHW 0, DCC, UCA) over pyserial.
- The exchange the published bench script seanie5011/OSNR_fyp ``Setup/wss_automation.py``
  makes through pyvisa (ASRL resource, CR-LF terminations, echo + result + OK reads); that
  script has no licence, so its call sequence is re-enacted here, not copied.
- Scripted exchanges from the vendor command reference over raw pyserial (checksum framing,
  error replies, CR-only terminators), our driver over the pty, and ``oddl emulate wss --pty``.
"""

from __future__ import annotations

import importlib
import re
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import serial
from helpers import close_child, first_line, start_child, stop_with_sigterm

from oddl.drivers.emulators.wss import WssEmulator
from oddl.drivers.emulators.wss_serve import serve_pty
from oddl.drivers.interfaces import BLOCKED_DB, Route
from oddl.drivers.transport import SerialTransport
from oddl.drivers.wss import FlexgridWss
from oddl.drivers.wss_codec import WssLimits
from oddl.drivers.wss_protocol import SLICE_GHZ, frame

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
BLOCKED = Route(99, BLOCKED_DB)


@pytest.fixture
def pty_wss() -> Iterator[tuple[WssEmulator, str]]:
    emu = WssEmulator(settle_s=0.01, serial_number="SN004242")
    path, stop = serve_pty(emu)
    try:
        yield emu, path
    finally:
        stop()


def exchange(port: serial.Serial, line: bytes, n: int, timeout: float = 5.0) -> list[bytes]:
    """Write `line` and read `n` CR-LF lines (generous timeout, never a fixed sleep)."""
    port.write(line)
    deadline = time.monotonic() + timeout
    out: list[bytes] = []
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {out!r} after {line!r}"
        got = port.readline()
        if got:
            assert got.endswith(b"\r\n"), got
            out.append(got[:-2])
    return out


# --- raw pyserial: the vendor reference's exchanges ---------------------------------------------

def test_manual_exchanges_over_pyserial(pty_wss: tuple[WssEmulator, str]) -> None:
    emu, path = pty_wss
    with serial.Serial(path, 115200, timeout=0.5) as port:
        assert exchange(port, b"SNO?\r\n", 3) == [b"SNO?", b"SN004242", b"OK"]
        assert exchange(port, b"URA 52,3,0.0;53,3,0.0;54,3,99.9\r", 2) == [  # CR only
            b"URA 52,3,0.0;53,3,0.0;54,3,99.9", b"OK"]
        assert exchange(port, b"RSW\r\n", 2) == [b"RSW", b"OK"]
        rra = exchange(port, b"RRA?\r\n", 3)
        assert rra[2] == b"OK" and b"52,3,0.0;53,3,0.0;54,3,99.9;55,99,99.9" in rra[1]
        assert exchange(port, b"URA 52,7,0.0\r\n", 2)[1] == b"RER"
        assert exchange(port, b"XYZ\r\n", 2)[1] == b"CER"
        assert exchange(port, b"^CHW 0$FECE\r\n", 2) == [b"^CHW 0$FECE", b"^OK$FF66"]
        assert exchange(port, b"^CHW 0$FECF\r\n", 2)[1] == frame("CER").encode()
        assert exchange(port, b"DCC 1=1:8;2=9:16\r\n", 2)[1] == b"OK"
        assert exchange(port, b"UCA 1,2,0.0;2,99,99.9\r\n", 2)[1] == b"OK"
    assert emu.active_table() == {1: Route(2, 0.0), 2: BLOCKED}


# --- pyvisa: the bench script's call sequence -----------------------------------------------------

def test_pyvisa_asrl_session_like_the_bench_script(pty_wss: tuple[WssEmulator, str]) -> None:
    pyvisa = pytest.importorskip("pyvisa")
    emu, path = pty_wss
    rm = pyvisa.ResourceManager("@py")
    wss = rm.open_resource(f"ASRL{path}::INSTR")
    try:
        wss.baud_rate = 115200
        wss.write_termination = "\r\n"
        wss.read_termination = "\r\n"
        wss.timeout = 5000
        # query() returns the echo; the result and OK need one read each (as the script does)
        assert wss.query("SNO?") == "SNO?"
        assert (wss.read(), wss.read()) == ("SN004242", "OK")
        assert wss.query("MFD?") == "MFD?"
        assert (wss.read(), wss.read()) == ("2024-01-01", "OK")
        channels = range(52, 88)
        ura = "URA " + "".join(f"{ch},3,{99.9 if ch == 60 else 0.0};" for ch in channels)
        wss.write(ura)
        assert (wss.read(), wss.read()) == (ura, "OK")
        wss.write("RSW")
        assert (wss.read(), wss.read()) == ("RSW", "OK")
        assert wss.query("RRA?") == "RRA?"
        table = dict(e.split(",", 1) for e in wss.read().rstrip(";").split(";"))
        assert wss.read() == "OK"
        assert table["52"] == "3,0.0" and table["60"] == "3,99.9" and table["51"] == "99,99.9"
    finally:
        wss.close()
        rm.close()
    assert emu.route(emu.centre_thz(52)) == Route(3, 0.0) and emu.route(emu.centre_thz(60)) is None


# --- the published FUTEBOL adapter ----------------------------------------------------------------

@dataclass
class FlexChannel:
    """The channel attributes the FUTEBOL adapter reads (its grid model is not needed)."""

    start_frequency: float  # THz
    stop_frequency: float   # THz
    port: int
    attenuation: float = 0.0
    blocked: bool = False

    @property
    def bandwidth(self) -> float:  # GHz
        return round((self.stop_frequency - self.start_frequency) * 1000.0, 6)


@dataclass
class FlexWss:
    grid: list[FlexChannel]
    previous_state: object = None


def _futebol() -> tuple[object, object]:
    sys.path.insert(0, str(CLIENTS))
    try:
        with warnings.catch_warnings():  # its regex strings use '\^' (a DeprecationWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            adapter = importlib.import_module("futebol_wss_agent.lib.finisar_serial_adapter")
            cli = importlib.import_module("futebol_wss_agent.lib.cli")
    finally:
        sys.path.remove(str(CLIENTS))
    return adapter, cli


def test_futebol_adapter_configures_a_flexgrid_plan(pty_wss: tuple[WssEmulator, str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    emu, path = pty_wss
    adapter_mod, cli = _futebol()
    link = cli.Serial(device=path)  # type: ignore[attr-defined]
    try:
        adapter = adapter_mod.Adapter(interface=link)  # type: ignore[attr-defined]
        f0, df = adapter.frequency_window[0], SLICE_GHZ / 1000.0
        wss = FlexWss([
            FlexChannel(f0 + 8 * df, f0 + 16 * df, port=1),                  # 50 GHz
            FlexChannel(f0 + 16 * df, f0 + 28 * df, port=3, attenuation=5),  # 75 GHz
            FlexChannel(f0 + 40 * df, f0 + 48 * df, port=2, blocked=True),
        ])
        assert adapter.validate(wss)
        adapter.commit(wss)  # CHW 0, DCC 1=9:16;2=17:28;3=41:48;, UCA ...
    finally:
        link._wss.close()
    assert emu.mode_ghz == 0
    assert emu.flex == {1: (9, 16), 2: (17, 28), 3: (41, 48)}
    assert emu.active_table() == {1: Route(1, 0.0), 2: Route(3, 5.0), 3: BLOCKED}
    lo, hi = emu.slice_range_thz(17, 28)
    assert (lo, hi) == (pytest.approx(wss.grid[1].start_frequency),
                        pytest.approx(wss.grid[1].stop_frequency))
    emu.settle_until = 0.0
    assert emu.route((lo + hi) / 2) == Route(3, 5.0)
    printed = capsys.readouterr().out  # the client prints what it sends and receives
    assert "DCC 1=9:16;2=17:28;3=41:48;" in printed and "CER" not in printed


# --- our driver and the command line over the pty -------------------------------------------------

def test_driver_over_a_pty(pty_wss: tuple[WssEmulator, str]) -> None:
    emu, path = pty_wss
    with FlexgridWss(SerialTransport(path, name="pty-wss", baudrate=115200), name="pty-wss",
                     timeout=2.0, checksum=True, limits=WssLimits.factory()) as wss:
        assert wss.identify().serial_number == "SN004242"
        wss.stage({0: Route(1, 0.0), 1: Route(99, 0.0)})
        wss.apply()
        assert wss.read_active()[1] == Route(99, 0.0)
    assert emu.route(191.35) == Route(1, 0.0)


@pytest.mark.parametrize("entry", [["oddl.cli.main", "emulate", "wss"], ["oddl.drivers.emulators.wss_serve"]],
                         ids=["oddl-emulate-wss", "module"])
def test_emulate_wss_pty_command(entry: list[str]) -> None:
    proc = start_child([sys.executable, "-m", *entry, "--pty",
                        "--serial", "SN000777", "--settle-ms", "1"], capture_stderr=True)
    try:
        path = first_line(proc, 20, "the emulator (no path)")
        assert re.fullmatch(r"/dev/pts/\d+", path), path
        with serial.Serial(path, 115200, timeout=0.5) as port:
            assert exchange(port, b"SNO?\r\n", 3) == [b"SNO?", b"SN000777", b"OK"]
        assert stop_with_sigterm(proc) == 0
    finally:
        close_child(proc)
