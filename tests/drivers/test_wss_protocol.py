"""Protocol tests for the flexgrid WSS driver: validation and exact bytes, no hardware (the
codec and checksum framing: test_wss_codec)."""

from __future__ import annotations

import pytest
from fakes import ScriptedWire

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError, SafetyLimitError
from oddl.drivers.interfaces import BLOCKED_DB, DeviceIdentity, Route, WavelengthSelectiveSwitch
from oddl.drivers.wss import ERROR_FIXES, FlexgridWss, WssCommandError
from oddl.drivers.wss_codec import InvalidRouteTable, WssLimits
from oddl.drivers.wss_protocol import WssErrorCode, frame


def ok(command: bytes, *result: bytes) -> tuple[bytes, bytes]:
    """A (sent, reply) pair for a command that succeeds: echo, result lines, OK."""
    reply = command + b"\r\n" + b"".join(r + b"\r\n" for r in result) + b"OK\r\n"
    return command + b"\r\n", reply


def make(script: list[tuple[bytes, bytes]], **kw: object) -> tuple[FlexgridWss, ScriptedWire]:
    link = ScriptedWire(script)
    return FlexgridWss(link, name="wss-a", resync_quiet=0.0, **kw), link  # type: ignore[arg-type]


# --- validation (nothing sent) --------------------------------------------------------------------

@pytest.mark.parametrize("table, match", [
    ({}, "empty"),
    ({0: Route(1, 0.0)}, "channel 0"),
    ({49: Route(1, 0.0)}, "channel 49"),
    ({True: Route(1, 0.0)}, "not an integer"),
    ({1: Route(5, 0.0)}, "out-port 5"),
    ({1: Route(-1, 0.0)}, "out-port -1"),
    ({1: Route(0, 0.0)}, "out-port 0 is outside 1..4; use 99"),
    ({1: Route(98, 0.0)}, "out-port 98"),
    ({1: Route(1, -0.5)}, "attenuation -0.5"),
    ({1: Route(1, 25.1)}, "attenuation 25.1"),
    ({1: Route(1, 50.0)}, "attenuation 50.0"),
    ({1: Route(1, 3.14)}, "0.1 dB grid"),
    ({1: Route(1, float("nan"))}, "not a number"),
    ({1: (1, 0.0)}, "not a Route"),
])
def test_stage_rejects_bad_tables_before_sending(table: dict, match: str) -> None:
    wss, link = make([])
    with pytest.raises(InvalidRouteTable, match=match) as info:
        wss.stage(table)
    assert isinstance(info.value, SafetyLimitError)
    link.assert_all_consumed()


def test_limits_are_configurable() -> None:
    wss, link = make([ok(b"URA 96,8,30.0")],
                     limits=WssLimits(channels=96, ports=8, max_attenuation_db=30.0))
    wss.stage({96: Route(8, 30.0)})
    link.assert_all_consumed()


def test_factory_limits_number_channels_from_0() -> None:
    wss, link = make([ok(b"URA 0,1,0.0;95,99,99.9")], limits=WssLimits.factory())
    wss.stage({0: Route(1, 0.0), 95: Route(99, BLOCKED_DB)})
    with pytest.raises(InvalidRouteTable, match="channel 96 is outside 0..95"):
        wss.stage({96: Route(1, 0.0)})
    link.assert_all_consumed()


def test_port_99_is_accepted_with_any_attenuation() -> None:
    wss, link = make([ok(b"URA 3,99,0.0;4,99,99.9")])
    wss.stage({3: Route(99, 0.0), 4: Route(99, BLOCKED_DB)})
    link.assert_all_consumed()


# --- exact bytes of driver operations -------------------------------------------------------------

def test_driver_satisfies_the_interface() -> None:
    wss, _ = make([])
    assert isinstance(wss, WavelengthSelectiveSwitch)


def test_identify_sends_sno_then_mfd() -> None:
    wss, link = make([ok(b"SNO?", b"WSS-0042"), ok(b"MFD?", b"2019-07-03")])
    ident = wss.identify()
    assert ident == DeviceIdentity("wss", "Finisar/II-VI", "flexgrid WSS (ASCII serial)",
                                   "WSS-0042", (("manufacture_date", "2019-07-03"),))
    link.assert_all_consumed()


def test_stage_sends_one_ura_line() -> None:
    wss, link = make([ok(b"URA 52,3,0.0;53,3,0.0;54,3,99.9")], limits=WssLimits(channels=96))
    wss.stage({53: Route(3, 0.0), 52: Route(3), 54: Route(3, BLOCKED_DB)})
    link.assert_all_consumed()


def test_apply_sends_rsw_and_waits_for_ok() -> None:
    wss, link = make([ok(b"RSW")])
    wss.apply(timeout=2.0)
    assert wss.last_settle_s is not None and wss.last_settle_s >= 0
    link.assert_all_consumed()


def test_read_active_parses_rra() -> None:
    wss, link = make([ok(b"RRA?", b"1,2,0.0;2,99,99.9;3,4,7.5")])
    assert wss.read_active() == {1: Route(2, 0.0), 2: Route(99, BLOCKED_DB), 3: Route(4, 7.5)}
    link.assert_all_consumed()


