"""`oddl reconfigure --ocs`, `oddl devices` and `oddl watch` on a circuit switch, run as an
operator runs them: CLI processes against a controller whose real driver talks SCPI to the
emulated switch over TCP (the mixed testbed of `switch_beds`: lasers, a WSS and ``ocs0``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from helpers import run_oddl
from switch_beds import mixed_testbed

from oddl.controller.server import ControllerServer
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[EmulatedTestbed, dict[str, str]]]:
    tb = start_emulated_testbed(mixed_testbed(tmp_path_factory.mktemp("ocs-cli")))
    for wss in tb.switches.values():
        wss.settle_s = 0.005
    server = ControllerServer(tb.resolved, "127.0.0.1:0", metrics_listen=None)
    try:
        server.start()
        yield tb, {"ODDL_CONTROLLER": server.address, "COLUMNS": "160"}
    finally:
        server.stop()
        tb.close()


def test_reconfigure_connects_and_disconnects_switch_ports(served) -> None:
    tb, env = served
    emulator = tb.circuit_switches["ocs0"]
    dry = run_oddl("reconfigure", "--ocs", "ocs0", "--connect", "1:18,2:17", "--dry-run",
                   env=env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "dry run:",
        "ocs0: ingress 1 (n0.p1) → egress 18 (n1.p1), was unconnected",
        "ocs0: ingress 2 (n1.p1) → egress 17 (n0.p1), was unconnected"]
    assert emulator.connections == {}  # a dry run sends nothing
    unconfirmed = run_oddl("reconfigure", "--ocs", "ocs0", "--connect", "1:18", env=env)
    assert unconfirmed.returncode == 2 and "pass --yes" in unconfirmed.stderr
    applied = run_oddl("reconfigure", "--ocs", "ocs0", "--connect", "1:18,2:17", "--yes",
                       env=env)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.startswith("applied and verified: ocs0: ingress 1 (n0.p1) → egress "
                                     "18 (n1.p1), was unconnected")
    assert emulator.connections == {1: 18, 2: 17}
    moved = run_oddl("reconfigure", "--ocs", "ocs0", "--disconnect", "2", "--connect", "3:19",
                     "--yes", "--json", env=env)
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["changes"] == [
        "ocs0: ingress 2 (n1.p1) → disconnected, was egress 17 (n0.p1)",
        "ocs0: ingress 3 (n2.p1) → egress 19 (n2.p1), was unconnected"]
    assert emulator.connections == {1: 18, 3: 19}  # ingress 1 kept its connection
    devices = run_oddl("devices", env=env)
    assert devices.returncode == 0, devices.stderr
    (line,) = [x for x in devices.stdout.splitlines() if x.startswith("ocs0")]
    assert line.split()[:5] == ["ocs0", "ocs", "yes", "1→18", "3→19"]


@pytest.mark.parametrize(("args", "code", "message"), [
    (("--connect", "3:5"), 4, "ocs0: port 5 asked as the egress of ingress 3 is an ingress "
                              "port"),
    (("--connect", "40:17"), 4, "ocs0: ingress port 40 does not exist (a 16x16 unit"),
    (("--connect", "3x5"), 2, "--connect: '3x5' is not IN:OUT"),
    (("--disconnect", "two"), 2, "--disconnect: 'two' is not a port number"),
    ((), 2, "--ocs needs --connect IN:OUT[,IN:OUT...] and/or --disconnect"),
    (("--connect", "4:20", "--disconnect", "4"), 4, "ingress 4 is both connected and "
                                                    "disconnected"),
])
def test_reconfigure_refuses_bad_switch_input(served, args, code, message) -> None:
    tb, env = served
    before = tb.circuit_switches["ocs0"].connections
    out = run_oddl("reconfigure", "--ocs", "ocs0", *args, "--yes", env=env)
    assert out.returncode == code and message in out.stderr, out.stderr
    assert tb.circuit_switches["ocs0"].connections == before


def test_a_refused_switch_leaves_nothing_half_applied(served) -> None:
    tb, env = served
    emulator = tb.circuit_switches["ocs0"]
    before = emulator.connections
    emulator.fail_port(20)
    try:
        out = run_oddl("reconfigure", "--ocs", "ocs0", "--connect", "4:20", "--yes", env=env)
    finally:
        emulator.fail_port(20, failed=False)
    assert out.returncode == 4
    assert "reconfiguration failed and was rolled back" in out.stderr
    assert "read-back after roll-back matches" in out.stderr
    assert emulator.connections == before


def test_watch_shows_the_switch_connections_with_host_ports(served) -> None:
    tb, env = served
    if tb.circuit_switches["ocs0"].connections.get(1) != 18:
        assert run_oddl("reconfigure", "--ocs", "ocs0", "--connect", "1:18", "--yes",
                        env=env).returncode == 0
    view = run_oddl("watch", "--once", env=env)
    assert view.returncode == 0, view.stderr
    assert "circuit switches (from device read-back)" in view.stdout
    assert "1→18 (n0.p1→n1.p1)" in view.stdout
    assert "circuits (from device read-back)" in view.stdout  # the lasers' view stays
