"""The exact bytes of ITLA driver operations against a scripted link (codec: test_itla_frames)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from fakes import FakeClock, ScriptedWire

from oddl.common.errors import DeviceError, DeviceTimeout, ProtocolError, SafetyLimitError
from oddl.drivers.interfaces import TunableTransceiver
from oddl.drivers.itla import ItlaDriver
from oddl.drivers.itla_frames import Status, encode_reply, encode_request
from oddl.drivers.itla_registers import ItlaExecutionError, register


def scripted_link(script: Iterable[tuple[str, str | None]]) -> ScriptedWire:
    """A scripted transport from hex frames: (request sent, reply or None for silence)."""
    return ScriptedWire([(bytes.fromhex(sent), None if reply is None else bytes.fromhex(reply))
                         for sent, reply in script])


def make_driver(script: Iterable[tuple[str, str | None]], *, poll: float = 0.01,
                clock: FakeClock | None = None) -> tuple[ItlaDriver, ScriptedWire]:
    link = scripted_link(script)
    clk = clock or FakeClock(100.0)
    drv = ItlaDriver(link, name="laser0", poll_interval_s=poll, clock=clk, sleep=clk.sleep)
    return drv, link


LIMITS = [  # LFL 193.1 THz, LFH 197.8 THz, OPSL 6.00, OPSH 13.50 dBm, LGrid 6.25 GHz, FTFR 6 GHz
    ("70 52 00 00", "a0 52 00 c1"), ("60 53 00 00", "30 53 03 e8"),
    ("f0 69 00 00", "f0 69 00 00"), ("10 54 00 00", "80 54 00 c5"),
    ("00 55 00 00", "a0 55 1f 40"), ("c0 6a 00 00", "c0 6a 00 00"),
    ("50 50 00 00", "a0 50 02 58"), ("40 51 00 00", "30 51 05 46"),
    ("30 56 00 00", "e0 56 00 3e"), ("d0 6b 00 00", "c0 6b 00 32"),
    ("b0 4f 00 00", "a0 4f 17 70"),
]
LOCKED = [("20 20 00 00", "20 20 00 00"), ("30 21 00 00", "30 21 00 00"),
          ("00 00 00 00", "10 00 00 10")]
"""status(): StatusF 0, StatusW 0, NOP = MRDY: output on, nothing pending, no alarm."""
READY = ("00 00 00 00", "10 00 00 10")
"""NOP: MRDY, nothing pending."""
LOCKED_W = ("30 21 00 00", "30 21 00 00")
"""StatusW 0: output on (no DIS), on frequency (no WFREQ)."""
RESYNC_SILENT = [("00", None)] * 4
"""Four single NOP bytes that get no answer: the module is not there."""


# --- driver operations, byte for byte ------------------------------------------------------------

def test_driver_satisfies_the_transceiver_interface() -> None:
    drv, _ = make_driver([])
    assert isinstance(drv, TunableTransceiver)


def test_enable_output_sends_resena_and_polls_until_locked() -> None:
    drv, link = make_driver([
        ("81 32 00 08", "a3 32 00 08"),   # ResEna = SENA -> CP
        ("00 00 00 00", "23 00 01 00"),   # NOP: CP, enable pending
        READY,                            # NOP: OK, MRDY
        LOCKED_W,                         # StatusW: no DIS, no WFREQ
    ])
    drv.enable_output()
    link.assert_all_consumed()


def test_enable_output_on_a_module_that_answers_ok_at_once() -> None:
    drv, link = make_driver([("81 32 00 08", "90 32 00 08"), READY, LOCKED_W])
    drv.enable_output()
    link.assert_all_consumed()


def test_set_power_checks_limits_then_writes_pwr() -> None:
    drv, link = make_driver([*LIMITS, ("31 31 05 14", "20 31 05 14")])
    drv.set_power_dbm(13.0)
    with pytest.raises(SafetyLimitError, match="6.0..13.5"):
        drv.set_power_dbm(14.0)   # nothing sent: the script has no line for it
    link.assert_all_consumed()
    lim = drv.limits()
    assert (lim.min_thz, lim.max_thz, lim.min_grid_ghz, lim.fine_tune_mhz) == (
        193.1, 197.8, 6.25, 6000)


def test_execution_error_reads_nop_and_names_the_code() -> None:
    drv, link = make_driver([("91 31 07 d0", "31 31 00 00"),   # PWR = 20.00 dBm -> XE
                             ("00 00 00 00", "20 00 00 13")])  # NOP: MRDY, RVE
    with pytest.raises(ItlaExecutionError, match="RVE range error") as info:
        drv.link.write_register("PWR", 2000)
    assert info.value.error.code == 3 and info.value.device == "laser0"
    assert "limits()" in str(info.value)
    link.assert_all_consumed()


def test_bad_checksum_reply_is_fetched_again_with_lstrsp() -> None:
    drv, link = make_driver([("30 30 00 00", "00 30 00 05"),   # checksum nibble wrong
                             ("b8 30 00 00", "60 30 00 05")])  # LstRsp: resend last reply
    assert drv.link.read_register("Channel") == 5
    link.assert_all_consumed()


def test_ce_reply_resends_the_request_unchanged() -> None:
    drv, link = make_driver([("30 30 00 00", "b8 30 00 00"),   # CE: module saw a bad checksum
                             ("30 30 00 00", "60 30 00 05")])
    assert drv.link.read_register("Channel") == 5
    link.assert_all_consumed()


def test_stale_reply_for_another_register_is_skipped() -> None:
    drv, link = make_driver([("30 30 00 00", "70 31 03 e8 60 30 00 05")])
    assert drv.link.read_register("Channel") == 5
    link.assert_all_consumed()


def test_corrupt_replies_give_up_with_protocol_error() -> None:
    drv, link = make_driver([("30 30 00 00", "00 30 00 05"), ("b8 30 00 00", "00 30 00 05"),
                             ("b8 30 00 00", "00 30 00 05"),
                             # giving up, the driver leaves the link framed for the next command
                             ("00", None), ("00", None), ("00", None), ("00", "10 00 00 10")])
    with pytest.raises(ProtocolError, match="3 exchanges for read Channel failed"):
        drv.link.read_register("Channel")
    link.assert_all_consumed()


@pytest.mark.parametrize("reply", [None, "60 30"])
def test_silence_or_short_reply_is_a_timeout_naming_device_and_fix(reply: str | None) -> None:
    drv, link = make_driver([("30 30 00 00", reply), *RESYNC_SILENT])
    with pytest.raises(DeviceTimeout, match=r"laser0: no reply to read Channel .*nor to 4 single "
                       r"NOP bytes; check the cable"):
        drv.link.read_register("Channel")
    link.assert_all_consumed()


def test_read_string_through_aea_and_ear() -> None:
    ear = "b0 0b 00 00"
    drv, link = make_driver([("40 04 00 00", "f2 04 00 09"),   # SerNo -> AEA, 9 bytes
                             (ear, "30 0b 45 4d"), (ear, "40 0b 55 2d"), (ear, "b0 0b 30 30"),
                             (ear, "a0 0b 30 31"), (ear, "b0 0b 00 00")])
    assert drv.link.read_string("SerNo") == "EMU-0001"
    link.assert_all_consumed()


def test_read_only_register_is_refused_before_sending() -> None:
    drv, link = make_driver([])
    with pytest.raises(DeviceError, match="read-only; nothing was sent"):
        drv.link.write_register("LF1", 1)
    link.assert_all_consumed()


def test_configure_grid_refused_while_output_on() -> None:
    drv, link = make_driver([*LIMITS, ("10 32 00 00", "90 32 00 08")])  # ResEna reads SENA
    with pytest.raises(DeviceError, match=r"disable_output\(\) first"):
        drv.configure_grid(193.15, 50.0)
    link.assert_all_consumed()


def test_configure_grid_then_tune_measures_time_to_lock() -> None:
    drv, link = make_driver([
        *LIMITS,
        ("10 32 00 00", "10 32 00 00"),   # ResEna: output off
        ("51 62 00 00", "40 62 00 00"),   # FTF = 0
        ("a1 35 00 c1", "b0 35 00 c1"),   # FCF1 = 193 THz
        ("01 36 05 dc", "10 36 05 dc"),   # FCF2 = 1500 x 0.1 GHz
        ("01 67 00 00", "10 67 00 00"),   # FCF3 = 0 MHz
        ("c1 34 01 f4", "d0 34 01 f4"),   # GRID = 500 x 0.1 GHz
        ("11 66 00 00", "00 66 00 00"),   # GRID2 = 0 MHz
        ("21 65 00 00", "30 65 00 00"),   # ChannelH = 0 (absolute channel numbers)
        ("51 30 00 07", "73 30 00 07"),   # Channel = 7 -> CP (the output is on: tuning)
        ("00 00 00 00", "13 00 02 00"),   # NOP: tuning pending
        READY,                            # NOP: done
        LOCKED_W,                         # StatusW: on, no WFREQ
    ])
    drv.configure_grid(193.15, 50.0)
    assert drv.channel_frequency_thz(7) == pytest.approx(193.45)
    assert drv.set_channel(7) == pytest.approx(0.02)  # two poll intervals: after CP, NOP
    assert list(drv.tune_history) == [pytest.approx(0.02)]
    assert drv.last_time_to_lock_s == pytest.approx(0.02)
    with pytest.raises(SafetyLimitError, match="outside the laser's range"):
        drv.set_channel(200)
    with pytest.raises(SafetyLimitError):
        drv.set_channel(0)
    link.assert_all_consumed()


def test_wait_pending_times_out_naming_the_fix() -> None:
    pending = ("00 00 00 00", "23 00 01 00")
    drv, link = make_driver([pending, pending, pending], poll=0.25)
    with pytest.raises(DeviceTimeout, match=r"still pending at the deadline .*disable_output"):
        drv.link.wait_pending(timeout=0.5)
    link.assert_all_consumed()


def test_state_reads_everything_back() -> None:
    drv, link = make_driver([
        ("30 65 00 00", "21 65 00 00"), ("00 00 00 00", "00 00 00 11"),  # ChannelH: RNI -> 0
        ("30 30 00 00", "40 30 00 07"),
        ("40 40 00 00", "90 40 00 c1"), ("50 41 00 00", "80 41 11 94"),
        ("e0 68 00 00", "e0 68 00 00"),
        ("60 42 00 00", "30 42 03 e8"),
        ("10 32 00 00", "90 32 00 08"),
        LOCKED_W, READY,
    ])
    st = drv.state()
    assert (st.channel, st.frequency_thz, st.power_dbm, st.output_enabled, st.locked) == (
        7, pytest.approx(193.45), 10.0, True, True)
    link.assert_all_consumed()


def test_context_exit_switches_off_and_closes_but_close_alone_does_not() -> None:
    drv, link = make_driver([("01 32 00 00", "10 32 00 00")])
    with drv:
        pass
    assert link.closed
    link.assert_all_consumed()
    drv2, link2 = make_driver([])
    drv2.close()
    assert link2.closed
    with pytest.raises(DeviceError, match="closed"):
        drv2.link.nop()


def test_shutdown_still_closes_when_the_laser_is_silent() -> None:
    drv, link = make_driver([("01 32 00 00", None), *RESYNC_SILENT])
    drv.shutdown()
    assert link.closed
    link.assert_all_consumed()


# --- link recovery and start-up (docs/reference/devices/itla.md) -------------------------------------------

def _req(reg: str, data: int = 0, write: bool = False) -> str:
    return encode_request(register(reg).address, data, write).hex(" ")


def _rep(reg: str, data: int = 0, status: Status = Status.OK, *, ce: bool = False) -> str:
    return encode_reply(register(reg).address, data, status, ce=ce).hex(" ")


GRID_100 = [(_req("FCF1"), _rep("FCF1", 193)), (_req("FCF2"), _rep("FCF2", 1000)),
            (_req("FCF3"), _rep("FCF3", 0)), (_req("GRID"), _rep("GRID", 1000)),
            (_req("GRID2"), _rep("GRID2", 0))]
"""grid(): 193.1 THz + n x 100 GHz."""


def test_silence_resynchronises_with_single_nop_bytes_then_repeats_the_request() -> None:
    # The module lost a byte of the request: it holds 3 bytes and waits for a fourth. The
    # first NOP byte completes that frame (bad checksum: CE reply); the link is framed again.
    drv, link = make_driver([(_req("Channel"), None),
                             ("00", _rep("Channel", ce=True)),
                             (_req("Channel"), _rep("Channel", 5))])
    assert drv.link.read_register("Channel") == 5
    assert drv.link.resyncs == 1
    link.assert_all_consumed()


def test_resync_sends_up_to_four_bytes_when_the_module_holds_nothing() -> None:
    # The request arrived but its reply was lost: the module's buffer is empty, so only the
    # fourth NOP byte makes a whole (NOP) frame that it answers.
    drv, link = make_driver([(_req("OOP"), None), ("00", None), ("00", None), ("00", None),
                             ("00", "10 00 00 10"), (_req("OOP"), _rep("OOP", 1000))])
    assert drv.link.read_register("OOP") == 1000
    link.assert_all_consumed()


def test_a_write_whose_reply_was_lost_is_read_back_not_sent_twice() -> None:
    drv, link = make_driver([(_req("PWR", 1100, True), None),
                             *[("00", None)] * 3, ("00", "10 00 00 10"),
                             (_req("PWR"), _rep("PWR", 1100)),   # already holds the value
                             READY])
    assert drv.link.write_register("PWR", 1100) is Status.OK
    link.assert_all_consumed()


def test_a_write_that_never_arrived_is_sent_again_after_resync() -> None:
    drv, link = make_driver([(_req("PWR", 1100, True), None),
                             ("00", _rep("PWR", ce=True)),
                             (_req("PWR"), _rep("PWR", 1000)),   # still the old value
                             (_req("PWR", 1100, True), _rep("PWR", 1100))])
    assert drv.link.write_register("PWR", 1100) is Status.OK
    link.assert_all_consumed()


def test_a_second_ce_means_shifted_frames_and_resynchronises() -> None:
    ce = _rep("Channel", ce=True)
    drv, link = make_driver([(_req("Channel"), ce), (_req("Channel"), ce),
                             ("00", _rep("Channel", ce=True)),
                             (_req("Channel"), _rep("Channel", 3))])
    assert drv.link.read_register("Channel") == 3
    assert drv.link.resyncs == 1
    link.assert_all_consumed()


def test_commands_refused_while_initialising_are_retried() -> None:
    cii = [(_req("Channel"), _rep("Channel", status=Status.XE)), ("00 00 00 00", _rep("NOP", 0x05))]
    drv, link = make_driver([*cii, *cii, (_req("Channel"), _rep("Channel", 1))], poll=0.5)
    assert drv.link.read_register("Channel") == 1
    link.assert_all_consumed()


def test_initialising_longer_than_the_startup_timeout_names_the_setting() -> None:
    cii = [(_req("Channel"), _rep("Channel", status=Status.XE)), ("00 00 00 00", _rep("NOP", 0x05))]
    drv, link = make_driver(cii * 3, poll=0.5)
    drv.link.timeouts.startup_s = 1.0
    with pytest.raises(ItlaExecutionError, match=r"CII .*timeouts.startup_s") as info:
        drv.link.read_register("Channel")
    assert info.value.error.mnemonic == "CII"
    link.assert_all_consumed()


def test_tuning_with_the_output_off_reads_only_statusw() -> None:
    drv, link = make_driver([
        *LIMITS, *GRID_100,
        (_req("Channel", 4, True), _rep("Channel", 4)),      # OK at once: no light to tune
        (_req("StatusW"), _rep("StatusW", 0x1000)),          # DIS: the output is off
    ])
    assert drv.set_channel(4) == 0.0
    link.assert_all_consumed()


def test_timeouts_come_from_the_configuration() -> None:
    pending = ("00 00 00 00", "13 00 02 00")
    drv, link = make_driver([*LIMITS, *GRID_100,
                             (_req("Channel", 2, True), _rep("Channel", 2, Status.CP)),
                             pending, pending], poll=1.0)  # polled at 1 s and 2 s
    drv.link.timeouts.lock_s = 2.0
    with pytest.raises(DeviceTimeout, match="tuning to channel 2 still pending"):
        drv.set_channel(2)
    link.assert_all_consumed()


def test_timeouts_are_validated_and_each_driver_has_its_own() -> None:
    from oddl.drivers.itla_timeouts import ItlaTimeouts

    with pytest.raises(ValueError, match="enable_s=0"):
        ItlaTimeouts(enable_s=0)
    with pytest.raises(ValueError, match="lock_s=nan"):
        ItlaTimeouts(lock_s=float("nan"))
    shared = ItlaTimeouts(lock_s=12.0)
    a = ItlaDriver(scripted_link([]), timeouts=shared, timeout_s=0.5)
    b = ItlaDriver(scripted_link([]), timeouts=shared)
    a.link.timeouts.lock_s = 1.0
    assert (a.link.timeout_s, a.link.timeouts.lock_s) == (0.5, 1.0)
    assert (b.link.timeout_s, b.link.timeouts.lock_s, shared.lock_s) == (0.25, 12.0, 12.0)


def test_temps_are_signed_hundredths_through_aea() -> None:
    ear = _req("EAR")
    drv, link = make_driver([(_req("Temps"), _rep("Temps", 4, Status.AEA)),
                             (ear, _rep("EAR", 0xFF38)), (ear, _rep("EAR", 0x09C4))])
    assert drv.temperatures_c() == (-2.0, 25.0)
    link.assert_all_consumed()


def test_without_link_recovery_silence_fails_at_once() -> None:
    """For probing a port at several baud rates: no NOP bytes, no second try."""
    link = scripted_link([(_req("NOP"), None)])
    drv = ItlaDriver(link, name="probe", retries=0, recover_link=False)
    with pytest.raises(DeviceTimeout, match="probe: no reply to read NOP within"):
        drv.link.nop()
    link.assert_all_consumed()
    link = scripted_link([(_req("NOP"), "00 00 00 05")])   # garbage at a wrong baud rate
    drv = ItlaDriver(link, name="probe", retries=0, recover_link=False)
    with pytest.raises(ProtocolError, match="bad checksum"):
        drv.link.nop()
    link.assert_all_consumed()