def test_read_active_joins_a_multi_line_rra() -> None:
    wss, link = make([ok(b"RRA?", b"0,1,0.0;1,2,0.0", b"2,99,99.9;3,4,7.5", b"4,99,0.0")])
    assert wss.read_active() == {0: Route(1, 0.0), 1: Route(2, 0.0), 2: Route(99, BLOCKED_DB),
                                 3: Route(4, 7.5), 4: Route(99, 0.0)}
    link.assert_all_consumed()


def test_read_active_of_an_empty_plan() -> None:
    wss, link = make([ok(b"RRA?")])
    assert wss.read_active() == {}
    link.assert_all_consumed()


def test_uca_routes_and_switches_in_one_command() -> None:
    wss, link = make([ok(b"UCA 1,1,0.0;2,99,99.9")])
    wss.update_and_switch({2: Route(99, BLOCKED_DB), 1: Route(1, 0.0)}, timeout=2.0)
    assert wss.last_settle_s is not None
    link.assert_all_consumed()


def test_flexgrid_commands_exact_bytes() -> None:
    wss, link = make([ok(b"CHW 0"), ok(b"DCC 1=67:74;2=155:162"), ok(b"CHW?", b"0"),
                      ok(b"DCC?", b"1=67:74;2=155:162"), ok(b"UCA 1,1,0.0;2,1,0.0")])
    wss.set_channel_width(0)
    wss.define_channels({2: (155, 162), 1: (67, 74)})
    assert wss.channel_width() == 0
    assert wss.read_channel_plan() == {1: (67, 74), 2: (155, 162)}
    wss.update_and_switch({1: Route(1, 0.0), 2: Route(1, 0.0)})
    link.assert_all_consumed()


@pytest.mark.parametrize("plan", [{}, {0: (1, 2)}, {1: (0, 2)}, {1: (5, 4)}])
def test_define_channels_refuses_bad_plans_before_sending(plan: dict) -> None:
    wss, link = make([])
    with pytest.raises(InvalidRouteTable):
        wss.define_channels(plan)
    link.assert_all_consumed()


def test_restart_sends_res_and_waits_for_the_module() -> None:
    wss, link = make([ok(b"RES"), (b"SNO?\r\n", b""), ok(b"SNO?", b"SN1")])
    wss.restart(timeout=5.0)
    assert link.resets == 1  # the unanswered SNO? was drained before the next try
    link.assert_all_consumed()


def test_restart_without_ok_still_waits_for_the_module() -> None:
    wss, link = make([(b"RES\r\n", b"RES\r\n"), ok(b"SNO?", b"SN1")])
    wss.restart(timeout=5.0)
    link.assert_all_consumed()


def test_checksum_mode_frames_commands_and_checks_replies() -> None:
    f = lambda t: frame(t).encode()  # noqa: E731
    wss, link = make([
        (f("RRA?") + b"\r\n", f("RRA?") + b"\r\n" + f("1,2,0.0") + b"\r\n" + f("OK") + b"\r\n"),
        (f("RSW") + b"\r\n", f("RSW") + b"\r\n^OK$FF66\r\n"),
    ], checksum=True)
    assert wss.read_active() == {1: Route(2, 0.0)}
    wss.apply()
    link.assert_all_consumed()


def test_checksum_mode_refuses_a_bad_or_missing_frame() -> None:
    f = lambda t: frame(t).encode()  # noqa: E731
    wss, link = make([
        (f("RSW") + b"\r\n", f("RSW") + b"\r\n^OK$FF67\r\n"),
        (f("RSW") + b"\r\n", f("RSW") + b"\r\nOK\r\n"),
    ], checksum=True)
    with pytest.raises(ProtocolError, match="checksum"):
        wss.apply()
    with pytest.raises(ProtocolError, match="not framed"):
        wss.apply()
    link.assert_all_consumed()


def test_module_without_echo() -> None:
    wss, link = make([(b"SNO?\r\n", b"SN7\r\nOK\r\n"), (b"MFD?\r\n", b"2020\r\nOK\r\n")],
                     echo=False)
    assert wss.identify().serial_number == "SN7"
    link.assert_all_consumed()


def test_block_keeps_the_last_staged_port() -> None:
    wss, link = make([ok(b"URA 7,3,4.0"), ok(b"URA 7,3,99.9"), ok(b"RSW")])
    wss.stage({7: Route(3, 4.0)})
    wss.block(7)
    link.assert_all_consumed()


def test_block_of_unknown_channel_uses_port_99() -> None:
    wss, link = make([ok(b"URA 9,99,99.9"), ok(b"RSW")])
    wss.block(9)
    link.assert_all_consumed()


# --- errors and recovery --------------------------------------------------------------------------

