"""The ITLA emulator's state machine on a hand-driven clock (fuzzing: test_itla_emulator_fuzz)."""

from __future__ import annotations

import pytest
from fakes import FakeClock

from oddl.drivers.emulators.itla import ItlaEmulator, OpticalOutput
from oddl.drivers.emulators.itla_register_model import DARK_DBM
from oddl.drivers.itla_frames import (
    NOP_MRDY,
    Reply,
    Status,
    checksum_ok,
    decode_reply,
    encode_request,
)
from oddl.drivers.itla_registers import register

TTL = 0.5


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def emu(clock: FakeClock) -> ItlaEmulator:
    return ItlaEmulator(clock=clock, time_to_lock_s=TTL)


def ask(emu: ItlaEmulator, reg: str | int, data: int = 0, write: bool = False) -> Reply:
    raw = emu.handle_frame(encode_request(register(reg).address, data, write))
    assert raw is not None
    return decode_reply(raw)


def nop_error(emu: ItlaEmulator) -> int:
    return ask(emu, "NOP").data & 0x0F


def read_string(emu: ItlaEmulator, reg: str) -> str:
    first = ask(emu, reg)
    assert first.status is Status.AEA
    buf = b""
    while True:
        r = ask(emu, "EAR")
        if r.status is Status.XE:
            break
        buf += r.data.to_bytes(2, "big")
    assert len(buf) >= first.data
    return buf[:first.data].rstrip(b"\0").decode()


def enable(emu: ItlaEmulator, clock: FakeClock) -> None:
    assert ask(emu, "ResEna", 8, True).status is Status.CP
    clock.advance(TTL)


def frequency_mhz(emu: ItlaEmulator) -> int:
    return (ask(emu, "LF1").data * 1_000_000 + ask(emu, "LF2").data * 100
            + ask(emu, "LF3").data)


# --- power-on state and identity ----------------------------------------------------------------

def test_power_on_state(emu: ItlaEmulator) -> None:
    nop = ask(emu, "NOP")
    assert (nop.status, nop.data) == (Status.OK, NOP_MRDY)
    statusf = ask(emu, "StatusF").data
    assert statusf & 0x1000 and statusf & 0x20  # DIS and MRL latched
    assert ask(emu, "ResEna").data == 0
    assert ask(emu, "Channel").data == 1
    assert frequency_mhz(emu) == 193_100_000
    assert ask(emu, "OOP").signed == round(DARK_DBM * 100)
    assert emu.optical_output() is None


def test_identity_strings_through_aea(emu: ItlaEmulator) -> None:
    assert ask(emu, "DevTyp") == Reply(Status.AEA, False, 0x01, 8)  # "CW ITLA" + NUL
    assert read_string(emu, "DevTyp") == "CW ITLA"
    assert nop_error(emu) == 0x6  # ERE after reading past the end
    assert read_string(emu, "SerNo") == "EMU-0001"
    assert read_string(emu, "MFGR") and read_string(emu, "Model")
    assert read_string(emu, "Release") and read_string(emu, "RelBack")
    assert read_string(emu, "MFGDate")
    custom = ItlaEmulator(serial_number="LAB-7")
    assert read_string(custom, "SerNo") == "LAB-7"


def test_ear_without_a_string_read_is_ere_and_ear_write_is_ero(emu: ItlaEmulator) -> None:
    assert ask(emu, "EAR").status is Status.XE
    assert nop_error(emu) == 0x6
    assert ask(emu, "EAR", 1, True).status is Status.XE
    assert nop_error(emu) == 0x7


def test_limits_registers(emu: ItlaEmulator) -> None:
    assert (ask(emu, "LFL1").data, ask(emu, "LFL2").data) == (193, 1000)
    assert (ask(emu, "LFH1").data, ask(emu, "LFH2").data) == (197, 8000)
    assert (ask(emu, "OPSL").signed, ask(emu, "OPSH").signed) == (600, 1350)
    assert ask(emu, "LGrid").data * 100 + ask(emu, "LGrid2").data == 6250


# --- pending, lock and CIP ----------------------------------------------------------------------

