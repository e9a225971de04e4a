"""The real WSS driver against the emulator over socket:// (the hardware code path, no lab)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fakes import LAB_WSS_PLAN as LAB

from oddl.common.errors import DeviceTimeout, ProtocolError
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.emulators.wss import WssEmulator, WssFaults
from oddl.drivers.emulators.wss_serve import wss_connection_handler
from oddl.drivers.interfaces import BLOCKED_DB, Route, WavelengthSelectiveSwitch
from oddl.drivers.transport import SerialTransport
from oddl.drivers.wss import FlexgridWss, WssCommandError
from oddl.drivers.wss_codec import InvalidRouteTable, WssLimits
from oddl.drivers.wss_protocol import WssErrorCode

BLOCKED = Route(99, BLOCKED_DB)

SETTLE_S = 0.005
REPLY_TIMEOUT = 0.2


@dataclass
class Rig:
    emu: WssEmulator
    server: TcpEmulatorServer
    wss: FlexgridWss


def open_driver(url: str, **kw: object) -> FlexgridWss:
    link = SerialTransport(url, name="wss-1", baudrate=115200)
    return FlexgridWss(link, name="wss-1", timeout=REPLY_TIMEOUT, settle_timeout=1.0,
                       resync_quiet=0.02, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shared_rig() -> Iterator[Rig]:
    """One emulator, server and driver for the module (pyserial's socket close sleeps 0.3 s)."""
    emu = WssEmulator(settle_s=SETTLE_S, serial_number="WSS-T-0007", **LAB)  # type: ignore[arg-type]
    server = TcpEmulatorServer(wss_connection_handler(emu), name="wss-emu")
    wss = open_driver(server.url)
    try:
        yield Rig(emu, server, wss)
    finally:
        wss.close()
        server.close()


@pytest.fixture
def rig(shared_rig: Rig) -> Rig:
    """The shared rig with the emulator power-cycled and every fault cleared."""
    shared_rig.emu.faults = WssFaults()
    shared_rig.emu.settle_s = SETTLE_S
    shared_rig.emu.restart_s = 0.0
    shared_rig.emu.rra_per_line = 0
    shared_rig.emu.startup_state = "SAB"
    shared_rig.emu.reset()
    return shared_rig


def test_driver_is_a_wss(rig: Rig) -> None:
    assert isinstance(rig.wss, WavelengthSelectiveSwitch)


def test_identify(rig: Rig) -> None:
    ident = rig.wss.identify()
    assert ident.serial_number == "WSS-T-0007"
    assert dict(ident.extra) == {"manufacture_date": "2024-01-01"}


def test_stage_apply_read_back(rig: Rig) -> None:
    table = {1: Route(1, 0.0), 2: Route(2, 3.5), 10: Route(4, 25.0), 48: Route(3, BLOCKED_DB)}
    rig.wss.stage(table)
    assert rig.emu.route(rig.emu.centre_thz(1)) is None  # staged only
    assert {ch: rig.wss.read_active()[ch] for ch in table} != table
    rig.wss.apply()
    assert rig.wss.last_settle_s is not None and rig.wss.last_settle_s >= SETTLE_S
    active = rig.wss.read_active()
    assert {ch: active[ch] for ch in table} == table
    assert active == rig.emu.active_table()
    assert rig.emu.route(rig.emu.centre_thz(2)) == Route(2, 3.5)
    assert rig.emu.route(rig.emu.centre_thz(48)) is None


def test_block(rig: Rig) -> None:
    rig.wss.stage({5: Route(2, 1.0)})
    rig.wss.apply()
    assert rig.emu.route(rig.emu.centre_thz(5)) == Route(2, 1.0)
    rig.wss.block(5)
    assert rig.wss.read_active()[5] == Route(2, BLOCKED_DB)
    assert rig.emu.route(rig.emu.centre_thz(5)) is None


def test_device_refusal_names_device_command_and_fix(rig: Rig) -> None:
    wide = open_driver(rig.server.url, limits=WssLimits(channels=96))
    try:
        with pytest.raises(WssCommandError) as info:
            wide.stage({60: Route(1, 0.0)})  # the driver allows it, the module does not
        assert info.value.code == WssErrorCode.RER
        text = str(info.value)
        assert text.startswith("wss-1: URA (1 channel) refused (RER, range error)")
        assert "first channel and count in the testbed file" in text
        assert wide.identify().serial_number == "WSS-T-0007"
    finally:
        wide.close()


def test_injected_error_line_then_recovers(rig: Rig) -> None:
    rig.wss.stage({1: Route(1, 0.0)})
    rig.emu.faults.error_next = 1
    with pytest.raises(WssCommandError, match="VER"):
        rig.wss.apply()
    assert rig.emu.route(rig.emu.centre_thz(1)) is None  # the RSW was not executed
    rig.wss.apply()
    assert rig.wss.read_active()[1] == Route(1, 0.0)


def test_no_answer_times_out_then_recovers(rig: Rig) -> None:
    rig.emu.faults.no_answer = 1
    with pytest.raises(DeviceTimeout, match="wss-1: SNO\\?"):
        rig.wss.identify()
    assert rig.wss.identify().serial_number == "WSS-T-0007"


def test_dead_module_times_out_every_time(rig: Rig) -> None:
    rig.emu.faults.no_answer_always = True
    for _ in range(2):
        with pytest.raises(DeviceTimeout):
            rig.wss.read_active()
    rig.emu.faults.no_answer_always = False
    assert len(rig.wss.read_active()) == 48


def test_garbage_is_a_protocol_error_then_recovers(rig: Rig) -> None:
    rig.emu.faults.garbage = 1
    with pytest.raises(ProtocolError, match="garbled"):
        rig.wss.read_active()
    rig.wss.stage({3: Route(1, 2.0)})
    rig.wss.apply()
    assert rig.wss.read_active()[3] == Route(1, 2.0)


def test_late_answer_within_timeout_succeeds(rig: Rig) -> None:
    rig.emu.faults.late_s = REPLY_TIMEOUT / 4
    assert rig.wss.identify().serial_number == "WSS-T-0007"


def test_late_answer_beyond_timeout_then_recovers(rig: Rig) -> None:
    rig.emu.faults.late_s = REPLY_TIMEOUT * 1.5
    with pytest.raises(DeviceTimeout):
        rig.wss.stage({2: Route(1, 0.0)})
    rig.emu.faults.late_s = 0.0
    time.sleep(REPLY_TIMEOUT)  # the late reply to the URA arrives meanwhile and is drained
    rig.wss.apply()
    assert rig.wss.read_active()[2] == Route(1, 0.0)


def test_reset_loses_the_command_and_read_back_shows_it(rig: Rig) -> None:
    rig.wss.stage({1: Route(1, 0.0)})
    rig.wss.apply()
    rig.emu.faults.reset_next = True
    with pytest.raises(DeviceTimeout):
        rig.wss.identify()
    assert all(r == BLOCKED for r in rig.wss.read_active().values())


def test_apply_timeout_shorter_than_settle(rig: Rig) -> None:
    rig.emu.settle_s = 0.1
    rig.wss.stage({1: Route(1, 0.0)})
    with pytest.raises(DeviceTimeout, match="RSW"):
        rig.wss.apply(timeout=0.02)
    time.sleep(0.1)  # the late OK arrives meanwhile and is drained before the next command
    assert rig.wss.read_active()[1] == Route(1, 0.0)
    rig.wss.apply(timeout=1.0)
    assert rig.wss.last_settle_s is not None and rig.wss.last_settle_s >= 0.1


def test_command_right_after_apply_timeout_works(rig: Rig) -> None:
    rig.emu.settle_s = 0.1
    rig.wss.stage({6: Route(3, 0.0)})
    with pytest.raises(DeviceTimeout):
        rig.wss.apply(timeout=0.02)
    assert rig.wss.read_active()[6] == Route(3, 0.0)  # the late OK is dropped, not an error
    assert rig.wss.identify().serial_number == "WSS-T-0007"


def test_shared_between_threads(rig: Rig) -> None:
    errors: list[BaseException] = []

    def worker(channel: int) -> None:
        try:
            for i in range(5):
                rig.wss.stage({channel: Route(1 + i % 4, 0.0)})
                rig.wss.read_active()
        except BaseException as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(ch,)) for ch in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not errors
    rig.wss.apply()
    assert all(rig.wss.read_active()[ch] == Route(1, 0.0) for ch in range(1, 7))


