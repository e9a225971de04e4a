"""A published ITLA client, pytla 0.2.0 (PyPI, MIT licence), drives the emulator over its pty.

The client runs unchanged; the only help it gets is a ``pkg_resources`` stand-in when the
installed setuptools no longer ships that module (pytla imports ``resource_filename`` from it
to find its register files). The emulator's clock is a monotonic clock the test can jump
forward, so the start-up window ends when the test says so, not when the machine gets to it.

pytla 0.2.0's ``ITLA(version="1.3")`` loads only the 01.2 register file (no ChannelH, FCF3,
LF3), so these tests use ``version="1.2"``; see docs/reference/devices/itla.md for the points where
pytla and the MSA text disagree (DIS in ``is_disabled()``).
"""

from __future__ import annotations

import importlib.resources
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
from fakes import JumpClock
from helpers import close_child, first_line, start_child, stop_with_sigterm

from oddl.drivers.emulators.itla import ItlaEmulator
from oddl.drivers.emulators.itla_serve import serve_pty


def _pkg_resources_stand_in() -> None:
    try:
        import pkg_resources  # noqa: F401
    except ImportError:
        module = types.ModuleType("pkg_resources")

        def resource_filename(package: str, resource: str) -> str:
            return str(importlib.resources.files(package) / resource)

        module.resource_filename = resource_filename  # type: ignore[attr-defined]
        sys.modules["pkg_resources"] = module


_pkg_resources_stand_in()
itla = pytest.importorskip("itla", reason="pytla is in the dev extra: pip install -e '.[dev]'")
from itla.itla_errors import (  # noqa: E402
    CIIError,
    CPException,
    ExecutionError,
    RVEError,
)
from itla.itla_status import FatalError, WarningError  # noqa: E402

TTL = 0.02


@pytest.fixture
def clock() -> JumpClock:
    return JumpClock()


@pytest.fixture
def emu(clock: JumpClock) -> ItlaEmulator:
    return ItlaEmulator(serial_number="PYTLA-1", time_to_lock_s=TTL, enable_time_s=2 * TTL,
                        startup_s=30.0, clock=clock)


@pytest.fixture
def laser(emu: ItlaEmulator, clock: JumpClock) -> Iterator[Any]:
    clock.jump(30.0)  # past the power-up window
    path, stop = serve_pty(emu)
    client = itla.ITLA(path, 9600, version="1.2", timeout=1.0, sleep_time=0.005)
    client.connect()
    try:
        yield client
    finally:
        client._device.close()  # pytla's disconnect() would also switch the light off
        stop()


def _enable(laser: Any) -> None:
    try:
        laser.enable()
    except CPException:
        laser.wait()


def test_identity_strings_through_aea(laser: Any) -> None:
    assert laser.get_serialnumber().rstrip("\0") == "PYTLA-1"
    assert laser.get_device_type().rstrip("\0") == "CW ITLA"


def test_enable_waits_through_cp_then_tunes(laser: Any, emu: ItlaEmulator) -> None:
    laser.set_power(11.0)
    with pytest.raises(CPException):
        laser.enable()
    laser.wait()
    assert emu.optical_output() is not None
    with pytest.raises(CPException):  # with light on, a channel change is a pending operation
        laser.set_channel(3)
    laser.wait()
    assert laser.get_channel() == 3
    assert laser.get_frequency() == pytest.approx(193.3)
    assert laser.get_power_output() == pytest.approx(11.0)


def test_start_up_window_refuses_with_cii_until_ready(laser: Any, emu: ItlaEmulator,
                                                      clock: JumpClock) -> None:
    laser.hard_reset()  # ResEna MR: answered, then the module starts up again
    with pytest.raises(ExecutionError):
        laser.get_power_setting()
    with pytest.raises(CIIError):  # NOP is served while initialising and names the reason
        laser.nop()
    clock.jump(30.0)
    assert laser.get_power_setting() == pytest.approx(10.0)
    assert FatalError.MRL in laser.get_error_fatal()


def test_last_response_is_the_previous_reply(laser: Any) -> None:
    laser.set_power(12.5)
    assert laser.get_power_setting() == pytest.approx(12.5)
    assert int.from_bytes(laser.get_last_response(), "big") == 1250
    laser.get_channel()
    assert int.from_bytes(laser.get_last_response(), "big") == 1


def test_currents_and_temps_through_aea(laser: Any) -> None:
    temps = laser.get_temps()
    assert temps == [pytest.approx(35.0), pytest.approx(25.0)]
    tec, diode = laser.get_currents()
    assert tec > 0 and diode == 0  # no light, no laser diode current
    _enable(laser)
    tec, diode = laser.get_currents()
    assert diode == pytest.approx(30.0 + 4.0 * 10.0)  # the emulator's model at 10 dBm (10 mW)


def test_status_bits_dis_and_latches(laser: Any) -> None:
    fatal = laser.get_error_fatal(reset=True)
    assert FatalError.DIS in fatal and FatalError.MRL in fatal
    assert FatalError.MRL not in laser.get_error_fatal()   # cleared by writing ones
    with pytest.raises(RVEError):
        laser.set_power(20.0)   # XE, then pytla reads NOP: RVE
    warning = laser.get_error_warning(reset=True)
    assert WarningError.XEL in warning                   # latched by the XE reply
    assert WarningError.XEL not in laser.get_error_warning()
    _enable(laser)
    assert FatalError.DIS not in laser.get_error_fatal()
    laser.disable()
    assert FatalError.DIS in laser.get_error_fatal()


def _wait_ready(laser: Any, limit_s: float = 60.0) -> int:
    """Retry a command the way a pytla user would: on XE, read NOP for the reason, and wait
    while it is CII. Returns how many CII refusals were seen."""
    seen = 0
    deadline = time.monotonic() + limit_s
    while True:
        try:
            laser.get_power_setting()
            return seen
        except ExecutionError:
            with pytest.raises(CIIError):
                laser.nop()
            seen += 1
            assert time.monotonic() < deadline, "the module never finished initialising"
            time.sleep(0.05)


def test_pytla_against_oddl_emulate_itla_pty_with_bench_timings() -> None:
    """`oddl emulate itla --pty` as a lab user starts it, with slow start-up and enable."""
    args = [sys.executable, "-m", "oddl.drivers.emulators.itla_serve", "--pty", "--serial", "SLOW-1",
            "--startup-ms", "2500", "--enable-ms", "300", "--time-to-lock-ms", "100"]
    proc = start_child(args)
    try:
        path = first_line(proc)
        laser = itla.ITLA(path, 9600, version="1.2", timeout=2.0, sleep_time=0.01)
        laser.connect()
        try:
            _wait_ready(laser)
            assert laser.get_serialnumber().rstrip("\0") == "SLOW-1"
            laser.hard_reset()
            assert _wait_ready(laser) >= 1  # refused with CII right after the reset
            t0 = time.monotonic()
            _enable(laser)
            assert time.monotonic() - t0 >= 0.3  # CP for at least the configured enable time
            assert FatalError.DIS not in laser.get_error_fatal()
        finally:
            laser._device.close()
        assert stop_with_sigterm(proc) == 0
    finally:
        close_child(proc)
