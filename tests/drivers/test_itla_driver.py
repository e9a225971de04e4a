"""The real ITLA driver against the emulator, over socket:// (TcpEmulatorServer) and a pty."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import close_child, first_line, start_child, stop_with_sigterm

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError, SafetyLimitError
from oddl.drivers.emulators.itla import ItlaEmulator
from oddl.drivers.emulators.itla_serve import itla_connection_handler, serve_pty
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.itla import ItlaDriver
from oddl.drivers.itla_registers import ItlaExecutionError
from oddl.drivers.transport import SerialTransport

TTL = 0.03


class _CurrentEmulator:
    """Forwards frames to whichever emulator the running test made (one server per module).

    pyserial's socket:// close() sleeps 0.3 s, so the TCP link is opened once per module and
    each test gets a fresh emulator (and a fresh driver) behind it.
    """

    def __init__(self) -> None:
        self.emu = ItlaEmulator()

    def respond(self, frame: bytes) -> tuple[bytes | None, float]:
        return self.emu.respond(frame)

    def lose_bytes(self, data: bytes) -> bytes:
        return self.emu.lose_bytes(data)


@pytest.fixture(scope="module")
def wire() -> Iterator[tuple[_CurrentEmulator, TcpEmulatorServer, SerialTransport]]:
    current = _CurrentEmulator()
    with TcpEmulatorServer(itla_connection_handler(current),  # type: ignore[arg-type]
                           name="itla-test") as srv:
        link = SerialTransport(srv.url, name="laser0")
        yield current, srv, link
        link.close()


@pytest.fixture
def emu(wire: tuple[_CurrentEmulator, TcpEmulatorServer, SerialTransport]) -> ItlaEmulator:
    wire[0].emu = ItlaEmulator(serial_number="EMU-0042", time_to_lock_s=TTL)
    return wire[0].emu


@pytest.fixture
def server(wire: tuple[_CurrentEmulator, TcpEmulatorServer, SerialTransport],
           emu: ItlaEmulator) -> TcpEmulatorServer:
    return wire[1]


@pytest.fixture
def drv(wire: tuple[_CurrentEmulator, TcpEmulatorServer, SerialTransport],
        emu: ItlaEmulator) -> ItlaDriver:
    # Not closed: the link belongs to the module fixture.
    return ItlaDriver(wire[2], name="laser0", timeout_s=0.2, poll_interval_s=0.002)


def test_identify_and_limits(drv: ItlaDriver) -> None:
    ident = drv.identify()
    assert (ident.kind, ident.serial_number) == ("CW ITLA", "EMU-0042")
    assert ident.manufacturer and ident.model
    assert dict(ident.extra)["release"]
    lim = drv.limits()
    assert (lim.min_thz, lim.max_thz) == (193.1, 197.8)
    assert (lim.min_power_dbm, lim.max_power_dbm, lim.min_grid_ghz) == (6.0, 13.5, 6.25)


def test_grid_change_refused_while_output_on(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    drv.enable_output()
    before = emu.snapshot()["first_mhz"]
    with pytest.raises(DeviceError, match=r"disable_output\(\)"):
        drv.configure_grid(194.0, 50.0)
    assert emu.snapshot()["first_mhz"] == before
    # Bypassing the driver's check, the module itself answers CIE.
    with pytest.raises(ItlaExecutionError, match="CIE ignored while output enabled"):
        drv.link.write_register("FCF1", 194)
    drv.disable_output()
    drv.configure_grid(194.0, 50.0)
    assert emu.snapshot()["first_mhz"] == 194_000_000
    assert emu.snapshot()["grid_mhz"] == 50_000
    assert drv.grid(refresh=True) == (194.0, 50.0)


def test_tune_measures_time_to_lock(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    drv.configure_grid(193.1, 50.0)
    drv.enable_output()
    took = drv.set_channel(5)
    assert took >= TTL
    assert drv.last_time_to_lock_s == took and list(drv.tune_history) == [took]
    assert drv.frequency_thz() == pytest.approx(193.3)
    out = emu.optical_output()
    assert out is not None and out.frequency_thz == pytest.approx(193.3)
    assert drv.set_channel(9) >= TTL and len(drv.tune_history) == 2
    st = drv.state()
    assert (st.channel, st.output_enabled, st.locked) == (9, True, True)
    assert st.frequency_thz == pytest.approx(193.5)


def test_power_set_and_read_back(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    drv.set_power_dbm(12.5)
    drv.enable_output()
    assert drv.power_dbm() == 12.5
    out = emu.optical_output()
    assert out is not None and out.power_dbm == 12.5
    with pytest.raises(SafetyLimitError, match="outside the laser's range"):
        drv.set_power_dbm(15.0)
    with pytest.raises(SafetyLimitError):
        drv.set_channel(49)
    assert emu.snapshot()["power_dbm"] == 12.5


def test_enable_disable_and_status(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    st = drv.status()
    assert st.output_disabled and "MRL" in st.latched
    drv.clear_latches()
    assert drv.status().latched == ()
    drv.enable_output()
    assert emu.optical_output() is not None and drv.status().locked
    drv.disable_output()
    assert emu.optical_output() is None
    assert drv.state().output_enabled is False


def test_execution_errors_carry_the_nop_code(drv: ItlaDriver) -> None:
    with pytest.raises(ItlaExecutionError, match="RVE range error") as info:
        drv.link.write_register("PWR", 2000)
    assert info.value.error.mnemonic == "RVE"
    with pytest.raises(ItlaExecutionError, match="RNI register not implemented"):
        drv.link.read_register(0x7F)
    assert drv.link.read_register("PWR") == 1000


def test_one_unanswered_frame_is_recovered_by_resync(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    emu.faults.no_answer = 1
    assert drv.link.read_register("Channel") == 1
    assert drv.link.resyncs == 1


def test_a_dead_module_is_a_timeout_and_the_next_command_works(drv: ItlaDriver,
                                                               emu: ItlaEmulator) -> None:
    emu.inject(no_answer_always=True)
    with pytest.raises(DeviceTimeout, match="laser0: no reply to read NOP .*single NOP bytes"):
        drv.link.nop()
    emu.inject(no_answer_always=False)
    assert drv.link.nop() & 0x10


def test_a_byte_lost_mid_frame_is_recovered_and_the_next_command_works(
        drv: ItlaDriver, emu: ItlaEmulator) -> None:
    """The module receives 3 bytes of a write: its frames are shifted until the resync."""
    drv.limits()  # read first, so that the byte is lost from the PWR write itself
    emu.faults.lose_byte = 1
    drv.set_power_dbm(11.0)
    assert drv.link.resyncs >= 1
    assert emu.snapshot()["power_dbm"] == 11.0
    assert drv.link.read_register("PWR") == 1100
    drv.enable_output()
    assert drv.set_channel(4) >= TTL
    assert drv.state().channel == 4 and drv.state().locked


def test_garbage_is_retried_transparently_then_gives_up(drv: ItlaDriver,
                                                        emu: ItlaEmulator) -> None:
    emu.faults.garbage = 1
    drv.set_power_dbm(11.0)   # the write ran once; LstRsp fetched its real reply
    assert emu.snapshot()["power_dbm"] == 11.0
    emu.faults.garbage = drv.link.retries + 1
    with pytest.raises(ProtocolError, match="bad checksum"):
        drv.link.read_register("Channel")
    assert drv.link.read_register("Channel") == 1


def test_truncated_reply_is_recovered(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    emu.faults.truncate = 1
    assert drv.link.read_register("PWR") == 1000
    assert drv.link.resyncs == 1
    assert drv.link.read_register("Channel") == 1


def test_late_reply_then_the_next_commands_work(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    emu.inject(late_next=1, late_next_s=0.6)
    first: int | None
    try:
        first = drv.link.read_register("PWR")
    except (DeviceTimeout, ProtocolError):  # where the late reply lands in the resync
        first = None                         # depends on the machine's load: a clear error
    assert first in (None, 1000)             # or the right value, never a wrong one
    time.sleep(1.0)  # let the late reply and the answers to the resync bytes arrive
    drv.link.timeout_s = 1.0
    assert drv.link.read_register("Channel") == 1   # stale replies are dropped or skipped
    assert drv.link.read_register("PWR") == 1000


def test_execution_failure_fault(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    emu.faults.error_next_write = 1
    with pytest.raises(ItlaExecutionError, match="EXF execution failure"):
        drv.set_power_dbm(9.0)
    drv.set_power_dbm(9.0)
    assert drv.power_dbm() == -40.0  # output still off
    assert emu.snapshot()["power_dbm"] == 9.0


def test_reset_mid_session(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    drv.enable_output()
    drv.clear_latches()
    emu.faults.reset_next = True
    drv.set_channel(3)  # the lost frame is recovered; the module now tunes with no light
    st = drv.state()
    assert (st.output_enabled, st.locked, st.channel) == (False, False, 3)
    assert "MRL" in drv.status().latched
    drv.enable_output()
    assert drv.set_channel(3) >= TTL


def test_stuck_pending_times_out_and_disable_recovers(drv: ItlaDriver,
                                                      emu: ItlaEmulator) -> None:
    emu.faults.stuck_pending = True
    with pytest.raises(DeviceTimeout, match="still pending"):
        drv.enable_output(timeout=0.1)
    assert drv.status().pending
    drv.disable_output()
    emu.faults.stuck_pending = False
    drv.enable_output()
    assert drv.state().locked


def test_shared_between_threads(drv: ItlaDriver) -> None:
    expected = {"Channel": 1, "PWR": 1000, "LFL1": 193, "OPSH": 1350}
    errors: list[str] = []

    def worker(name: str) -> None:
        for _ in range(25):
            got = drv.link.read_register(name)
            if got != expected[name]:
                errors.append(f"{name}={got}")
        drv.link.read_string("SerNo")

    threads = [threading.Thread(target=worker, args=(n,)) for n in expected]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not errors


def test_context_manager_shuts_the_laser_off(server: TcpEmulatorServer,
                                             emu: ItlaEmulator) -> None:
    with ItlaDriver(SerialTransport(server.url, name="laser1"), name="laser1") as d:
        d.enable_output()
    assert emu.optical_output() is None
    d2 = ItlaDriver(SerialTransport(server.url, name="laser1"), name="laser1")
    d2.enable_output()
    d2.close()
    assert emu.optical_output() is not None  # close() leaves the light as it is


def test_over_a_pty(emu: ItlaEmulator) -> None:
    path, stop = serve_pty(emu)
    try:
        d = ItlaDriver(SerialTransport(path, name="pty-laser"), name="pty-laser",
                       poll_interval_s=0.002)
        try:
            assert d.identify().serial_number == "EMU-0042"
            d.enable_output()
            assert d.set_channel(2) >= TTL
            assert d.frequency_thz() == pytest.approx(193.2)
            emu.faults.lose_byte = 1
            assert d.link.read_register("OOP") == 1000
            assert d.link.resyncs >= 1
            assert d.state().channel == 2
        finally:
            d.close()
    finally:
        stop()
        stop()  # idempotent


@pytest.mark.parametrize("mode", ["tcp", "pty"])
def test_cli_serves_until_sigterm(mode: str) -> None:
    args = [sys.executable, "-m", "oddl.drivers.emulators.itla_serve", "--serial", "CLI-1",
            "--time-to-lock-ms", "5", "--seed", "7"]
    args += ["--pty"] if mode == "pty" else ["--listen", "127.0.0.1:0"]
    proc = start_child(args)
    try:
        assert proc.stdout is not None
        address = first_line(proc)
        assert address.startswith("socket://127.0.0.1:" if mode == "tcp" else "/dev/")
        d = ItlaDriver(SerialTransport(address, name="cli-laser"), name="cli-laser")
        try:
            assert d.identify().serial_number == "CLI-1"
        finally:
            d.close()
        assert stop_with_sigterm(proc) == 0
        assert proc.stdout.read() == ""  # exactly one line of output
    finally:
        close_child(proc)


def test_the_driver_waits_out_the_start_up_window(
        wire: tuple[_CurrentEmulator, TcpEmulatorServer, SerialTransport]) -> None:
    t0 = time.monotonic()
    wire[0].emu = emu = ItlaEmulator(serial_number="EMU-0042", startup_s=0.3)
    drv = ItlaDriver(wire[2], name="laser0", timeout_s=0.5, poll_interval_s=0.01)
    assert drv.link.read_register("Channel") == 1   # CII answers retried until the module is ready
    assert time.monotonic() - t0 >= 0.3
    t1 = time.monotonic()
    drv.link.write_register("ResEna", 0x01)          # module reset: the window opens again
    assert drv.identify().serial_number == "EMU-0042"
    assert time.monotonic() - t1 >= 0.3
    assert "MRL" in drv.status().latched and emu.snapshot()["output_enabled"] is False
    emu.timing.startup_s = 30.0                     # a module that takes long to start ...
    drv.link.timeouts.startup_s = 0.05              # ... and a driver configured not to wait
    drv.link.write_register("ResEna", 0x01)
    with pytest.raises(ItlaExecutionError, match="CII"):
        drv.link.read_register("Channel")


def test_monitors_and_last_response(drv: ItlaDriver, emu: ItlaEmulator) -> None:
    assert drv.temperatures_c() == (35.0, 25.0)
    assert drv.currents_ma() == (150.0, 0.0)
    drv.enable_output()
    assert drv.currents_ma() == (150.0, pytest.approx(70.0))  # 30 mA + 4 mA/mW x 10 mW
    assert drv.link.read_register("OPSH") == 1350
    assert drv.last_response() == 1350
