"""A WSS whose module numbers channels by its own plan (``module_plan`` in the testbed file):
the map by frequency, the file's checks, the real driver against the emulator on that plan,
and the emulated testbed end to end with its switch on the factory 50 GHz plan."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import EMULATED

from oddl.agents.client.every_rank import allreduce_all
from oddl.common.config import (
    FixedPlan,
    GridConfig,
    channel_map,
    dump_testbed,
    load_testbed,
    parse_testbed,
)
from oddl.common.errors import ConfigError
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.emulators.wss import WssEmulator
from oddl.drivers.emulators.wss_serve import wss_connection_handler
from oddl.drivers.interfaces import BLOCKED_DB, Route
from oddl.drivers.transport import SerialTransport
from oddl.drivers.wss import FlexgridWss
from oddl.drivers.wss_codec import InvalidRouteTable
from oddl.drivers.wss_protocol import FACTORY_PLAN
from oddl.launch.testbed import RunningTestbed, write_config

FACTORY_LINE = "module_plan = { first_channel = 0, first_thz = 191.35, spacing_ghz = 50.0, channels = 96 }"
"""The emulator's factory plan (oddl.drivers.wss_protocol.FACTORY_PLAN) as a testbed file line."""
LAB_GRID = GridConfig(first_thz=193.1, spacing_ghz=100.0, channels=48)


def with_module_plan(tmp_path: Path, allowed: str = "[1, 8]", plan: str = FACTORY_LINE) -> str:
    """The emulated testbed file with its WSS on `plan` and `allowed` channels."""
    text = EMULATED.read_text(encoding="utf-8")
    old = "channels_allowed = [1, 8]"
    assert old in text
    return text.replace(old, f"channels_allowed = {allowed}\n{plan}")


# --- the map ------------------------------------------------------------------------------------

def test_the_testbed_grid_maps_onto_the_factory_plan_by_frequency():
    mapped, missing = channel_map(LAB_GRID.plan, (1, 48), FACTORY_PLAN)
    # channel n of the 100 GHz grid from 193.1 THz is module channel 35 + 2(n-1) on 50 GHz
    # from 191.35 THz, up to 196.1 THz (module channel 95, testbed channel 31)
    assert mapped == {n: 35 + 2 * (n - 1) for n in range(1, 32)}
    assert [m.channel for m in missing] == list(range(32, 49))
    assert missing[0].thz == pytest.approx(196.2)


def test_a_channel_between_the_modules_centres_is_unmapped():
    plan = FixedPlan(first_channel=1, first_thz=193.125, spacing_ghz=50.0, channels=40)
    mapped, missing = channel_map(LAB_GRID.plan, (1, 3), plan)
    assert mapped == {} and [m.channel for m in missing] == [1, 2, 3]


# --- the testbed file ---------------------------------------------------------------------------

def test_the_file_takes_a_module_plan_and_writes_it_back(tmp_path: Path):
    cfg = parse_testbed(with_module_plan(tmp_path), "t.toml")
    wss = cfg.device("wss0")
    assert wss.module_plan == FACTORY_PLAN
    again = parse_testbed(dump_testbed(cfg), "again.toml")
    assert again.device("wss0").module_plan == FACTORY_PLAN
    plain = load_testbed(EMULATED)
    assert plain.device("wss0").module_plan is None


def test_allowed_channels_off_the_modules_plan_are_refused_with_the_fix(tmp_path: Path):
    with pytest.raises(ConfigError) as err:
        parse_testbed(with_module_plan(tmp_path, allowed="[1, 40]"), "t.toml")
    text = str(err.value)
    assert "wss0" in text and "module_plan" in text
    assert "testbed channel 32" in text and "196.2000 THz" in text
    assert "[1, 31]" in text  # the allowed run the module has


@pytest.mark.parametrize("plan, words", [
    ("module_plan = { first_channel = 0, first_thz = 191.35, spacing_ghz = 50.0 }",
     ["module_plan.channels", "missing"]),
    ("module_plan = { first_channel = 0, first_thz = 191.35, spacing_ghz = 50.0, "
     "channels = 96, width = 3 }", ["module_plan.width", "unknown key"]),
    ("module_plan = { first_channel = -1, first_thz = 191.35, spacing_ghz = 50.0, "
     "channels = 96 }", ["module_plan.first_channel", "outside"]),
    ('module_plan = "factory"', ["module_plan", "inline table"]),
])
def test_a_malformed_module_plan_names_the_key(tmp_path: Path, plan: str, words: list[str]):
    with pytest.raises(ConfigError) as err:
        parse_testbed(with_module_plan(tmp_path, plan=plan), "t.toml")
    assert all(w in str(err.value) for w in words), str(err.value)


