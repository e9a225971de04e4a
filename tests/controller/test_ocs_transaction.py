"""The optical circuit switch in the device transaction: the real `PolatisOcs` driver talks
SCPI to the emulator over TCP; nothing above the driver is faked.

A change names some ingress ports of a switch; only those are sent commands, the switch is
read back whole, and a failure anywhere (the switch, a laser, the WSS) sets every device back
to the last verified configuration. Bad ports are refused before any command. After a
controller restart the switch's connections are adopted (or restored) from the store."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from switch_beds import mixed_testbed

from oddl.common.config import load_testbed
from oddl.common.errors import SafetyLimitError
from oddl.common.tracing import TRACE
from oddl.controller.device_types import Configuration, TransactionError
from oddl.controller.devices import DeviceManager
from oddl.controller.server import ControllerServer, default_configuration
from oddl.controller.store import Store
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed
from oddl.drivers.interfaces import Route
from oddl.drivers.ocs import PolatisOcs
from oddl.launch.shipped import shipped_testbed


def _fast(tb: EmulatedTestbed) -> None:
    for wss in tb.switches.values():
        wss.settle_s = 0.005  # the settle logic has its own tests
    for ocs in tb.circuit_switches.values():
        ocs.switch.switch_s = 0.001


@pytest.fixture
def mixed(tmp_path) -> Iterator[tuple[EmulatedTestbed, DeviceManager, list[tuple[str, str]]]]:
    tb = start_emulated_testbed(mixed_testbed(tmp_path))
    _fast(tb)
    commands: list[tuple[str, str]] = []
    dm = DeviceManager(tb.resolved, on_command=lambda d, op, _s: commands.append((d, op)))
    try:
        dm.connect()
        dm.initialise(default_configuration(tb.resolved))
        yield tb, dm, commands
    finally:
        dm.close()
        tb.close()


@pytest.fixture(scope="module")
def topoopt() -> Iterator[EmulatedTestbed]:
    tb = start_emulated_testbed(load_testbed(shipped_testbed("topoopt-12node")))
    _fast(tb)
    try:
        yield tb
    finally:
        tb.close()


def _switch_events(dm: DeviceManager, switch: str) -> list[str]:
    return [f"{e.action}: {e.detail}" for e in dm.events if e.device == switch]


def test_a_change_connects_and_reads_back_and_leaves_other_ports(mixed) -> None:
    tb, dm, commands = mixed
    emulator = tb.circuit_switches["ocs0"]
    assert dm.verified.connections == {"ocs0": {}}  # adopted at start-up, as read
    dm.transact(Configuration(connections={"ocs0": {1: 17, 2: 18}}), reason="job a")
    assert emulator.connections == {1: 17, 2: 18}
    assert dm.verified.connections["ocs0"] == {1: 17, 2: 18}
    made_at = emulator.switch._settled_at[1]
    dm.transact(Configuration(connections={"ocs0": {2: 0, 3: 19}}), reason="job b")
    assert emulator.connections == {1: 17, 3: 19}
    assert emulator.switch._settled_at[1] == made_at  # ingress 1 was never switched again
    assert _switch_events(dm, "ocs0")[-2:] == ["switch: connect 1→17 2→18",
                                               "switch: disconnect 2; connect 3→19"]
    assert ("ocs0", "connect") in commands and ("ocs0", "disconnect") in commands
    assert commands.count(("*", "transaction")) == 3  # initialise and the two changes
    state = dm.read_states()["ocs0"]
    assert state["reachable"] and state["connections"] == {1: 17, 3: 19}
    assert set(state["power"]) == {1, 3, 17, 19}


def test_a_laser_failing_after_the_switch_changed_rolls_everything_back(mixed) -> None:
    tb, dm, _ = mixed
    dm.transact(Configuration(connections={"ocs0": {1: 17}}))
    good = dm.verified
    tb.lasers["laser2"].inject(error_next_write=1)  # laser2 refuses its tune (XE)
    with pytest.raises(TransactionError) as err:
        dm.transact(Configuration({"laser2": 5},
                                  {"wss0": {1: Route(2, 0.0), 2: Route(1, 0.0)}},
                                  {"ocs0": {1: 0, 4: 20, 5: 21}}))
    # the switch and the WSS had done their part (in parallel with the tune): the log says so
    assert "switch: disconnect 1; connect 4→20 5→21" in _switch_events(dm, "ocs0")
    assert any(e.device == "wss0" and e.action == "apply" for e in dm.events)
    report = "\n".join(err.value.report)
    assert "laser2" in report.splitlines()[0]
    assert ("ocs0: set ingress 1, 4, 5 back to the last verified connections "
            "(disconnect 4 5; connect 1→17)") in report
    assert "wss0: restored the last verified table" in report
    assert "read-back after roll-back matches the last verified configuration" in report
    assert dm.verified == good
    assert tb.circuit_switches["ocs0"].connections == {1: 17}
    assert {ch: r.port for ch, r in tb.switches["wss0"].active_table().items()
            if ch in (1, 2)} == {1: 1, 2: 2}
    assert tb.lasers["laser2"].optical_output().frequency_thz == pytest.approx(
        193.1 + (good.channels["laser2"] - 1) * 0.1)


def test_a_switch_that_refuses_rolls_the_lasers_back(mixed) -> None:
    tb, dm, _ = mixed
    emulator = tb.circuit_switches["ocs0"]
    dm.transact(Configuration(connections={"ocs0": {1: 17}}))
    good = dm.verified
    emulator.fail_port(22)  # a failed egress port: the switch refuses the connection (-240)
    try:
        with pytest.raises(TransactionError) as err:
            dm.transact(Configuration({"laser0": 6}, connections={"ocs0": {6: 22, 7: 23}}))
    finally:
        emulator.fail_port(22, failed=False)
    report = "\n".join(err.value.report)
    assert "ocs0" in report.splitlines()[0]  # the failure names the switch
    assert "laser0: restored channel" in report
    assert "read-back after roll-back matches" in report
    assert emulator.connections == {1: 17}
    assert dm.verified == good
    assert tb.lasers["laser0"].optical_output().frequency_thz == pytest.approx(
        193.1 + (good.channels["laser0"] - 1) * 0.1)


def test_a_silent_misroute_is_caught_by_the_read_back(topoopt) -> None:
    tb = topoopt
    emulator = tb.circuit_switches["ocs0"]
    dm = DeviceManager(tb.resolved)
    try:
        dm.connect()
        dm.initialise(default_configuration(tb.resolved))
        dm.transact(Configuration(connections={"ocs0": {1: 53}}))
        emulator.inject(misroute_next=1)  # the switch leaves a connection unmade, no error
        with pytest.raises(TransactionError) as err:
            dm.transact(Configuration(connections={"ocs0": {1: 0, 2: 54, 3: 55}}))
        report = "\n".join(err.value.report)
        assert "ocs0 ingress 3: wanted egress 55, reads unconnected" in report
        assert "read-back after roll-back matches" in report
        assert emulator.connections == {1: 53}
        assert dm.transactions_failed == 1
    finally:
        dm.transact(Configuration(connections={"ocs0": {1: 0}}))
        dm.close()


@pytest.mark.parametrize(("ports", "message"), [
    ({49: 60}, "ocs0: port 49 is an egress port, not an ingress port .* ingress port first"),
    ({0: 60}, "ocs0: ingress port 0 does not exist .*ingress 1..48, egress 49..96"),
    ({97: 0}, "ocs0: ingress port 97 does not exist"),
    ({1: 2}, "ocs0: port 2 asked as the egress of ingress 1 is an ingress port"),
    ({1: 97}, "ocs0: egress port 97 .* does not exist"),
    ({1: 60, 2: 60}, "egress port 60 is asked of ingress 1 and ingress 2; .*--disconnect 1"),
])
def test_bad_ports_are_refused_before_any_command(topoopt, ports, message) -> None:
    tb = topoopt
    commands: list[tuple[str, str]] = []
    dm = DeviceManager(tb.resolved, on_command=lambda d, op, _s: commands.append((d, op)))
    try:
        dm.connect()
        dm.initialise(default_configuration(tb.resolved))
        commands.clear()
        lines = tb.circuit_switches["ocs0"].lines_handled
        with pytest.raises(SafetyLimitError, match=message):
            dm.transact(Configuration(connections={"ocs0": ports}))
        assert commands == [] and tb.circuit_switches["ocs0"].lines_handled == lines
    finally:
        dm.close()


def test_an_egress_taken_by_another_connection_and_unknown_switches_are_refused(topoopt
                                                                                ) -> None:
    tb = topoopt
    dm = DeviceManager(tb.resolved)
    try:
        dm.connect()
        dm.initialise(default_configuration(tb.resolved))
        dm.transact(Configuration(connections={"ocs0": {1: 53}}))
        with pytest.raises(SafetyLimitError, match="egress port 53 is asked of ingress 1 and "
                                                   "ingress 2"):
            dm.transact(Configuration(connections={"ocs0": {2: 53}}))
        with pytest.raises(SafetyLimitError, match="'ocs9' is not a circuit switch of the "
                                                   "testbed topoopt-12node .*ocs0"):
            dm.transact(Configuration(connections={"ocs9": {1: 53}}))
        assert tb.circuit_switches["ocs0"].connections == {1: 53}
    finally:
        dm.transact(Configuration(connections={"ocs0": {1: 0}}))
        dm.close()


def test_a_restarted_controller_adopts_the_switch_or_restores_it(tmp_path) -> None:
    tb = start_emulated_testbed(mixed_testbed(tmp_path))
    _fast(tb)
    emulator = tb.circuit_switches["ocs0"]
    state = tmp_path / "state.db"

    def serve() -> ControllerServer:
        server = ControllerServer(tb.resolved, "127.0.0.1:0", metrics_listen=None,
                                  state=str(state))
        server.start()
        return server

    def reconciled(server: ControllerServer) -> str:
        return [e.detail for e in server.devices.events
                if e.action == "reconcile after restart"][-1]

    try:
        server = serve()
        try:
            server.devices.transact(Configuration(connections={"ocs0": {1: 17, 2: 18}}))
        finally:
            server.stop()
        assert Store(state).connections() == {"ocs0": {1: 17, 2: 18}}

        server = serve()  # the switch held its connections: adopted, nothing sent
        try:
            assert server.devices.verified.connections == {"ocs0": {1: 17, 2: 18}}
            assert "adopted laser0, laser1, laser2, laser3, wss0, ocs0" in reconciled(server)
        finally:
            server.stop()

        with PolatisOcs.open(tb.resolved.device("ocs0").resource, size=16) as by_hand:
            by_hand.disconnect([2])  # while the controller is down
            by_hand.connect({7: 30})
        server = serve()
        try:
            assert reconciled(server).endswith("; restored ocs0")
            assert emulator.connections == {1: 17, 2: 18}
            assert server.devices.verified.connections == {"ocs0": {1: 17, 2: 18}}
        finally:
            server.stop()
    finally:
        tb.close()


def test_the_watch_restores_a_switch_that_lost_its_verified_table(mixed) -> None:
    tb, dm, _ = mixed
    emulator = tb.circuit_switches["ocs0"]
    dm.transact(Configuration(connections={"ocs0": {1: 17, 2: 18}}))
    assert dm.check() == []  # it holds the verified table: nothing is sent
    with PolatisOcs.open(tb.resolved.device("ocs0").resource, size=16) as by_hand:
        by_hand.disconnect([2])
        by_hand.connect({5: 21})
    assert dm.check() == ["ocs0"]
    assert emulator.connections == {1: 17, 2: 18}
    assert [e.action for e in dm.events if e.device == "ocs0"][-1] == "restore"


def test_the_trace_and_the_metrics_show_the_switch_commands_and_the_transaction(
        mixed, tmp_path) -> None:
    tb, dm, commands = mixed
    commands.clear()
    TRACE.start(tmp_path, "controller")
    try:
        dm.transact(Configuration(connections={"ocs0": {1: 17}}), reason="traced")
    finally:
        written = TRACE.stop()
    assert written is not None
    events = [e for e in json.loads(written.read_text())["traceEvents"]
              if e.get("cat") == "device" and e.get("ph") == "X"]
    ocs = [e["args"]["command"] for e in events if e["args"]["device"] == "ocs0"]
    assert any("CONN" in c.upper() and "ADD" in c.upper() for c in ocs), ocs
    assert any("STAT" in c.upper() for c in ocs), ocs
    (transaction,) = [e for e in events if e["args"]["device"] == "transaction"]
    assert transaction["name"] == "transaction traced" and transaction["args"]["ok"]
    # every device of the target is read back (in parallel); the switch's steps in order
    assert [c for c in commands if c[0] in ("ocs0", "*")] == [
        ("ocs0", "read"), ("ocs0", "connect"), ("ocs0", "read"), ("*", "transaction")]