def test_error_reply_raises_command_error_naming_device_command_and_fix() -> None:
    wss, link = make([
        (b"URA 5,1,0.0\r\n", b"URA 5,1,0.0\r\nRER\r\n"),
        ok(b"SNO?", b"X"),
        ok(b"MFD?", b"Y"),
    ])
    with pytest.raises(WssCommandError) as info:
        wss.stage({5: Route(1, 0.0)})
    err = info.value
    assert err.code == WssErrorCode.RER and err.device == "wss-a"
    assert err.command == "URA (1 channel)"
    assert "wss-a" in str(err) and "range error" in str(err) and "ports 1..P or 99" in str(err)
    assert wss.identify().serial_number == "X"  # still in step: no resync needed
    assert link.resets == 0
    link.assert_all_consumed()


@pytest.mark.parametrize("code", list(WssErrorCode))
def test_every_error_reply_has_its_fix(code: WssErrorCode) -> None:
    wss, link = make([(b"RSW\r\n", b"RSW\r\n" + code.value.encode() + b"\r\n")])
    with pytest.raises(WssCommandError) as info:
        wss.apply()
    assert info.value.code == code and ERROR_FIXES[code] in str(info.value)
    link.assert_all_consumed()


def test_error_reply_without_echo_is_still_an_error() -> None:
    wss, link = make([(b"RSW\r\n", b"VER\r\n")])
    with pytest.raises(WssCommandError, match="validation error"):
        wss.apply()
    link.assert_all_consumed()


def test_error_instead_of_result_line() -> None:
    wss, link = make([(b"RRA?\r\n", b"RRA?\r\nCER\r\n")])
    with pytest.raises(WssCommandError, match="command error"):
        wss.read_active()
    link.assert_all_consumed()


def test_framed_error_reply() -> None:
    wss, link = make([(frame("CHW 7").encode() + b"\r\n",
                       frame("CHW 7").encode() + b"\r\n^RER$FF17\r\n")], checksum=True)
    with pytest.raises(WssCommandError, match="range error"):
        wss.set_channel_width(7)
    link.assert_all_consumed()


def test_no_answer_raises_timeout_then_driver_resyncs() -> None:
    wss, link = make([(b"SNO?\r\n", b""), ok(b"SNO?", b"S1"), ok(b"MFD?", b"D1")])
    with pytest.raises(DeviceTimeout, match="wss-a: SNO\\?"):
        wss.identify()
    assert wss.identify().serial_number == "S1"
    assert link.resets == 1
    link.assert_all_consumed()


def test_garbage_raises_protocol_error_and_next_command_works() -> None:
    wss, link = make([
        (b"RRA?\r\n", b"\xfe\x13\x80zz\r\n\x81\x82\r\n"),
        ok(b"RRA?", b"1,1,0.0"),
    ])
    with pytest.raises(ProtocolError, match="garbled"):
        wss.read_active()
    assert wss.read_active() == {1: Route(1, 0.0)}  # the second garbage line was drained
    link.assert_all_consumed()


def test_late_ok_after_resync_is_dropped_before_the_echo() -> None:
    wss, link = make([
        (b"RSW\r\n", b"RSW\r\n"),  # the settled OK does not come in time
        (b"RRA?\r\n", b"OK\r\nRRA?\r\n1,1,0.0\r\nOK\r\n"),  # ...but before the next echo
    ])
    with pytest.raises(DeviceTimeout, match="RSW: no 'OK' \\(switch settled\\)"):
        wss.apply(timeout=0.01)
    assert wss.read_active() == {1: Route(1, 0.0)}
    link.assert_all_consumed()


def test_stale_lines_are_bounded_after_resync() -> None:
    wss, link = make([(b"SNO?\r\n", b""), (b"SNO?\r\n", b"OK\r\n" * 9 + b"SNO?\r\n")])
    with pytest.raises(DeviceTimeout):
        wss.identify()
    with pytest.raises(ProtocolError, match="expected the echo"):
        wss.identify()
    link.reset_input()
    link.assert_all_consumed()


def test_wrong_echo_is_a_protocol_error() -> None:
    wss, link = make([(b"RSW\r\n", b"OK\r\n")])
    with pytest.raises(ProtocolError, match="echo"):
        wss.apply()
    link.assert_all_consumed()


def test_malformed_rra_result_is_a_protocol_error() -> None:
    wss, link = make([ok(b"RRA?", b"1,1")])
    with pytest.raises(ProtocolError, match="RRA"):
        wss.read_active()
    link.assert_all_consumed()


def test_missing_result_line_is_a_protocol_error() -> None:
    wss, link = make([(b"SNO?\r\n", b"SNO?\r\nOK\r\n")])
    with pytest.raises(ProtocolError, match="without a result"):
        wss.identify()
    link.assert_all_consumed()


def test_unexpected_final_line_is_a_protocol_error() -> None:
    wss, link = make([(b"RSW\r\n", b"RSW\r\nDONE\r\n")])
    with pytest.raises(ProtocolError, match="expected 'OK'"):
        wss.apply()
    link.assert_all_consumed()


def test_close_releases_link_and_sends_nothing() -> None:
    wss, link = make([])
    with wss:
        pass
    assert link.closed
    with pytest.raises(DeviceError, match="closed"):
        wss.read_active()
    wss.close()  # idempotent
    link.assert_all_consumed()
