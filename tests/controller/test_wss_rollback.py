"""Port 99 ("blocked by port") through the controller's transactions and their roll-back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oddl.common.config import load_testbed
from oddl.common.errors import SafetyLimitError
from oddl.controller.device_types import Configuration, TransactionError
from oddl.controller.devices import DeviceManager
from oddl.controller.server import default_configuration
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed
from oddl.drivers.interfaces import BLOCKED_DB, Route

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "testbeds" / "emulated-4node.toml"


@pytest.fixture
def bench() -> Iterator[tuple[EmulatedTestbed, DeviceManager]]:
    cfg = load_testbed(CONFIG)
    tb = start_emulated_testbed(cfg)
    for wss in tb.switches.values():
        wss.settle_s = 0.005
    dm = DeviceManager(tb.resolved)
    try:
        dm.connect()
        dm.initialise(default_configuration(tb.resolved))
        yield tb, dm
    finally:
        dm.close()
        tb.close()


def test_port_99_is_applied_read_back_and_restored_by_roll_back(bench) -> None:
    tb, dm = bench
    wss = tb.switches["wss0"]
    blocked = {5: Route(99, 0.0), 6: Route(99, BLOCKED_DB)}
    dm.transact(Configuration(wss_tables={"wss0": blocked}))
    assert {ch: wss.active_table()[ch] for ch in blocked} == blocked
    good = dm.verified
    assert good.wss_tables["wss0"][5] == Route(99, 0.0)
    wss.inject(error_next=1)  # the next line (the URA) is refused with VER
    with pytest.raises(TransactionError) as err:
        dm.transact(Configuration(wss_tables={"wss0": {5: Route(2, 0.0), 6: Route(3, 1.0)}}))
    report = "\n".join(err.value.report)
    assert "VER" in report and "wss0: restored the last verified table" in report
    assert "read-back after roll-back matches" in report
    assert dm.verified == good
    assert {ch: wss.active_table()[ch] for ch in blocked} == blocked
    assert dm.check() == []  # the module holds the verified table


def test_controller_refuses_ports_that_do_not_exist(bench) -> None:
    tb, dm = bench
    before = tb.switches["wss0"].staged_table()
    for port in (0, 5, 98):
        with pytest.raises(SafetyLimitError, match=f"port {port} does not exist .*99 to block"):
            dm.transact(Configuration(wss_tables={"wss0": {1: Route(port, 0.0)}}))
    assert tb.switches["wss0"].staged_table() == before