def test_close_leaves_optical_state(rig: Rig) -> None:
    with open_driver(rig.server.url) as wss:
        wss.stage({4: Route(2, 0.0)})
        wss.apply()
    assert rig.emu.active_table()[4] == Route(2, 0.0)
    assert rig.emu.route(rig.emu.centre_thz(4)) == Route(2, 0.0)


# --- port 99, multi-line RRA?, UCA, flexgrid, RES, checksum framing --------------------------------

def test_port_99_written_read_back_and_restored(rig: Rig) -> None:
    before = rig.wss.read_active()
    assert before[3] == BLOCKED  # power-up: blocked by port and attenuation
    rig.wss.stage({3: Route(2, 0.0), 4: Route(99, 0.0)})
    rig.wss.apply()
    after = rig.wss.read_active()
    assert after[3] == Route(2, 0.0) and after[4] == Route(99, 0.0)
    assert rig.emu.route(rig.emu.centre_thz(4)) is None  # port 99 carries no light
    rig.wss.stage({ch: before[ch] for ch in (3, 4)})  # what a roll-back does
    rig.wss.apply()
    assert rig.wss.read_active() == before


def test_multi_line_rra_is_joined(rig: Rig) -> None:
    rig.emu.rra_per_line = 5
    rig.wss.stage({1: Route(1, 0.0), 48: Route(4, 2.0)})
    rig.wss.apply()
    active = rig.wss.read_active()
    assert len(active) == 48 and active[48] == Route(4, 2.0)
    assert active == rig.emu.active_table()