def test_enable_is_pending_for_time_to_lock(emu: ItlaEmulator, clock: FakeClock) -> None:
    assert ask(emu, "ResEna", 8, True) == Reply(Status.CP, False, 0x32, 8)
    nop = ask(emu, "NOP")
    assert nop.status is Status.CP and nop.data & 0xFF00 == 0x0100
    assert emu.optical_output() is None
    statusf = ask(emu, "StatusF").data
    assert statusf & 0x0400 and not statusf & 0x1000  # FFREQ (not locked), not DIS
    clock.advance(TTL - 0.001)
    assert ask(emu, "NOP").status is Status.CP
    assert emu.optical_output(now=clock.t + 0.001) == OpticalOutput(193.1, 10.0)
    clock.advance(0.001)
    nop = ask(emu, "NOP")
    assert (nop.status, nop.data) == (Status.OK, NOP_MRDY)
    assert ask(emu, "StatusF").data & 0xFF00 == 0
    assert ask(emu, "OOP").signed == 1000
    assert emu.optical_output() == OpticalOutput(193.1, 10.0)


def test_writes_while_pending_get_cip_reads_are_served(emu: ItlaEmulator) -> None:
    ask(emu, "ResEna", 8, True)
    assert ask(emu, "PWR", 1100, True).status is Status.XE
    assert nop_error(emu) == 0x4
    assert ask(emu, "PWR").signed == 1000
    assert ask(emu, "ResEna", 8, True).status is Status.XE  # already enabling


def test_disable_aborts_a_pending_enable(emu: ItlaEmulator, clock: FakeClock) -> None:
    ask(emu, "ResEna", 8, True)
    assert ask(emu, "ResEna", 0, True).status is Status.OK
    assert ask(emu, "NOP").data == NOP_MRDY
    clock.advance(TTL)
    assert emu.optical_output() is None


def test_channel_write_while_on_retunes(emu: ItlaEmulator, clock: FakeClock) -> None:
    enable(emu, clock)
    assert ask(emu, "Channel", 5, True).status is Status.CP
    assert ask(emu, "NOP").data >> 8 == 0x02
    assert emu.optical_output() is None
    assert frequency_mhz(emu) == 193_500_000
    clock.advance(TTL)
    assert emu.optical_output() == OpticalOutput(193.5, 10.0)


def test_channel_and_fcf_writes_with_output_off_complete_at_once(emu: ItlaEmulator) -> None:
    assert ask(emu, "Channel", 5, True).status is Status.OK
    assert ask(emu, "FCF1", 194, True).status is Status.OK
    assert ask(emu, "FCF2", 0, True).status is Status.OK
    assert ask(emu, "FCF3", 50, True).status is Status.OK
    assert ask(emu, "GRID", 500, True).status is Status.OK
    assert ask(emu, "GRID2", -25, True).status is Status.OK
    assert frequency_mhz(emu) == 194_000_050 + 4 * 49_975
    assert ask(emu, "GRID2").signed == -25
    assert ask(emu, "NOP").data == NOP_MRDY


def test_fine_tune_moves_the_light(emu: ItlaEmulator, clock: FakeClock) -> None:
    enable(emu, clock)
    assert ask(emu, "FTF", -1500, True).status is Status.CP
    clock.advance(TTL)
    assert frequency_mhz(emu) == 193_098_500
    out = emu.optical_output()
    assert out is not None and out.frequency_thz == pytest.approx(193.0985)
    assert ask(emu, "FTF", 7000, True).status is Status.XE
    assert nop_error(emu) == 0x3


def test_power_changes_follow_in_oop_and_light(emu: ItlaEmulator, clock: FakeClock) -> None:
    enable(emu, clock)
    assert ask(emu, "PWR", 1234, True).status is Status.OK
    assert ask(emu, "OOP").signed == 1234
    assert emu.optical_output() == OpticalOutput(193.1, 12.34)
    ask(emu, "ResEna", 0, True)
    assert ask(emu, "OOP").signed == round(DARK_DBM * 100)
    assert ask(emu, "StatusW").data & 0x1000


def test_jitter_is_seeded() -> None:
    def lock_time(seed: int) -> float:
        clk = FakeClock(1000.0)
        emu = ItlaEmulator(clock=clk, time_to_lock_s=0.1, lock_jitter_s=0.05, seed=seed)
        ask(emu, "ResEna", 8, True)
        start = clk.t
        while ask(emu, "NOP").status is Status.CP:
            clk.advance(0.001)
        return clk.t - start

    assert lock_time(3) == lock_time(3)
    assert 0.1 <= lock_time(3) <= 0.151
    assert lock_time(1) != lock_time(2)


# --- refusals -----------------------------------------------------------------------------------

@pytest.mark.parametrize("reg", ["FCF1", "FCF2", "FCF3", "GRID", "GRID2"])
def test_grid_writes_with_output_on_are_cie(emu: ItlaEmulator, clock: FakeClock,
                                            reg: str) -> None:
    enable(emu, clock)
    before = emu.snapshot()
    assert ask(emu, reg, 1, True).status is Status.XE
    assert nop_error(emu) == 0x9
    assert emu.snapshot() == before


