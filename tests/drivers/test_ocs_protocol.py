"""The OCS codec (drivers/ocs_protocol.py) and the SCPI session (drivers/ocs_link.py) on a
scripted wire: every byte the driver writes, every reply it must read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import ScriptedWire

from oddl.common.errors import ConfigError, DeviceTimeout, ProtocolError
from oddl.common.tracing import TRACE
from oddl.drivers.ocs import PolatisOcs, socket_url
from oddl.drivers.ocs_link import OcsCommandError
from oddl.drivers.ocs_protocol import (
    InvalidConnectionTable,
    OcsGeometry,
    PortFlag,
    PortState,
    ScpiErrorEntry,
    format_channel_list,
    format_connections,
    parse_channel_list,
    parse_error,
    parse_identity,
    parse_port_flags,
    parse_port_reply,
    parse_powers,
    parse_size,
    parse_state,
    port_state,
    split_top_level,
)

OK = b'0,"No error"\r\n'
FRESH = (b":SYST:ERR?\n", OK)
"""The first exchange of a session drains errors an earlier session left."""
SIXTEEN = OcsGeometry(16, 16)


def ocs(*pairs: tuple[bytes, bytes | None], geometry: OcsGeometry | None = SIXTEEN
        ) -> tuple[PolatisOcs, ScriptedWire]:
    wire = ScriptedWire(pairs, name="wire")
    return PolatisOcs(wire, "ocs-t", geometry=geometry, timeout=0.2, resync_quiet=0.01), wire


# ----- channel lists and replies -------------------------------------------------------------

def test_channel_lists_round_trip() -> None:
    assert format_channel_list([1, 2, 3]) == "(@1,2,3)"
    assert format_channel_list([]) == "(@)"
    assert parse_channel_list("(@1,2,3)") == [1, 2, 3]
    assert parse_channel_list("(@)") == []
    assert parse_channel_list("(@ 1, 2 , 3 )") == [1, 2, 3]  # spaces: a published client's form
    assert parse_channel_list("(@1:4,9)") == [1, 2, 3, 4, 9]  # SCPI ranges
    assert parse_channel_list("(@4:2)") == [4, 3, 2]


@pytest.mark.parametrize("text", ["1,2", "(1,2)", "(@1,,2)", "(@a)", "(@1:)", "@1"])
def test_bad_channel_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_channel_list(text)


def test_split_top_level_keeps_channel_lists_whole() -> None:
    assert split_top_level("(@1,2),(@17,18)") == ["(@1,2)", "(@17,18)"]
    assert split_top_level("(@),(@)") == ["(@)", "(@)"]


def test_connections_are_formatted_by_ingress() -> None:
    assert (format_connections(":OXC:SWIT:CONN:ADD", {3: 20, 1: 17})
            == ":OXC:SWIT:CONN:ADD (@1,3),(@17,20)")


def test_state_replies() -> None:
    assert parse_state("(@1,2,3),(@19,18,22)") == {1: 19, 2: 18, 3: 22}
    assert parse_state("(@),(@)") == {}
    for bad in ("(@1,2),(@17)", "(@1,1),(@17,18)", "(@1)", "garbage", ""):
        with pytest.raises(ProtocolError):
            parse_state(bad, device="x")


def test_port_replies() -> None:
    assert parse_port_reply('"18"') == 18
    assert parse_port_reply('""') is None
    assert parse_port_reply("") is None
    assert parse_port_reply("18") == 18
    assert parse_port_reply('"0"') is None
    assert parse_port_reply("(@18)") == 18
    with pytest.raises(ProtocolError):
        parse_port_reply('"eighteen"')


def test_error_entries() -> None:
    assert parse_error('-222,"Data out of range"') == ScpiErrorEntry(-222, "Data out of range")
    assert parse_error('+0,"No error"').code == 0
    assert parse_error('0, "No error"').code == 0
    assert str(ScpiErrorEntry(-221, "Settings conflict")) == '-221,"Settings conflict"'
    with pytest.raises(ProtocolError):
        parse_error("1")


def test_identity_carries_the_size_in_the_model_code() -> None:
    identity, geometry = parse_identity("Polatis,N-OST-24x24-LA1-DMHNS,002414,6.5.2.18")
    assert (identity.manufacturer, identity.model, identity.serial_number) == (
        "Polatis", "N-OST-24x24-LA1-DMHNS", "002414")
    assert identity.extra == (("firmware", "6.5.2.18"),) and geometry == OcsGeometry(24, 24)
    _, big = parse_identity("Polatis,N-VST-192x192-LU1-DMHNV-801,001310,5.1.9.18-2.3.1")
    assert big == OcsGeometry(192, 192) and big.egress == range(193, 385)
    assert parse_identity("Polatis,Series 6000,1,2")[1] is None
    with pytest.raises(ProtocolError):
        parse_identity("Polatis")


def test_size_powers_and_flags() -> None:
    assert parse_size("16,16") == SIXTEEN
    assert parse_powers("(-3.50,-60.00)", 2) == [-3.5, -60.0]
    assert parse_powers("-3.5", 1) == [-3.5]
    assert parse_port_flags("(E,D,F)", 3) == [PortFlag.ENABLED, PortFlag.DISABLED,
                                              PortFlag.FAILED]
    for call in (lambda: parse_size("16"), lambda: parse_powers("(-3.5)", 2),
                 lambda: parse_powers("(nan)", 1), lambda: parse_port_flags("(E,X)", 2)):
        with pytest.raises(ProtocolError):
            call()


def test_sonic_port_states() -> None:
    assert port_state(PortFlag.ENABLED, True) is PortState.TUNED
    assert port_state(PortFlag.ENABLED, False) is PortState.BLOCKED
    assert port_state(PortFlag.DISABLED, True) is PortState.BLOCKED
    assert port_state(PortFlag.FAILED, True) is PortState.FAILED


# ----- checks before sending -------------------------------------------------------------------

@pytest.mark.parametrize(("table", "words"), [
    ({0: 17}, ["port 0", "1..32"]),
    ({33: 17}, ["port 33", "1..32"]),
    ({17: 1}, ["port 17 is an egress port", "swap"]),
    ({1: 2}, ["port 2 is an ingress port", "swap"]),
    ({1: 20, 2: 20}, ["egress port 20", "ingress 1 and 2", "drop one"]),
])
def test_bad_tables_are_refused_before_anything_is_sent(table: dict[int, int],
                                                        words: list[str]) -> None:
    switch, wire = ocs()  # the empty script fails any write
    for call in (switch.apply, switch.apply_verified, switch.connect):
        with pytest.raises(InvalidConnectionTable) as err:
            call(table)
        assert all(w in str(err.value) for w in words), str(err.value)
    wire.assert_all_consumed()


def test_bad_ports_are_refused_before_anything_is_sent() -> None:
    switch, wire = ocs()
    with pytest.raises(InvalidConnectionTable, match="port 20 is an egress port"):
        switch.disconnect([1, 20])
    with pytest.raises(InvalidConnectionTable, match="listed twice"):
        switch.port_power([1, 1])
    with pytest.raises(InvalidConnectionTable, match="port 40 does not exist"):
        switch.partner(40)
    wire.assert_all_consumed()


def test_resource_strings() -> None:
    assert socket_url("TCPIP0::10.0.3.6::5025::SOCKET") == "socket://10.0.3.6:5025"
    assert socket_url("ocs.lab:6000") == "socket://ocs.lab:6000"
    assert socket_url("ocs.lab") == "socket://ocs.lab:5025"
    assert socket_url("socket://h:1") == "socket://h:1"
    with pytest.raises(ConfigError, match="SOCKET"):
        socket_url("TCPIP0::10.0.3.6::inst0::INSTR")


# ----- the session on the wire ------------------------------------------------------------------

def test_a_setting_waits_for_opc_and_reads_the_error_queue_in_one_write() -> None:
    switch, wire = ocs(FRESH, (b":OXC:SWIT:CONN:ADD (@1,2),(@17,18)\n*OPC?\n:SYST:ERR?\n",
                               b"1\r\n" + OK))
    switch.connect({2: 18, 1: 17})
    wire.assert_all_consumed()
    assert switch.last_switch_s is not None


def test_a_refused_setting_names_the_error_and_the_fix() -> None:
    switch, wire = ocs(FRESH, (b":OXC:SWIT:CONN:ADD (@1),(@17)\n*OPC?\n:SYST:ERR?\n",
                               b'1\r\n-221,"Settings conflict"\r\n'),
                       (b":SYST:ERR?\n", b'-222,"Data out of range"\r\n'),
                       (b":SYST:ERR?\n", OK))
    with pytest.raises(OcsCommandError) as err:
        switch.connect({1: 17})
    assert [e.code for e in err.value.errors] == [-221, -222]
    assert "already connected" in str(err.value) and "ocs-t" in str(err.value)
    wire.assert_all_consumed()


def test_a_query_is_answered_before_the_error_queue() -> None:
    switch, wire = ocs(FRESH, (b":OXC:SWIT:CONN:STAT?\n:SYST:ERR?\n", b"(@1),(@17)\r\n" + OK),
                       (b":OXC:SWIT:CONN:PORT? 17\n:SYST:ERR?\n", b'"1"\r\n' + OK))
    assert switch.connections() == {1: 17}
    assert switch.partner(17) == 1
    wire.assert_all_consumed()


def test_a_refused_query_comes_back_at_once_as_an_error() -> None:
    switch, wire = ocs(FRESH, (b":OXC:SWIT:CONN:STAT?\n:SYST:ERR?\n",
                               b'-113,"Undefined header"\r\n'), (b":SYST:ERR?\n", OK))
    with pytest.raises(OcsCommandError, match="does not know this command"):
        switch.connections()
    wire.assert_all_consumed()


def test_the_size_comes_from_the_model_code_else_from_size_query() -> None:
    switch, wire = ocs(FRESH, (b"*IDN?\n:SYST:ERR?\n",
                               b"Polatis,N-OST-8x8-LA1-DMHNS,1,2\r\n" + OK), geometry=None)
    assert switch.size == 8 and switch.geometry.egress == range(9, 17)
    wire.assert_all_consumed()
    other, wire = ocs(FRESH, (b"*IDN?\n:SYST:ERR?\n", b"Polatis,OST,1,2\r\n" + OK),
                      (b":OXC:SWIT:SIZE?\n:SYST:ERR?\n", b"4,8\r\n" + OK), geometry=None)
    assert other.geometry == OcsGeometry(4, 8)
    wire.assert_all_consumed()


def test_a_configured_size_the_switch_contradicts_is_an_error() -> None:
    switch, wire = ocs(FRESH, (b"*IDN?\n:SYST:ERR?\n",
                               b"Polatis,N-OST-24x24-LA1-DMHNS,1,2\r\n" + OK))
    with pytest.raises(Exception, match="fix the size in the testbed file"):
        switch.identify()
    wire.assert_all_consumed()


def test_no_answer_is_a_timeout_naming_the_switch_and_what_to_check() -> None:
    switch, wire = ocs(FRESH, (b":OXC:SWIT:CONN:STAT?\n:SYST:ERR?\n", None))
    with pytest.raises(DeviceTimeout) as err:
        switch.connections()
    assert "ocs-t" in str(err.value) and "reachable" in str(err.value)
    wire.assert_all_consumed()


def test_garbage_resynchronises_before_the_next_exchange() -> None:
    switch, wire = ocs(FRESH, (b":OXC:SWIT:CONN:STAT?\n:SYST:ERR?\n", b"\xff\xfe\r\n" + OK),
                       (b":OXC:SWIT:CONN:STAT?\n:SYST:ERR?\n", b"(@),(@)\r\n" + OK))
    with pytest.raises(ProtocolError, match="garbled"):
        switch.connections()
    assert switch.connections() == {}
    assert wire.resets == 1
    wire.assert_all_consumed()


def test_every_command_is_on_the_trace(tmp_path: Path) -> None:
    switch, wire = ocs(FRESH, (b":OXC:SWIT:CONN:ADD (@1),(@17)\n*OPC?\n:SYST:ERR?\n",
                               b"1\r\n" + OK),
                       (b":OXC:SWIT:CONN:STAT?\n:SYST:ERR?\n", b"(@1),(@17)\r\n" + OK))
    TRACE.start(tmp_path, "ocs-test")
    try:
        switch.connect({1: 17})
        switch.connections()
    finally:
        path = TRACE.stop()
    assert path is not None
    doc = json.loads(path.read_text(encoding="utf-8"))
    commands = [e["args"]["command"] for e in doc["traceEvents"] if e.get("cat") == "device"]
    assert "ocs :OXC:SWIT:CONN:ADD (@1),(@17)" in commands
    assert "ocs :OXC:SWIT:CONN:STAT?" in commands
    wire.assert_all_consumed()
