"""Verified transactions through the real drivers against the emulators, with injected faults."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oddl.common.config import load_testbed
from oddl.common.errors import SafetyLimitError
from oddl.controller.device_types import Configuration, TransactionError
from oddl.controller.devices import DeviceManager
from oddl.controller.server import default_configuration
from oddl.drivers.emulators.fabric import INSERTION_LOSS_DB
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed
from oddl.drivers.interfaces import Route

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "testbeds" / "emulated-4node.toml"


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[EmulatedTestbed, DeviceManager]]:
    cfg = load_testbed(CONFIG)
    tb = start_emulated_testbed(cfg)
    for wss in tb.switches.values():
        wss.settle_s = 0.005  # keep the module fast; the settle logic has its own tests
    dm = DeviceManager(tb.resolved)
    dm.connect()
    dm.initialise(default_configuration(tb.resolved))
    yield tb, dm
    dm.close()
    tb.close()


def _table(ports: dict[int, int], att: float = 0.0) -> dict[int, Route]:
    return {ch: Route(p, att) for ch, p in ports.items()}


def test_initialise_leaves_every_device_verified(bench):
    tb, dm = bench
    assert dm.verified.channels == {"laser0": 1, "laser1": 2, "laser2": 3, "laser3": 4}
    assert {ch: r.port for ch, r in tb.switches["wss0"].active_table().items() if not r.blocked} == {
        1: 1, 2: 2, 3: 3, 4: 4}
    assert tb.lasers["laser2"].optical_output().frequency_thz == pytest.approx(193.3)


def test_transaction_applies_and_reads_back(bench):
    tb, dm = bench
    result = dm.transact(Configuration({"laser0": 2, "laser3": 1},
                                       {"wss0": _table({1: 1, 2: 2, 3: 3, 4: 4}, 1.5)}))
    assert result.channels["laser0"] == 2 and result.channels["laser3"] == 1
    assert tb.lasers["laser0"].optical_output().frequency_thz == pytest.approx(193.2)
    assert tb.switches["wss0"].active_table()[2].attenuation_db == pytest.approx(1.5)
    assert dm.transceiver_states["laser3"].channel == 1
    assert dm.tune_times and min(dm.tune_times) >= 0.002 * 0.9  # the emulators' time-to-lock


def test_safety_limits_refuse_before_anything_is_sent(bench):
    tb, dm = bench
    before = tb.switches["wss0"].staged_table()
    with pytest.raises(SafetyLimitError, match="channel 30 is not allowed"):
        dm.transact(Configuration({"laser1": 30}))
    with pytest.raises(SafetyLimitError, match="attenuation 24.0 dB on channel 1 is outside"):
        dm.transact(Configuration(wss_tables={"wss0": _table({1: 1}, 24.0)}))
    with pytest.raises(SafetyLimitError, match="port 9 does not exist"):
        dm.transact(Configuration(wss_tables={"wss0": _table({1: 9})}))
    assert tb.switches["wss0"].staged_table() == before


def test_wss_error_rolls_everything_back(bench):
    tb, dm = bench
    good = dm.verified
    tb.switches["wss0"].inject(error_next=1)  # the next line (URA) is refused
    with pytest.raises(TransactionError) as err:
        dm.transact(Configuration({"laser2": 5}, {"wss0": _table({1: 2, 2: 1})}))
    report = "\n".join(err.value.report)
    assert "restored" in report and "read-back after roll-back matches" in report
    assert dm.verified == good
    assert tb.lasers["laser2"].optical_output().frequency_thz == pytest.approx(
        193.1 + (good.channels["laser2"] - 1) * 0.1)
    assert tb.switches["wss0"].active_table()[1].port == good.wss_tables["wss0"][1].port


def test_laser_that_stops_answering_mid_transaction(bench):
    tb, dm = bench
    good = dm.verified
    tb.lasers["laser1"].inject(no_answer_always=True)
    try:
        with pytest.raises(TransactionError) as err:
            dm.transact(Configuration({"laser1": 6, "laser0": 7}))
        report = "\n".join(err.value.report)
        assert "laser1" in report and "COULD NOT RESTORE" in report
        assert "laser0: restored channel" in report
    finally:
        tb.lasers["laser1"].inject(no_answer_always=False)
    assert dm.verified == good
    assert tb.lasers["laser0"].optical_output().frequency_thz == pytest.approx(
        193.1 + (good.channels["laser0"] - 1) * 0.1)
    # the laser answers again: the next transaction works
    dm.transact(Configuration({"laser1": good.channels["laser1"]}))
    assert dm.transactions_failed == 2


def test_fast_retune_updates_the_verified_channels(bench):
    tb, dm = bench
    assert dm.retune({"laser0": 3, "laser1": 4}) == []
    assert dm.verified.channels["laser0"] == 3
    assert tb.lasers["laser1"].optical_output().frequency_thz == pytest.approx(193.4)
    with pytest.raises(SafetyLimitError, match="laser2: channel 40 is not allowed"):
        dm.retune({"laser2": 40})
    tb.lasers["laser2"].inject(error_next_write=1)
    errors = dm.retune({"laser2": 5})
    assert errors and errors[0].startswith("laser2:")
    assert dm.verified.channels["laser2"] != 5


def test_power_meter_sees_a_wrong_route(bench):
    tb, dm = bench
    # only laser0 is on a routed channel (2, towards n1); the others sit on unrouted channels
    dm.transact(Configuration({"laser0": 2, "laser1": 5, "laser2": 6, "laser3": 7},
                              {"wss0": _table({1: 1, 2: 2, 3: 3, 4: 4})}))
    meter = dm.read_states()["pm0"]["meter"]
    assert meter[2] == pytest.approx(10.0 - INSERTION_LOSS_DB, abs=0.5)
    assert meter[1] is None and meter[3] is None and meter[4] is None
    dm.transact(Configuration(wss_tables={"wss0": _table({2: 3})}))  # the wrong port
    meter = dm.read_states()["pm0"]["meter"]
    assert meter[2] is None
    assert meter[3] == pytest.approx(10.0 - INSERTION_LOSS_DB, abs=0.5)
    dm.transact(Configuration(wss_tables={"wss0": _table({2: 2})}))


def test_a_power_cycled_laser_and_switch_are_noticed_and_restored(bench):
    tb, dm = bench
    want = dict(dm.verified.channels)
    assert dm.check() == []  # everything holds: nothing is sent but reads
    tb.lasers["laser1"].reset()    # power-cycled behind the controller's back: output off
    tb.switches["wss0"].reset()    # every channel blocked
    assert sorted(dm.check()) == ["laser1", "wss0"]
    assert tb.lasers["laser1"].optical_output() is not None
    assert dm.verified.channels == want
    st = dm.drivers["laser1"].state()
    assert (st.channel, st.locked, st.output_enabled) == (want["laser1"], True, True)
    assert {ch: r.port for ch, r in tb.switches["wss0"].active_table().items() if not r.blocked} == {
        1: 1, 2: 2, 3: 3, 4: 4}
    log = [e for e in dm.events if e.action == "restore"]
    assert {e.device for e in log[-2:]} == {"laser1", "wss0"} and all(e.ok for e in log[-2:])
    assert dm.check() == []
