"""The real OCS driver (PolatisOcs over pyserial's socket://) against the emulator on a
loopback port: connections, the verified transaction and its roll-back, ports and light,
timeouts and a restart of the switch's controller."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError
from oddl.drivers.emulators.ocs import Answer, OcsEmulator
from oddl.drivers.emulators.ocs_serve import ocs_connection_handler
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.interfaces import DeviceIdentity
from oddl.drivers.ocs import OcsCommandError, OcsTransactionError, OpticalCircuitSwitch, PolatisOcs
from oddl.drivers.ocs_protocol import PortFlag, PortState

TIMEOUT = 2.0
"""Generous: no test depends on how fast the machine is."""


@pytest.fixture
def emu() -> OcsEmulator:
    return OcsEmulator(16, switch_s=0.002, serial_number="SN0016")


@pytest.fixture
def resource(emu: OcsEmulator) -> Iterator[str]:
    with TcpEmulatorServer(ocs_connection_handler(emu), name="ocs-emu") as server:
        host, port = server.address
        yield f"TCPIP0::{host}::{port}::SOCKET"


@pytest.fixture
def ocs(resource: str) -> Iterator[PolatisOcs]:
    with PolatisOcs.open(resource, name="ocs0", timeout=TIMEOUT) as switch:
        yield switch


def test_identify_and_size(ocs: PolatisOcs) -> None:
    assert isinstance(ocs, OpticalCircuitSwitch)
    assert ocs.identify() == DeviceIdentity(
        kind="ocs", manufacturer="Polatis", model="N-OST-16x16-LA1-DMHNS",
        serial_number="SN0016", extra=(("firmware", "0.0.0-emu"), ("size", "16x16")))
    assert ocs.size == 16 and ocs.geometry.egress == range(17, 33)


def test_a_configured_size_is_checked_against_the_switch(resource: str) -> None:
    with PolatisOcs.open(resource, name="ocs0", size=8, timeout=TIMEOUT) as wrong:
        with pytest.raises(DeviceError, match="gives a 8x8 .* reports N-OST-16x16.*fix the size"):
            wrong.identify()


def test_connect_disconnect_and_read_back(ocs: PolatisOcs, emu: OcsEmulator) -> None:
    assert ocs.connections() == {}
    ocs.connect({2: 18, 1: 17})
    assert ocs.connections() == {1: 17, 2: 18} == emu.connections
    assert (ocs.partner(1), ocs.partner(18), ocs.partner(3)) == (17, 2, None)
    ocs.disconnect([1])
    assert ocs.connections() == {2: 18}
    ocs.apply({3: 19, 4: 20})
    assert ocs.connections() == {3: 19, 4: 20}
    ocs.apply({})
    assert ocs.connections() == {}
    ocs.connect({5: 21})
    ocs.disconnect_all()
    assert emu.connections == {} and ocs.errors() == []


def test_adding_onto_a_port_in_use_is_refused_and_changes_nothing(ocs: PolatisOcs) -> None:
    ocs.connect({1: 17})
    with pytest.raises(OcsCommandError) as err:
        ocs.connect({1: 18})
    assert [e.code for e in err.value.errors] == [-221]
    assert "already connected" in str(err.value) and "apply()" in str(err.value)
    assert ocs.connections() == {1: 17}


def test_settings_wait_for_the_switching_time_beyond_the_reply_timeout(resource: str,
                                                                        emu: OcsEmulator) -> None:
    emu.switch.switch_s = 0.1  # 16 connections: 1.6 s, longer than the 1 s reply timeout
    with PolatisOcs.open(resource, name="ocs0", timeout=1.0, switch_s=0.3) as ocs:
        table = {i: 16 + i for i in range(1, 17)}
        assert ocs.apply_verified(table) == table
        assert ocs.last_switch_s is not None and ocs.last_switch_s >= 16 * 0.1 * 0.99


# ----- the verified transaction --------------------------------------------------------------

BEFORE = {1: 17, 2: 18}
TARGET = {1: 19, 3: 20, 5: 21}


def test_apply_verified_applies_and_reads_back(ocs: PolatisOcs, emu: OcsEmulator) -> None:
    ocs.apply(BEFORE)
    assert ocs.apply_verified(TARGET) == TARGET == emu.connections


def test_a_failed_port_rolls_the_transaction_back(ocs: PolatisOcs, emu: OcsEmulator) -> None:
    ocs.apply(BEFORE)
    emu.fail_port(21)
    with pytest.raises(OcsTransactionError) as err:
        ocs.apply_verified(TARGET)
    message = str(err.value)
    assert "ingress port 5" in message and "port 21 is failed" in message, message
    assert "serviced" in message and "Hardware error" in message
    assert err.value.restored and err.value.mismatches == {5: (21, None)}
    assert "restored the previous table" in err.value.report[0]
    assert emu.connections == BEFORE == ocs.connections()


def test_a_silent_misroute_is_caught_by_the_read_back(ocs: PolatisOcs, emu: OcsEmulator) -> None:
    ocs.apply(BEFORE)
    emu.inject(misroute_next=1)
    with pytest.raises(OcsTransactionError) as err:
        ocs.apply_verified(TARGET)
    assert err.value.restored and err.value.mismatches == {5: (21, None)}
    assert "ingress port 5 reads back not connected, expected to 21" in str(err.value)
    assert emu.connections == BEFORE


def on_connect_only(emu: OcsEmulator, monkeypatch: pytest.MonkeyPatch,
                    act: Callable[[], bool]) -> None:
    """Run `act` when the next ``CONN:ONLY`` line reaches the emulator; the line is lost
    (not executed) when `act` returns False."""
    handle = emu.handle_line
    armed = [True]

    def handle_line(line: str) -> list[Answer]:
        if armed[0] and line.upper().startswith(":OXC:SWIT:CONN:ONLY"):
            armed[0] = False
            if not act():
                return []
        return handle(line)

    monkeypatch.setattr(emu, "handle_line", handle_line)


def test_a_lost_command_is_caught_by_the_read_back(ocs: PolatisOcs, emu: OcsEmulator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    ocs.apply(BEFORE)
    on_connect_only(emu, monkeypatch, lambda: False)  # *OPC? and the error queue answer
    with pytest.raises(OcsTransactionError) as err:
        ocs.apply_verified(TARGET)
    assert err.value.restored and set(err.value.mismatches) == {1, 2, 3, 5}
    assert emu.connections == BEFORE


def test_a_lost_answer_before_the_transaction_changes_nothing(ocs: PolatisOcs,
                                                              emu: OcsEmulator) -> None:
    ocs.apply(BEFORE)
    emu.inject(no_answer=1)  # the read of the table to record
    with pytest.raises(ProtocolError, match="answered 0 lines"):
        ocs.apply_verified(TARGET)
    assert emu.connections == BEFORE == ocs.connections()


def test_a_garbled_completion_rolls_back_after_reconnecting(ocs: PolatisOcs, emu: OcsEmulator,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    ocs.apply(BEFORE)
    def garble_the_completion() -> bool:  # the next answer is *OPC?'s
        emu.inject(garbage=1)
        return True

    on_connect_only(emu, monkeypatch, garble_the_completion)
    with pytest.raises(OcsTransactionError) as err:
        ocs.apply_verified(TARGET)
    assert "garbled" in str(err.value) and err.value.restored
    assert emu.connections == BEFORE == ocs.connections()


def test_a_table_that_cannot_be_restored_says_so_and_names_the_port(ocs: PolatisOcs,
                                                                    emu: OcsEmulator) -> None:
    ocs.apply(BEFORE)
    emu.fail_port(2)  # holds its connection, but could not be connected again
    emu.fail_port(21)
    with pytest.raises(OcsTransactionError) as err:
        ocs.apply_verified(TARGET)
    assert not err.value.restored
    assert "COULD NOT RESTORE" in str(err.value) and "ingress port 2" in str(err.value)
    assert emu.connections == {1: 17}


# ----- ports and light ------------------------------------------------------------------------

def test_port_power_follows_the_light(ocs: PolatisOcs, emu: OcsEmulator) -> None:
    emu.set_input_dbm(1, -2.0)
    ocs.connect({1: 17})  # returns once *OPC? says the connection is made
    assert ocs.port_power([1, 17, 18]) == {1: -2.0, 17: -3.5, 18: -60.0}
    ocs.disable_ports([17])
    assert ocs.port_power([17]) == {17: -60.0}
    assert ocs.port_flags([1, 17]) == {1: PortFlag.ENABLED, 17: PortFlag.DISABLED}
    ocs.enable_ports([17])
    assert ocs.port_power([17]) == {17: -3.5}


def test_port_states_in_sonic_terms(ocs: PolatisOcs, emu: OcsEmulator) -> None:
    ocs.connect({1: 17})
    ocs.disable_ports([2])
    emu.fail_port(3)
    states = ocs.port_states()
    assert len(states) == 32
    assert (states[1], states[17], states[2], states[3], states[4]) == (
        PortState.TUNED, PortState.TUNED, PortState.BLOCKED, PortState.FAILED,
        PortState.BLOCKED)


def test_power_of_many_ports_is_read_256_at_a_time() -> None:
    emu = OcsEmulator(130, switch_s=0.0)
    emu.set_input_dbm(7, -1.0)
    with TcpEmulatorServer(ocs_connection_handler(emu), name="ocs-emu") as server:
        with PolatisOcs.open("{}:{}".format(*server.address), timeout=TIMEOUT) as ocs:
            assert ocs.size == 130
            before = emu.lines_handled
            powers = ocs.port_power(range(1, 261))
            assert len(powers) == 260 and powers[7] == -1.0 and powers[8] == -60.0
            assert emu.lines_handled - before == 2 * 2  # two queries, each with :SYST:ERR?


# ----- timeouts and restarts ---------------------------------------------------------------------

def test_no_answer_is_a_timeout_and_the_link_recovers(resource: str, emu: OcsEmulator) -> None:
    with PolatisOcs.open(resource, name="ocs0", timeout=1.0) as ocs:
        ocs.connect({1: 17})
        emu.inject(no_answer_always=True)
        with pytest.raises(DeviceTimeout) as err:
            ocs.connections()
        assert "ocs0" in str(err.value) and "reachable at 127.0.0.1:" in str(err.value)
        emu.inject(no_answer_always=False)
        assert ocs.connections() == {1: 17}


def test_the_connections_survive_a_restart_of_the_switch_controller(ocs: PolatisOcs,
                                                                   emu: OcsEmulator) -> None:
    ocs.apply(BEFORE)
    emu.inject(reset_next=True)  # drops the session; the optics hold
    with pytest.raises(DeviceError):
        ocs.connections()
    assert ocs.connections() == BEFORE  # reconnected
