"""The emulated WSS's grid modes and less common commands: CHW, DCC, UCA, RES/SUS, framing."""

from __future__ import annotations

import pytest
from fakes import FakeClock

from oddl.drivers.emulators.wss import WssEmulator
from oddl.drivers.interfaces import BLOCKED_DB, Route
from oddl.drivers.wss_protocol import SLICE_GHZ, checksum, frame

BLOCKED = Route(99, BLOCKED_DB)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(50.0)


@pytest.fixture
def emu(clock: FakeClock) -> WssEmulator:
    return WssEmulator(clock=clock, settle_s=0.05)


def flex(emu: WssEmulator, plan: str) -> None:
    assert emu.handle_line("CHW 0")[-1] == "OK"
    assert emu.handle_line(f"DCC {plan}")[-1] == "OK"


# --- CHW ------------------------------------------------------------------------------------------

def test_chw_switches_between_fixed_grids_and_flexgrid(emu: WssEmulator, clock: FakeClock) -> None:
    emu.handle_line("UCA 3,2,0.0")
    assert emu.handle_timed("CHW 100") == [(0.0, "CHW 100"), (0.05, "OK")]
    assert emu.handle_line("CHW?") == ["CHW?", "100", "OK"]
    rra = emu.handle_line("RRA?")[1].split(";")
    assert rra == [f"{c},99,99.9" for c in range(48)]  # a new plan: every channel blocked
    assert emu.centre_thz(0) == pytest.approx(191.375)
    assert emu.handle_line("URA 48,1,0.0")[-1] == "RER"
    assert emu.handle_line("CHW 0")[-1] == "OK"
    assert emu.handle_line("RRA?") == ["RRA?", "OK"]  # no channel defined yet
    assert emu.handle_line("DCC?") == ["DCC?", "OK"]
    clock.t += 1
    assert emu.route(193.0) is None


def test_chw_to_the_mode_in_force_changes_nothing(emu: WssEmulator) -> None:
    emu.handle_line("UCA 3,2,0.0")
    assert emu.handle_timed("CHW 50") == [(0.0, "CHW 50"), (0.0, "OK")]
    assert emu.active_table()[3] == Route(2, 0.0)


# --- DCC ------------------------------------------------------------------------------------------

def test_dcc_defines_channels_over_slices(emu: WssEmulator, clock: FakeClock) -> None:
    flex(emu, "1=67:74;2=155:162;3=163:170;")
    assert emu.slices == 772  # (196.150 - 191.325) THz / 6.25 GHz
    assert emu.handle_line("DCC?") == ["DCC?", "1=67:74;2=155:162;3=163:170", "OK"]
    assert emu.handle_line("RRA?") == ["RRA?", "1,99,99.9;2,99,99.9;3,99,99.9", "OK"]
    assert emu.handle_line("UCA 1,1,0.0;2,1,0.0;3,2,0.0")[-1] == "OK"
    clock.t += 1
    lo, hi = emu.slice_range_thz(155, 162)
    assert hi - lo == pytest.approx(8 * SLICE_GHZ / 1000)
    assert emu.route(lo) == Route(1, 0.0) and emu.route(hi - 1e-6) == Route(1, 0.0)
    assert emu.route(hi) == Route(2, 0.0)  # slice 163 starts channel 3
    assert emu.route(emu.slice_range_thz(100, 100)[0]) is None  # between channels


def test_dcc_again_keeps_unchanged_channels_and_blocks_changed_ones(emu: WssEmulator) -> None:
    flex(emu, "1=1:8;2=9:16")
    emu.handle_line("UCA 1,1,0.0;2,2,0.0")
    assert emu.handle_line("DCC 1=1:8;2=9:20;4=30:40")[-1] == "OK"
    assert emu.active_table() == {1: Route(1, 0.0), 2: BLOCKED, 4: BLOCKED}


@pytest.mark.parametrize("plan, code", [
    ("1=1:8;2=8:16", "VER"),     # overlap
    ("1=1:8;1=9:16", "VER"),     # defined twice
    ("1=0:8", "RER"),
    ("1=700:773", "RER"),        # beyond Smax
    ("0=1:8", "RER"),
    ("97=1:8", "RER"),
    ("1=8:1", "AER"),
    ("1=1-8", "AER"),
    ("1:1=8", "AER"),
    ("", "AER"),
])
def test_dcc_refusals_change_nothing(emu: WssEmulator, plan: str, code: str) -> None:
    flex(emu, "5=100:107")
    before = emu.flex.copy(), emu.active_table()
    assert emu.handle_line(f"DCC {plan}")[-1] == code
    assert (emu.flex, emu.active_table()) == before


