"""Driver conformance: one suite per driver, against the emulators or, opt-in, real hardware.

    pytest tests/controller/test_conformance.py                                 # emulators (CI)
    pytest tests/controller/test_conformance.py --hardware deploy/testbeds/lab-4node.toml   # the bench

The same assertions run both ways; on hardware they tune lasers and rewrite WSS routes of the
devices named in the file (one transmitter, one WSS and one meter), and restore what they can.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import EMULATED

from oddl.common.config import TestbedConfig, load_testbed
from oddl.common.errors import DeviceError, SafetyLimitError
from oddl.controller.device_drivers import open_driver
from oddl.drivers.interfaces import (
    BLOCKED_DB,
    Route,
    TunableTransceiver,
    WavelengthSelectiveSwitch,
)


@pytest.fixture(scope="module")
def bench(request: pytest.FixtureRequest) -> Iterator[TestbedConfig]:
    """The testbed whose devices are tested: the lab file given, or the emulated one."""
    hardware = request.config.getoption("--hardware")
    if hardware:
        yield load_testbed(hardware)
        return
    from oddl.drivers.emulators.host import start_emulated_testbed

    tb = start_emulated_testbed(load_testbed(EMULATED))
    for wss in tb.switches.values():
        wss.settle_s = 0.01
    yield tb.resolved
    tb.close()


def _driver(cfg: TestbedConfig, kind: str) -> Any:
    dev = cfg.devices_of(kind)[0]
    return dev, open_driver(dev, cfg.grid)


@pytest.fixture
def laser(bench: TestbedConfig) -> Iterator[tuple[Any, TunableTransceiver]]:
    dev, drv = _driver(bench, "itla")
    yield dev, drv
    drv.close()


@pytest.fixture
def wss(bench: TestbedConfig) -> Iterator[tuple[Any, WavelengthSelectiveSwitch]]:
    dev, drv = _driver(bench, "wss")
    yield dev, drv
    drv.close()


def test_itla_identifies_itself(laser):
    dev, drv = laser
    ident = drv.identify()
    assert isinstance(drv, TunableTransceiver)
    assert ident.manufacturer and ident.model and ident.serial_number


def test_itla_grid_only_with_output_off(laser, bench):
    dev, drv = laser
    drv.disable_output()
    drv.configure_grid(bench.grid.first_thz, bench.grid.spacing_ghz)
    drv.set_channel(1)
    drv.enable_output()
    with pytest.raises(DeviceError, match="output"):
        drv.configure_grid(bench.grid.first_thz, bench.grid.spacing_ghz)


def test_itla_tunes_and_reports_time_to_lock(laser, bench):
    dev, drv = laser
    drv.set_power_dbm(dev.power_dbm)
    for channel in (2, 3):
        t_lock = drv.set_channel(channel)
        assert t_lock > 0
        st = drv.state()
        assert st.channel == channel and st.locked and st.output_enabled
        assert st.frequency_thz == pytest.approx(bench.grid.frequency_thz(channel), abs=1e-4)
        assert abs(st.power_dbm - dev.power_dbm) <= 0.5


def test_itla_refuses_out_of_range_before_sending(laser):
    dev, drv = laser
    with pytest.raises(SafetyLimitError):
        drv.set_channel(100_000)
    with pytest.raises(SafetyLimitError):
        drv.set_power_dbm(60.0)
    assert drv.state().locked  # still answering, still locked


def test_wss_stage_then_apply_then_read_back(wss, bench):
    dev, drv = wss
    assert isinstance(drv, WavelengthSelectiveSwitch)
    assert drv.identify().serial_number
    before = drv.read_active()
    lo, _hi = dev.channels_allowed
    table = {lo: Route(1, 0.0), lo + 1: Route(2, 1.0)}
    drv.stage(table)
    assert drv.read_active() == before  # staging changes nothing yet
    drv.apply()
    active = drv.read_active()
    assert active[lo] == table[lo] and active[lo + 1] == table[lo + 1]
    drv.block(lo + 1)
    assert drv.read_active()[lo + 1].attenuation_db == pytest.approx(BLOCKED_DB)
    drv.stage({ch: r for ch, r in before.items() if ch in table} or {lo: Route(0, BLOCKED_DB)})
    drv.apply()


def test_wss_refuses_a_port_that_does_not_exist(wss):
    dev, drv = wss
    with pytest.raises((SafetyLimitError, DeviceError)):
        drv.stage({dev.channels_allowed[0]: Route(dev.ports + 1, 0.0)})


def test_power_meter_identifies_and_reads(bench):
    dev, drv = _driver(bench, "powermeter")
    try:
        assert drv.identify().model
        drv.set_wavelength_nm(1, 1550.0)
        assert drv.wavelength_nm(1) == pytest.approx(1550.0)
        reading = drv.read_power_dbm(1)
        assert reading is None or -100.0 < reading < 30.0
    finally:
        drv.close()
