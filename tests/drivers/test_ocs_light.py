"""The light of host ports through the emulated optical circuit switch: a port's light reaches
the host port its connection leads to once the connection is made, goes nowhere (with the
switch port named) while it is being made or missing, and the emulator host keeps a light
table row per host port current as the switch's connections change."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeClock

from oddl.common import lighttable
from oddl.common.config import TestbedConfig, load_testbed
from oddl.common.lighttable import Row, rows_of
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed
from oddl.drivers.emulators.ocs import OcsEmulator
from oddl.drivers.emulators.optical_model import OpticalModel
from oddl.launch.shapes import Shape, switched

SWITCH_S = 0.025


def three_by_two(folder: Path) -> TestbedConfig:
    """3 hosts x 2 ports on a 6x6 switch: host k's port j enters ingress 2k+j, its rx hangs on
    egress 6+2k+j."""
    path = folder / "switched-3x2.toml"
    path.write_text(switched(Shape(3, ports=2)), encoding="utf-8")
    return load_testbed(path)


@pytest.fixture
def cfg(tmp_path: Path) -> TestbedConfig:
    return three_by_two(tmp_path)


def _model(cfg: TestbedConfig, clock: FakeClock) -> tuple[OpticalModel, OcsEmulator]:
    emu = OcsEmulator(6, switch_s=SWITCH_S, clock=clock)
    return OpticalModel(cfg, {}, {}, {"ocs0": emu}), emu


def test_a_row_per_host_port_naming_its_switch_ingress(cfg: TestbedConfig) -> None:
    rows = rows_of(cfg)
    assert [r.label for r in rows] == ["n0.p1", "n0.p2", "n1.p1", "n1.p2", "n2.p1", "n2.p2"]
    assert rows[3] == Row("n1", 2, "ocs0", 4)
    assert rows[3].why(lighttable.NOT_CONNECTED) == "ocs0 ingress 4 is not connected"
    assert rows[3].why(lighttable.SWITCHING) == "ocs0 is switching ingress 4"
    spare = Row("n1", 3)  # a port wired to no switch
    assert spare.why(lighttable.NO_RECEIVER) == "n1.p3.tx has no fibre to a circuit switch"


def test_a_port_reaches_the_port_its_connection_leads_to(cfg: TestbedConfig) -> None:
    clock = FakeClock()
    model, emu = _model(cfg, clock)
    path = model.port_path("n0", 1, clock())
    assert path.dst is None and path.code == lighttable.NOT_CONNECTED
    assert path.reason == "ocs0 ingress 1 is not connected"
    emu.handle_line(":OXC:SWIT:CONN:ADD (@1),(@10)")  # n0.p1 -> egress 10 = n1.p2's rx
    path = model.port_path("n0", 1, clock())
    assert path.dst is None and path.code == lighttable.SWITCHING
    assert path.reason == "ocs0 is switching ingress 1"
    assert model.transitions(clock()) == [pytest.approx(clock() + SWITCH_S)]
    clock.advance(SWITCH_S)
    path = model.port_path("n0", 1, clock())
    assert (path.dst, path.port, path.reason) == ("n1", 2, "ok")
    assert model.path_code("n0.p1", clock()) == 3  # the row of n1.p2
    assert model.transitions(clock()) == []
    # the other ports stay dark
    assert model.port_path("n0", 2, clock()).code == lighttable.NOT_CONNECTED


def test_a_reconfiguration_moves_the_light_after_the_switching_time(cfg: TestbedConfig) -> None:
    clock = FakeClock()
    model, emu = _model(cfg, clock)
    emu.handle_line(":OXC:SWIT:CONN:ADD (@1),(@10)")
    clock.advance(1.0)
    assert model.port_path("n0", 1, clock()).dst == "n1"
    emu.handle_line(":OXC:SWIT:CONN:ONLY (@1),(@12)")  # now to egress 12 = n2.p2's rx
    t = clock()
    assert model.port_path("n0", 1, t).code == lighttable.SWITCHING
    assert model.port_path("n0", 1, t + SWITCH_S - 1e-6).dst is None  # nothing early
    moved = model.port_path("n0", 1, t + SWITCH_S)
    assert (moved.dst, moved.port) == ("n2", 2)


def test_a_failed_port_passes_no_light(cfg: TestbedConfig) -> None:
    clock = FakeClock()
    model, emu = _model(cfg, clock)
    emu.handle_line(":OXC:SWIT:CONN:ADD (@3),(@7)")  # n1.p1 -> n0.p1
    clock.advance(1.0)
    assert model.port_path("n1", 1, clock()).dst == "n0"
    changes: list[int] = []
    emu.on_change = lambda: changes.append(1)
    emu.fail_port(7)
    path = model.port_path("n1", 1, clock())
    assert path.code == lighttable.PORT_DOWN and "port 7 is failed" in path.reason
    assert changes == [1]


def test_the_switch_calls_on_change_when_the_light_changes_only(cfg: TestbedConfig) -> None:
    emu = OcsEmulator(6, switch_s=SWITCH_S, clock=FakeClock())
    changes: list[int] = []
    emu.on_change = lambda: changes.append(1)
    emu.handle_line(":OXC:SWIT:CONN:STAT?")
    emu.process(b"*IDN?")
    assert changes == []
    emu.process(b":OXC:SWIT:CONN:ADD (@1),(@10)")
    assert changes == [1]
    emu.handle_line(":OXC:SWIT:DISC:ALL")
    assert changes == [1, 1]


def test_a_host_without_a_laser_has_light_on_its_ports_only(cfg: TestbedConfig) -> None:
    model, _ = _model(cfg, FakeClock())
    path = model.path("n0")
    assert path.dst is None and "n0 has no tunable transmitter" in path.reason


# ---- the emulator host's light table ------------------------------------------------------
@pytest.fixture
def bed(cfg: TestbedConfig) -> Iterator[EmulatedTestbed]:
    tb = start_emulated_testbed(cfg)
    try:
        yield tb
    finally:
        tb.close()


def test_the_emulator_host_publishes_a_row_per_port(bed: EmulatedTestbed) -> None:
    assert bed.light is not None and bed.fabric is not None
    assert bed.light.nodes == 6
    resolved = bed.resolved
    assert resolved.fabric.light_table == str(bed.light.path)
    assert resolved.fabric.address == bed.fabric.address
    now = time.monotonic()
    assert {bed.light.at(i, now)[1] for i in range(6)} == {lighttable.NOT_CONNECTED}


def test_a_connection_rewrites_the_table_with_the_instant_it_completes(
        bed: EmulatedTestbed) -> None:
    assert bed.light is not None
    emu = bed.circuit_switches["ocs0"]
    before = time.monotonic()
    emu.handle_line(":OXC:SWIT:CONN:ADD (@5),(@8)")  # n2.p1 -> egress 8 = n0.p2's rx
    after = time.monotonic()
    line = bed.light.timeline(4)  # the row of n2.p1
    (_, dst, since) = line[-1]
    assert dst == 1  # the row of n0.p2
    assert before + SWITCH_S <= since <= after + SWITCH_S
    assert line[-2][1] == lighttable.SWITCHING
    # a change before it completes withdraws the plan
    emu.handle_line(":OXC:SWIT:CONN:SUB (@5)")
    assert emu.connections == {}
    assert bed.light.timeline(4)[-1][1] == lighttable.NOT_CONNECTED


def test_the_trace_shows_a_ports_light_and_its_switching(cfg: TestbedConfig,
                                                         tmp_path: Path) -> None:
    import json

    from oddl.common.tracing import TRACE
    from oddl.drivers.emulators.light_trace import LightTrace

    clock = FakeClock()
    model, emu = _model(cfg, clock)
    rows = [r.label for r in model.rows]
    trace = LightTrace(cfg, lambda row, t: model.row_path(row, t).power_dbm, rows)
    TRACE.start(tmp_path, "emulators")
    try:
        trace.update("n0.p1", [(clock(), model.path_code("n0.p1", clock()))], clock())
        emu.handle_line(":OXC:SWIT:CONN:ADD (@1),(@10)")
        t = clock()
        trace.update("n0.p1", [(t, model.path_code("n0.p1", t)),
                               (t + SWITCH_S, model.path_code("n0.p1", t + SWITCH_S))], t)
        trace.flush()
    finally:
        path = TRACE.stop()
    assert path is not None
    events = json.loads(path.read_text(encoding="utf-8"))["traceEvents"]
    light = [e for e in events if e.get("cat") == "light"]
    assert {e["name"] for e in light} >= {"n0.p1 -> n1.p2", "settle"}
    (begin,) = [e for e in light if e["name"] == "n0.p1 -> n1.p2" and e.get("ph") == "b"]
    assert begin["args"]["receiver"] == "n1.p2" and begin["args"]["channel"] == 0
    assert begin["args"]["power_dbm"] == pytest.approx(-emu.loss_db)


def test_the_relay_paces_each_port_on_its_own(cfg: TestbedConfig) -> None:
    """Two frames from n0, on p1 and p2 at once, both arrive one serialisation time later."""
    from helpers import wait_until

    from oddl.agents.links.zeromq import FabricLink
    from oddl.drivers.emulators.fabric import Fabric

    clock = FakeClock()
    model, emu = _model(cfg, clock)
    emu.handle_line(":OXC:SWIT:CONN:ADD (@1,2),(@9,11)")  # n0.p1 -> n1.p1, n0.p2 -> n2.p1
    clock.advance(1.0)
    fabric = Fabric(model, 1e9, clock=clock)
    links = {n: FabricLink(n, fabric.address) for n in ("n0", "n1", "n2")}
    try:
        for dst in ("n1", "n2"):
            links["n0"].send({"job": "j", "seq": 1, "step": 0, "src": "n0", "dst": dst,
                              "net": "optical"}, b"a" * 125_000)  # 1 ms at 1 Gbit/s each
        wait_until(lambda: fabric.in_flight == 2, 10, "both frames on the wire")
        clock.advance(0.00105)  # one frame's time: serial on one transmitter, one would wait
        wait_until(lambda: fabric.stats.delivered == 2, 10, "both frames delivered")
        assert fabric.in_flight == 0 and not fabric.stats.lost
        for dst in ("n1", "n2"):
            assert links[dst].inbox.take(("j", 1, 0, "n0"), time.time() + 5) is not None
    finally:
        for link in links.values():
            link.close()
        fabric.close()