@pytest.mark.parametrize(("reg", "value"), [
    ("Channel", 0), ("Channel", 49), ("PWR", 1400), ("PWR", 500), ("FCF1", 192),
    ("FCF1", 198), ("FCF2", 10000), ("FCF3", 100), ("GRID", 61), ("GRID2", 100),
])
def test_out_of_range_values_are_rve(emu: ItlaEmulator, reg: str, value: int) -> None:
    before = emu.snapshot()
    assert ask(emu, reg, value, True).status is Status.XE
    assert nop_error(emu) == 0x3
    assert emu.snapshot() == before


def test_channel_high_word_takes_effect_with_the_channel_write(emu: ItlaEmulator,
                                                              clock: FakeClock) -> None:
    enable(emu, clock)
    assert ask(emu, "ChannelH", 1, True).status is Status.OK
    assert ask(emu, "ChannelH").data == 1
    assert emu.optical_output() == OpticalOutput(193.1, 10.0)  # not moved yet
    assert ask(emu, "Channel", 1, True).status is Status.XE  # channel 65537: off the band
    assert nop_error(emu) == 0x3
    ask(emu, "ChannelH", 0, True)
    assert ask(emu, "Channel", 2, True).status is Status.CP


def test_enable_with_the_channel_off_the_band_is_ivc(emu: ItlaEmulator) -> None:
    ask(emu, "Channel", 48, True)
    ask(emu, "FCF1", 194, True)  # channel 48 is now 198.7 THz, beyond LFH
    assert ask(emu, "ResEna", 8, True).status is Status.XE
    assert nop_error(emu) == 0xA


@pytest.mark.parametrize("address", [0x0C, 0x59, 0x7F, 0x90, 0xFF])
def test_unknown_registers_are_rni(emu: ItlaEmulator, address: int) -> None:
    assert ask(emu, address).status is Status.XE
    assert nop_error(emu) == 0x1
    assert ask(emu, address, 1, True).status is Status.XE
    assert nop_error(emu) == 0x1


@pytest.mark.parametrize("reg", ["LF1", "OOP", "OPSH", "LFL1", "DevTyp", "SerNo", "EA"])
def test_read_only_writes_are_rnw(emu: ItlaEmulator, reg: str) -> None:
    assert ask(emu, reg, 1, True).status is Status.XE
    assert nop_error(emu) == 0x2
    assert ask(emu, "StatusF").data & 0x80  # XEL latched


def test_error_field_clears_on_the_next_success(emu: ItlaEmulator) -> None:
    ask(emu, "PWR", 9999, True)
    assert nop_error(emu) == 0x3
    assert nop_error(emu) == 0x3  # reading NOP does not clear it
    ask(emu, "PWR")
    assert nop_error(emu) == 0


def test_status_latches_clear_by_writing_ones(emu: ItlaEmulator) -> None:
    assert ask(emu, "StatusF").data & 0x20
    ask(emu, "StatusF", 0xFF, True)
    assert ask(emu, "StatusF").data & 0xFF == 0
    assert ask(emu, "StatusW").data & 0x20  # StatusW keeps its own latches
    ask(emu, "StatusW", 0x20, True)
    assert ask(emu, "StatusW").data & 0xFF == 0


def test_plain_registers_store_what_is_written(emu: ItlaEmulator) -> None:
    for reg in ("GenCfg", "MCB", "IOCap", "FPowTh", "ALMT"):
        assert ask(emu, reg, 0x0123, True).status is Status.OK
        assert ask(emu, reg).data == 0x0123


def test_resets_through_resena(emu: ItlaEmulator, clock: FakeClock) -> None:
    enable(emu, clock)
    ask(emu, "PWR", 1200, True)
    ask(emu, "StatusF", 0xFF, True)
    assert ask(emu, "ResEna", 0x02, True).status is Status.OK  # soft reset: output off
    assert emu.optical_output() is None and ask(emu, "PWR").signed == 1200
    enable(emu, clock)
    assert ask(emu, "ResEna", 0x01, True).status is Status.OK  # module reset: defaults
    assert ask(emu, "PWR").signed == 1000 and ask(emu, "ResEna").data == 0
    assert ask(emu, "StatusF").data & 0x20  # MRL latched again


# --- communication errors -----------------------------------------------------------------------