def test_routes_to_an_undefined_flexgrid_channel_are_validation_errors(emu: WssEmulator) -> None:
    flex(emu, "1=1:8;3=9:16")
    assert emu.handle_line("URA 2,1,0.0")[-1] == "VER"
    assert emu.handle_line("UCA 97,1,0.0")[-1] == "RER"
    assert emu.handle_line("URA 3,1,0.0")[-1] == "OK"


# --- UCA ------------------------------------------------------------------------------------------

def test_uca_switches_only_its_channels_at_once(emu: WssEmulator, clock: FakeClock) -> None:
    emu.handle_line("URA 1,1,0.0")  # staged, waits for RSW
    assert emu.handle_timed("UCA 2,2,1.5") == [(0.0, "UCA 2,2,1.5"), (0.05, "OK")]
    assert emu.active_table()[2] == Route(2, 1.5) and emu.active_table()[1] == BLOCKED
    assert emu.staged_table()[1] == Route(1, 0.0) and emu.staged_table()[2] == Route(2, 1.5)
    assert emu.settling()
    clock.t += 0.05
    assert emu.route(emu.centre_thz(2)) == Route(2, 1.5)


def test_port_99_carries_no_light(emu: WssEmulator, clock: FakeClock) -> None:
    emu.handle_line("UCA 4,99,0.0;5,1,0.0")
    clock.t += 1
    assert emu.route(emu.centre_thz(4)) is None
    assert emu.route(emu.centre_thz(5)) == Route(1, 0.0)
    assert "4,99,0.0" in emu.handle_line("RRA?")[1].split(";")


# --- RES and SUS ----------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ["SAB", "SFD", "SLS"])
def test_res_comes_up_in_the_start_up_state(emu: WssEmulator, clock: FakeClock, state: str) -> None:
    emu.restart_s = 2.0
    assert emu.handle_line(f"SUS {state.lower()}")[-1] == "OK"
    assert emu.handle_line("SUS?") == ["SUS?", state, "OK"]
    flex(emu, "1=1:8")
    emu.handle_line("UCA 1,3,0.0")
    assert emu.handle_line("RES") == ["RES", "OK"]
    assert emu.handle_line("SNO?") == []  # restarting: deaf
    clock.t += 2.0
    assert emu.handle_line("SNO?")[-1] == "OK"
    if state == "SAB":
        assert emu.mode_ghz == 0 and emu.active_table() == {1: BLOCKED}
    elif state == "SFD":
        assert emu.mode_ghz == 50 and set(emu.active_table().values()) == {BLOCKED}
        assert len(emu.active_table()) == 96
    else:
        assert emu.mode_ghz == 0 and emu.active_table() == {1: Route(3, 0.0)}
    assert emu.staged_table() == emu.active_table()


# --- framing, echo, RRA? lines --------------------------------------------------------------------

def test_framed_commands_get_framed_replies(emu: WssEmulator) -> None:
    reply = emu.handle_line(frame("SNO?"))
    assert reply == [frame("SNO?"), frame("SN000001"), "^OK$FF66"]
    line = f"^URA 1,1,0.0${checksum('URA 1,1,0.0'):04x}"  # lower-case hex is accepted
    assert emu.handle_line(line) == [line, "^OK$FF66"]
    assert emu.handle_line(frame("URA 1,9,0.0"))[-1] == frame("RER")
    assert emu.handle_line("^URA 1,2,0.0$0000") == ["^URA 1,2,0.0$0000", frame("CER")]
    assert emu.staged_table()[1] == Route(1, 0.0)  # the badly framed command did nothing


def test_blanks_inside_a_frame_are_ignored(emu: WssEmulator) -> None:
    assert emu.handle_line(frame(" SNO? "))[1:] == [frame("SN000001"), "^OK$FF66"]


def test_without_echo(emu: WssEmulator) -> None:
    emu.echo = False
    assert emu.handle_line("SNO?") == ["SN000001", "OK"]
    assert emu.handle_line("FOO") == ["CER"]


def test_rra_split_over_lines(emu: WssEmulator) -> None:
    emu.rra_per_line = 10
    reply = emu.handle_line("RRA?")
    assert reply[0] == "RRA?" and reply[-1] == "OK" and len(reply) == 2 + 10
    entries = ";".join(reply[1:-1]).split(";")
    assert entries == [f"{c},99,99.9" for c in range(96)]


def test_only_light_changes_call_on_change(emu: WssEmulator) -> None:
    calls: list[int] = []
    emu.on_change = lambda: calls.append(1)
    for line in ("SNO?", "RRA?", "URA 1,1,0.0", "DCC?", "CHW?", "SUS?"):
        emu.handle_line(line)
    assert calls == []
    for line in ("RSW", "UCA 2,1,0.0", "CHW 0", "DCC 1=1:8"):
        emu.handle_line(line)
    assert len(calls) == 4
