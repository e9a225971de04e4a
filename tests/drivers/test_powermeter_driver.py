"""The real pyvisa driver (@py backend) against the power meter emulator on a TCP port."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest
import pyvisa
from fakes import FakeClock, Optics

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError
from oddl.drivers.emulators.powermeter import PowerMeterEmulator
from oddl.drivers.emulators.powermeter_serve import powermeter_connection_handler
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.interfaces import DeviceIdentity
from oddl.drivers.link_errors import CannotOpen, NoConnection
from oddl.drivers.powermeter import LoggingState, PowerMeter, watts_to_dbm
from oddl.drivers.transport import SerialTransport


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
def optics() -> Optics:
    return Optics()


@pytest.fixture
def emu(clock: FakeClock, optics: Optics) -> PowerMeterEmulator:
    return PowerMeterEmulator(power_source=optics, clock=clock, noise_db=0.0,
                              serial_number="MY00042")


@pytest.fixture
def resource(emu: PowerMeterEmulator) -> Iterator[str]:
    with TcpEmulatorServer(powermeter_connection_handler(emu), name="pm-emu") as server:
        host, port = server.address
        yield f"TCPIP0::{host}::{port}::SOCKET"


@pytest.fixture
def pm(resource: str) -> Iterator[PowerMeter]:
    with PowerMeter(resource, name="pm-a", timeout_s=0.4) as meter:
        yield meter


def test_identify(pm: PowerMeter) -> None:
    assert pm.identify() == DeviceIdentity(
        kind="powermeter", manufacturer="Keysight Technologies", model="N7744A",
        serial_number="MY00042", extra=(("firmware", "1.0.0-emu"),))


def test_settings_round_trip(pm: PowerMeter) -> None:
    assert pm.wavelength_nm(2) == pytest.approx(1550.0)
    pm.set_wavelength_nm(2, 1310.5)
    assert pm.wavelength_nm(2) == pytest.approx(1310.5)
    assert pm.wavelength_nm(1) == pytest.approx(1550.0)
    pm.set_averaging_time_s(2, 1e-3)
    assert pm.averaging_time_s(2) == pytest.approx(1e-3)
    pm.set_auto_range(2, False)
    assert pm.auto_range(2) is False
    pm.set_auto_range(2, True)
    assert pm.auto_range(2) is True
    assert pm.errors() == []


def test_read_power_follows_the_optics(pm: PowerMeter, optics: Optics) -> None:
    pm.set_unit_dbm(1)
    optics.dbm[1] = -3.25
    assert pm.read_power_dbm(1) == pytest.approx(-3.25)
    optics.dbm[1] = -17.0
    assert pm.read_power_dbm(1) == pytest.approx(-17.0)
    assert pm.fetch_power_dbm(1) == pytest.approx(-17.0)
    optics.dbm[1] = None
    assert pm.read_power_dbm(1) is None
    assert pm.read_power_dbm(4) is None   # never lit


def test_correction_and_single_measurements(pm: PowerMeter, optics: Optics,
                                            clock: FakeClock) -> None:
    optics.dbm[3] = -10.0
    pm.set_correction_db(3, 2.0)
    pm.set_continuous(3, False)
    pm.initiate(3)
    optics.dbm[3] = -20.0
    clock.t += 60
    assert pm.fetch_power_dbm(3) == pytest.approx(-8.0)
    pm.initiate(3)
    assert pm.fetch_power_dbm(3) == pytest.approx(-18.0)


def test_power_in_watts_is_refused_until_unit_is_dbm(pm: PowerMeter, optics: Optics) -> None:
    optics.dbm[2] = 0.0
    pm.write(":SENS2:POW:UNIT 1")
    with pytest.raises(DeviceError, match=r"set_unit_dbm\(2\)"):
        pm.read_power_dbm(2)
    pm.set_unit_dbm(2)
    assert pm.read_power_dbm(2) == pytest.approx(0.0)


def test_logging_result_is_the_float32_samples(pm: PowerMeter, optics: Optics,
                                               clock: FakeClock) -> None:
    levels = [-3.0, -30.0, 4.0, -7.5]
    optics.dbm[1] = levels[0]
    pm.start_logging(1, 4, 0.01)
    assert pm.logging_state(1) == LoggingState("LOGGING_STABILITY", complete=False)
    with pytest.raises(DeviceError, match="still running"):
        pm.logging_result(1)
    for level in levels:
        optics.dbm[1] = level
        clock.t += 0.01
        pm.logging_state(1)   # the emulator draws each due sample now
    state = pm.logging_state(1)
    assert state.complete and not state.running
    samples = pm.logging_result(1)
    assert samples.dtype == np.float32
    expected = np.array([10 ** (d / 10) * 1e-3 for d in levels], dtype=np.float32)
    np.testing.assert_array_equal(samples, expected)
    np.testing.assert_allclose(watts_to_dbm(samples), levels, atol=1e-5)


def test_logging_block_with_newline_bytes_and_many_points(pm: PowerMeter, optics: Optics,
                                                          clock: FakeClock) -> None:
    # 10.0 = 0x41200000 little-endian "\x00\x00\x20\x41"; pick a power whose float32 in W
    # contains a 0x0A byte so the block cannot be read line by line
    watts = np.frombuffer(b"\x0a\x0a\x0a\x3a", dtype="<f4")[0]
    optics.dbm[2] = float(10 * np.log10(float(watts) * 1e3))
    pm.start_logging(2, 2000, 1e-3)
    clock.t += 2.0
    pm.wait_for_logging(2, timeout_s=1.0)
    samples = pm.logging_result(2)
    assert samples.shape == (2000,)
    np.testing.assert_allclose(samples, watts, rtol=1e-6)


def test_wait_for_logging_times_out_on_a_trigger_that_never_comes(pm: PowerMeter) -> None:
    pm.start_logging(1, 3, 1e-3, trigger="CME")
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(DeviceTimeout, match="channel 1"):
        pm.wait_for_logging(1, timeout_s=0.2, clock=lambda: now[0], sleep=sleep)
    pm.stop_logging(1)
    assert pm.logging_state(1) == LoggingState("NONE", complete=True)


def test_instrument_errors_surface_as_device_error(pm: PowerMeter) -> None:
    with pytest.raises(DeviceError, match=r"SENS1:POW:WAV 2000NM.*-222,\"Data out of range\""):
        pm.command(":SENS1:POW:WAV 2000NM")
    with pytest.raises(DeviceError, match=r"BOGUS.*-113") as info:
        pm.query(":BOGUS?")
    assert not isinstance(info.value, DeviceTimeout)
    pm.write("FOO;BAR")
    assert pm.errors() == [(-113, "Undefined header"), (-113, "Undefined header")]
    assert pm.identify().model == "N7744A"


@pytest.mark.parametrize("call, match", [
    (lambda pm: pm.set_wavelength_nm(1, 1700), "1250-1650 nm"),
    (lambda pm: pm.set_wavelength_nm(1, float("nan")), "1250-1650 nm"),
    (lambda pm: pm.set_wavelength_nm(5, 1550), "channels 1..4"),
    (lambda pm: pm.set_wavelength_nm(True, 1550), "channels 1..4"),
    (lambda pm: pm.set_averaging_time_s(1, 0), "averaging time"),
    (lambda pm: pm.set_averaging_time_s(1, 11), "averaging time"),
    (lambda pm: pm.set_correction_db(1, 500), "correction"),
    (lambda pm: pm.start_logging(1, 0, 1e-3), "logging points"),
    (lambda pm: pm.start_logging(1, 2.5, 1e-3), "logging points"),
    (lambda pm: pm.start_logging(1, 10, 20.0), "logging interval"),
    (lambda pm: pm.start_logging(1, 10, 1e-3, trigger="NOW"), "trigger"),
    (lambda pm: pm.read_power_dbm(0), "channels 1..4"),
])
def test_bad_arguments_fail_before_anything_is_sent(pm: PowerMeter, emu: PowerMeterEmulator,
                                                    call, match: str) -> None:
    before = emu.lines_handled
    with pytest.raises(ValueError, match=match):
        call(pm)
    assert emu.lines_handled == before


def test_no_answer_is_a_timeout_then_recovers(pm: PowerMeter, emu: PowerMeterEmulator) -> None:
    emu.faults.no_answer = True
    with pytest.raises(DeviceTimeout, match=r"\*IDN\?"):
        pm.identify()
    emu.faults.no_answer = False
    assert pm.identify().serial_number == "MY00042"
    pm.set_wavelength_nm(1, 1530)
    assert pm.wavelength_nm(1) == pytest.approx(1530)


def test_late_answer_is_never_taken_for_the_next_one(pm: PowerMeter,
                                                     emu: PowerMeterEmulator) -> None:
    pm.set_wavelength_nm(1, 1310)
    emu.faults.answer_delay_s = 1.0
    with pytest.raises(DeviceTimeout):
        pm.identify()
    emu.faults.answer_delay_s = 0.0
    assert pm.wavelength_nm(1) == pytest.approx(1310)
    assert pm.identify().model == "N7744A"


def test_garbage_is_a_protocol_error_then_recovers(pm: PowerMeter, emu: PowerMeterEmulator,
                                                   optics: Optics) -> None:
    optics.dbm[1] = -1.0
    emu.faults.garbage = True
    for call in (pm.identify, lambda: pm.wavelength_nm(1), lambda: pm.logging_result(1)):
        with pytest.raises(ProtocolError):
            call()
    emu.faults.garbage = False
    assert pm.read_power_dbm(1) == pytest.approx(-1.0)


def test_device_reset_drops_the_link_then_reconnects(pm: PowerMeter,
                                                     emu: PowerMeterEmulator) -> None:
    pm.set_wavelength_nm(1, 1310)
    emu.faults.reset_on_next_line = True
    with pytest.raises(DeviceTimeout):
        pm.identify()
    assert pm.wavelength_nm(1) == pytest.approx(1550)   # the meter rebooted to defaults
    pm.reopen()
    assert pm.identify().model == "N7744A"


def test_from_resource_drains_instead_of_reconnecting(resource: str,
                                                      emu: PowerMeterEmulator) -> None:
    rm = pyvisa.ResourceManager("@py")
    try:
        inst = rm.open_resource(resource, read_termination="\n", write_termination="\n",
                                timeout=300)
        meter = PowerMeter.from_resource(inst, name="pm-b")
        assert meter.identify().serial_number == "MY00042"
        emu.faults.no_answer = True
        with pytest.raises(DeviceTimeout):
            meter.wavelength_nm(1)
        emu.faults.no_answer = False
        assert meter.wavelength_nm(1) == pytest.approx(1550)
        with pytest.raises(DeviceError, match="reopen"):
            meter.reopen()
        meter.close()
    finally:
        rm.close()


def test_close_releases_and_later_calls_fail(resource: str) -> None:
    with PowerMeter(resource, timeout_s=0.4) as meter:
        meter.identify()
    with pytest.raises(DeviceError, match="closed"):
        meter.identify()
    meter.close()   # idempotent


def test_nothing_listening_is_a_typed_link_error() -> None:
    # pyvisa-py may report a refused connection only on first use, so cover both places
    with pytest.raises((CannotOpen, NoConnection), match="cannot open|no connection"):
        with PowerMeter("TCPIP0::127.0.0.1::1::SOCKET", timeout_s=0.3) as meter:
            meter.identify()
    with pytest.raises(CannotOpen, match="cannot open"):
        PowerMeter("TCPIP0::127.0.0.1::1::NOT-A-RESOURCE", timeout_s=0.3)


def test_a_serial_url_that_cannot_be_opened_is_cannot_open() -> None:
    with pytest.raises(CannotOpen, match="cannot open"):
        SerialTransport("socket://127.0.0.1:1", name="x", timeout=0.2)


def test_frames_are_logged_with_the_device_name(pm: PowerMeter,
                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="oddl.drivers.powermeter_link"):
        pm.identify()
    messages = [r.getMessage() for r in caplog.records]
    assert "pm-a >> *IDN?" in messages
    assert any(m.startswith("pm-a << Keysight Technologies") for m in messages)