# --- the driver against the emulator on the module's plan --------------------------------------

@pytest.fixture
def factory_wss() -> Iterator[tuple[WssEmulator, FlexgridWss, FlexgridWss]]:
    """An emulator on the factory plan; a driver with the testbed's map and one without."""
    emu = WssEmulator(settle_s=0.002)
    server = TcpEmulatorServer(wss_connection_handler(emu), name="wss-factory")
    mapped, _ = channel_map(LAB_GRID.plan, (1, 8), FACTORY_PLAN)
    drivers = [FlexgridWss(SerialTransport(server.url, name=name), name=name, timeout=0.5,
                           channel_map=m) for name, m in (("mapped", mapped), ("raw", None))]
    try:
        yield emu, drivers[0], drivers[1]
    finally:
        for d in drivers:
            d.close()
        server.close()


def test_the_driver_speaks_testbed_channels_and_the_wire_module_channels(factory_wss):
    emu, wss, raw = factory_wss
    wss.update_and_switch({1: Route(2), 3: Route(4, 1.5)})
    module = raw.read_active()
    assert module[35] == Route(2) and module[39] == Route(4, 1.5)
    assert emu.route(193.1) == Route(2) and emu.route(193.3) == Route(4, 1.5)
    active = wss.read_active()
    assert active[1] == Route(2) and active[3] == Route(4, 1.5)
    assert all(1 <= ch <= 8 for ch in active)
    wss.stage({1: Route(3)})
    wss.apply()
    assert raw.read_active()[35] == Route(3)
    wss.block(1)
    assert raw.read_active()[35].blocked and wss.read_active()[1].blocked


def test_light_on_an_unmapped_module_channel_is_reported_not_hidden(factory_wss):
    _, wss, raw = factory_wss
    raw.update_and_switch({36: Route(1), 34: Route(2, BLOCKED_DB)})
    active = wss.read_active()
    assert 36 not in active and wss.numbering.unmapped_active == {36: Route(1)}


def test_an_unmapped_channel_or_a_plan_change_is_refused_before_anything_is_sent(factory_wss):
    emu, wss, raw = factory_wss
    before = raw.read_active()
    with pytest.raises(InvalidRouteTable, match="testbed channel 9 has no channel"):
        wss.update_and_switch({1: Route(1), 9: Route(2)})
    with pytest.raises(InvalidRouteTable, match="module_plan"):
        wss.define_channels({1: (1, 8)})
    with pytest.raises(InvalidRouteTable, match="module_plan"):
        wss.set_channel_width(100)
    assert raw.read_active() == before and raw.channel_width() == 50


# --- the emulated testbed, its switch on the factory plan ---------------------------------------

@pytest.fixture(scope="module")
def factory_testbed(tmp_path_factory) -> Iterator[RunningTestbed]:
    tmp = tmp_path_factory.mktemp("factory-plan")
    config = write_config(EMULATED, tmp / "factory.toml",
                          {"channels_allowed = [1, 8]": f"channels_allowed = [1, 8]\n{FACTORY_LINE}"})
    with RunningTestbed(tmp, config) as tb:
        yield tb


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("collective", ["ring", "halving-doubling"])
def test_collectives_are_exact_through_a_switch_on_its_own_plan(factory_testbed, collective):
    tb = factory_testbed
    job = tb.operator.submit(f"factory-{collective}", [], collective, "optical", None)
    try:
        rng = np.random.default_rng(7)
        arrays = [rng.integers(-2**40, 2**40, 50_000) for _ in tb.clients]
        exact = np.sum(arrays, axis=0)
        for out in allreduce_all(tb.clients, arrays)[1]:
            assert isinstance(out, np.ndarray), out
            np.testing.assert_array_equal(out, exact)
    finally:
        tb.operator.cancel(job["id"])
    cfg = load_testbed(tb.launched.resolved)
    rx = {cfg.attachment(n.id).out_port: n.rx_channel for n in cfg.nodes}
    dev = cfg.device("wss0")
    with FlexgridWss(SerialTransport(dev.resource, name="raw"), name="raw", timeout=2.0) as raw:
        module = raw.read_active()
    # each node's receive channel n is routed to its out-port on module channel 35 + 2(n-1)
    for port, channel in rx.items():
        assert module[35 + 2 * (channel - 1)].port == port