def test_uca_switches_without_rsw(rig: Rig) -> None:
    rig.wss.stage({7: Route(1, 0.0)})  # staged, not applied
    rig.wss.update_and_switch({8: Route(3, 1.0)})
    assert rig.wss.last_settle_s is not None and rig.wss.last_settle_s >= SETTLE_S
    active = rig.wss.read_active()
    assert active[8] == Route(3, 1.0) and active[7] == BLOCKED


def test_flexgrid_plan_through_the_driver(rig: Rig) -> None:
    rig.wss.set_channel_width(0)
    assert rig.wss.channel_width() == 0
    assert rig.wss.read_active() == {}
    rig.wss.define_channels({1: (9, 16), 3: (17, 32)})
    assert rig.wss.read_channel_plan() == {1: (9, 16), 3: (17, 32)}
    rig.wss.update_and_switch({1: Route(2, 0.0), 3: Route(3, 0.0)})
    lo, hi = rig.emu.slice_range_thz(17, 32)  # 100 GHz of spectrum for channel 3
    assert rig.emu.route((lo + hi) / 2) == Route(3, 0.0)
    with pytest.raises(WssCommandError) as info:
        rig.wss.update_and_switch({2: Route(1, 0.0)})  # within the numbers, not defined
    assert info.value.code == WssErrorCode.VER
    with pytest.raises(InvalidRouteTable):
        rig.wss.stage({4: Route(1, 0.0)})  # beyond the defined numbers: refused unsent
    rig.wss.set_channel_width(100)
    assert rig.wss.channel_width() == 100 and len(rig.wss.read_active()) == 48
    rig.wss.stage({48: Route(1, 0.0)})  # the configured limits hold again


def test_restart_waits_for_the_module(rig: Rig) -> None:
    rig.wss.stage({1: Route(1, 0.0)})
    rig.wss.apply()
    rig.emu.restart_s = 0.3
    rig.wss.restart(timeout=5.0)
    assert rig.wss.read_active()[1] == BLOCKED  # start-up state SAB: all blocked


def test_restart_in_last_saved_state_keeps_the_routes(rig: Rig) -> None:
    rig.wss.stage({1: Route(1, 0.0)})
    rig.wss.apply()
    rig.emu.startup_state = "SLS"
    rig.wss.restart(timeout=5.0)
    assert rig.wss.read_active()[1] == Route(1, 0.0)


def test_checksum_framing_end_to_end(rig: Rig) -> None:
    with open_driver(rig.server.url, checksum=True) as framed:
        assert framed.identify().serial_number == "WSS-T-0007"
        framed.stage({2: Route(2, 0.5)})
        framed.apply()
        assert framed.read_active()[2] == Route(2, 0.5)
        with pytest.raises(WssCommandError, match="RER"):
            framed.set_channel_width(25)


def test_factory_module_with_factory_limits() -> None:
    emu = WssEmulator(settle_s=SETTLE_S)
    with TcpEmulatorServer(wss_connection_handler(emu), name="wss-factory") as server, \
            open_driver(server.url, limits=WssLimits.factory()) as wss:
        active = wss.read_active()
        assert sorted(active) == list(range(96)) and active[0] == BLOCKED
        wss.stage({0: Route(1, 0.0), 95: Route(4, 0.0)})
        wss.apply()
        assert emu.route(191.35) == Route(1, 0.0) and emu.route(196.10) == Route(4, 0.0)