def test_bad_checksum_gets_ce_and_changes_nothing(emu: ItlaEmulator, clock: FakeClock) -> None:
    ask(emu, "Channel")
    lstrsp = encode_request(0x30, last_response=True)
    previous = emu.handle_frame(lstrsp)
    before = emu.snapshot()
    good = encode_request(0x32, 8, True)
    bad = bytes([good[0] ^ 0x10]) + good[1:]
    raw = emu.handle_frame(bad)
    assert raw is not None and checksum_ok(raw)
    assert decode_reply(raw) == Reply(Status.OK, True, 0x32, 0)
    assert emu.handle_frame(lstrsp) == previous  # the CE reply is not the "last response"
    assert emu.snapshot() == before
    clock.advance(TTL)
    assert emu.optical_output() is None
    assert ask(emu, "StatusF").data & 0x40  # CEL latched


def test_lstrsp_repeats_the_last_reply_without_executing(emu: ItlaEmulator) -> None:
    ask(emu, "SerNo")
    first = emu.handle_frame(encode_request(0x0B))
    again = emu.handle_frame(encode_request(0x0B, last_response=True))
    assert first == again
    assert decode_reply(emu.handle_frame(encode_request(0x0B)) or b"").data == int.from_bytes(
        b"U-", "big")  # the pointer moved once: "EM" then "U-"


# --- faults -------------------------------------------------------------------------------------

def test_no_answer_for_k_frames_then_normal(emu: ItlaEmulator) -> None:
    emu.faults.no_answer = 2
    assert emu.handle_frame(encode_request(0x32, 8, True)) is None
    assert emu.handle_frame(encode_request(0x00)) is None
    assert ask(emu, "ResEna").data == 0  # the dropped write was not executed


def test_no_answer_always(emu: ItlaEmulator) -> None:
    emu.inject(no_answer_always=True)
    assert all(emu.handle_frame(encode_request(0x00)) is None for _ in range(5))
    emu.inject(no_answer_always=False)
    assert ask(emu, "NOP").status is Status.OK


def test_late_answers(emu: ItlaEmulator) -> None:
    emu.inject(late_next=1, late_next_s=0.3)
    reply, delay = emu.respond(encode_request(0x00))
    assert reply is not None and delay == 0.3
    assert emu.respond(encode_request(0x00))[1] == 0.0
    emu.faults.late_s = 0.05
    assert emu.respond(encode_request(0x00))[1] == 0.05


def test_garbage_is_executed_and_recoverable_with_lstrsp(emu: ItlaEmulator) -> None:
    emu.faults.garbage = 1
    raw = emu.handle_frame(encode_request(0x31, 1200, True))
    assert raw is not None and len(raw) == 4 and not checksum_ok(raw)
    again = emu.handle_frame(encode_request(0x31, 1200, True, last_response=True))
    assert decode_reply(again or b"") == Reply(Status.OK, False, 0x31, 1200)
    assert ask(emu, "PWR").signed == 1200


def test_truncated_reply(emu: ItlaEmulator) -> None:
    emu.faults.truncate = 1
    raw = emu.handle_frame(encode_request(0x30))
    full = emu.handle_frame(encode_request(0x30, last_response=True))
    assert full is not None and raw == full[:2]


def test_execution_error_on_the_next_write(emu: ItlaEmulator) -> None:
    emu.faults.error_next_write = 1
    assert ask(emu, "PWR").status is Status.OK  # reads are not affected
    assert ask(emu, "PWR", 1100, True).status is Status.XE
    assert nop_error(emu) == 0x8
    assert ask(emu, "PWR", 1100, True).status is Status.OK


def test_reset_fault(emu: ItlaEmulator, clock: FakeClock) -> None:
    enable(emu, clock)
    ask(emu, "Channel", 3, True)
    clock.advance(TTL)
    ask(emu, "StatusF", 0xFF, True)
    emu.faults.reset_next = True
    assert emu.handle_frame(encode_request(0x30)) is None
    assert emu.optical_output() is None
    assert ask(emu, "Channel").data == 1 and ask(emu, "ResEna").data == 0
    assert ask(emu, "StatusF").data & 0x20


def test_stuck_pending_until_output_off(emu: ItlaEmulator, clock: FakeClock) -> None:
    emu.faults.stuck_pending = True
    ask(emu, "ResEna", 8, True)
    clock.advance(100 * TTL)
    assert ask(emu, "NOP").status is Status.CP
    assert emu.optical_output() is None
    emu.faults.stuck_pending = False
    assert ask(emu, "NOP").status is Status.OK  # its time was up long ago
    emu.faults.stuck_pending = True
    ask(emu, "Channel", 2, True)
    assert ask(emu, "ResEna", 0, True).status is Status.OK
    assert ask(emu, "NOP").data == NOP_MRDY
