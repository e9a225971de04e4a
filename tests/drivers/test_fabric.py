"""The emulated optical fabric: frames go where the emulated light goes, and nowhere else."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from fakes import FakeClock
from helpers import wait_until

from oddl.agents.links.zeromq import FabricLink
from oddl.common.config import load_testbed
from oddl.drivers.emulators.fabric import INSERTION_LOSS_DB, Fabric, OpticalModel
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed
from oddl.drivers.interfaces import Route

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "testbeds" / "emulated-4node.toml"


def _frame(i: int, src: str, dst: str, net: str = "optical") -> dict:
    return {"job": "j", "seq": i, "step": 0, "src": src, "dst": dst, "net": net}


@pytest.fixture
def emulated() -> Iterator[EmulatedTestbed]:
    cfg = load_testbed(CONFIG)
    tb = start_emulated_testbed(cfg)
    yield tb
    tb.close()


def _light(tb: EmulatedTestbed, laser: str, channel: int, table: dict[int, int]) -> None:
    """Set an emulated laser and the WSS directly (their protocols are tested elsewhere)."""
    emu = tb.lasers[laser]
    emu.handle_frame(bytes.fromhex("00000000"))
    from oddl.drivers.itla_frames import encode_request

    emu.handle_frame(encode_request(0x30, channel, write=True))
    emu.handle_frame(encode_request(0x32, 0x08, write=True))
    wss = tb.switches["wss0"]
    wss.handle_line("URA " + ";".join(f"{ch},{p},0.0" for ch, p in table.items()))
    wss.handle_line("RSW")


def _wait_lit(tb: EmulatedTestbed, laser: str, timeout: float = 2.0) -> None:
    wait_until(lambda: tb.lasers[laser].optical_output() is not None
               and not tb.switches["wss0"].settling(), timeout, f"{laser} lighting up",
               interval=0.005)


def test_light_path_follows_laser_and_wss(emulated):
    tb = emulated
    model = OpticalModel(tb.cfg, tb.lasers, tb.switches)
    assert model.path("n0").dst is None and "dark" in model.path("n0").reason
    _light(tb, "laser0", 2, {1: 1, 2: 2, 3: 3, 4: 4})
    _wait_lit(tb, "laser0")
    path = model.path("n0")
    assert path.dst == "n1" and path.power_dbm == pytest.approx(10.0 - INSERTION_LOSS_DB, abs=0.5)
    # route channel 2 to n2's port: n2's receiver filter (channel 3) rejects it
    tb.switches["wss0"].handle_line("URA 2,3,0.0")
    tb.switches["wss0"].handle_line("RSW")
    assert model.path("n0").dst is None  # settling
    _wait_lit(tb, "laser0")
    assert "filter" in model.path("n0").reason
    assert model.power_at_port("wss0", 3) == pytest.approx(10.0 - INSERTION_LOSS_DB, abs=0.5)
    assert model.power_at_port("wss0", 2) is None


def test_frames_reach_only_the_lit_receiver(emulated):
    tb = emulated
    _light(tb, "laser0", 2, {1: 1, 2: 2, 3: 3, 4: 4})
    _wait_lit(tb, "laser0")
    links = {n: FabricLink(n, tb.fabric.address) for n in ("n0", "n1", "n2")}
    try:
        links["n0"].send(_frame(1, "n0", "n1"), b"x" * 1000)
        got = links["n1"].inbox.take(("j", 1, 0, "n0"), time.time() + 5)
        assert got is not None and bytes(got.payload) == b"x" * 1000
        # the header says n2, but the light goes to n1: n1 receives it and drops it as misrouted
        links["n0"].send(_frame(2, "n0", "n2"), b"y" * 10)
        assert links["n2"].inbox.take(("j", 2, 0, "n0"), time.time() + 0.3) is None
        deadline = time.time() + 5
        while links["n1"].inbox.misrouted == 0 and time.time() < deadline:
            time.sleep(0.01)
        assert links["n1"].inbox.misrouted == 1
        # laser1 is dark: its frames are lost, and the fabric says why
        links["n1"].send(_frame(3, "n1", "n2"), b"z" * 10)
        assert links["n2"].inbox.take(("j", 3, 0, "n1"), time.time() + 0.3) is None
        assert any("laser1 dark" in k for k in tb.fabric.stats.lost)
        # the ideal network delivers by header, without light
        links["n1"].send(_frame(4, "n1", "n2", "ideal"), b"w" * 10)
        assert links["n2"].inbox.take(("j", 4, 0, "n1"), time.time() + 5) is not None
    finally:
        for link in links.values():
            link.close()


def test_stats_and_malformed_frames(emulated):
    tb = emulated
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, b"n3/tx")
    sock.connect(tb.fabric.address)
    try:
        sock.send_multipart([b"D", b"{not json", b"payload"])
        sock.send_multipart([b"garbage"])
        sock.send_multipart([b"S"])
        assert sock.poll(5000)
        import json

        kind, body = sock.recv_multipart()
        stats = json.loads(body)
        assert kind == b"S"
        assert stats["lost"].get("malformed header") == 1
        assert stats["lost"].get("malformed frame") == 1
    finally:
        sock.close(0)


class _Laser:
    def __init__(self, f: float | None):
        self.f = f

    def optical_output(self, now=None):
        from oddl.drivers.emulators.itla import OpticalOutput

        return None if self.f is None else OpticalOutput(self.f, 10.0)


class _Wss:
    def route(self, frequency_thz, now=None):
        ch = round((frequency_thz - 193.1) * 10) + 1
        return Route(ch, 0.0) if 1 <= ch <= 4 else None


def test_line_rate_and_collisions_with_a_hand_clock():
    cfg = load_testbed(CONFIG)
    lasers = {"laser0": _Laser(193.2), "laser1": _Laser(None), "laser2": _Laser(193.2),
              "laser3": _Laser(None)}
    clock = FakeClock()
    fabric = Fabric(OpticalModel(cfg, lasers, {"wss0": _Wss()}), 1e9, clock=clock)
    links = {n: FabricLink(n, fabric.address) for n in ("n0", "n1", "n2")}
    try:
        links["n0"].send(_frame(1, "n0", "n1"), b"a" * 125_000)  # 1 ms at 1 Gbit/s
        deadline = time.time() + 5
        while fabric.stats.delivered == 0 and time.time() < deadline:
            time.sleep(0.01)
            if clock.t < 1000.001:  # not on the wire long enough yet: nothing may arrive
                assert fabric.stats.delivered == 0
            clock.t += 0.0002
        assert fabric.stats.delivered == 1
        assert links["n1"].inbox.take(("j", 1, 0, "n0"), time.time() + 5) is not None
        # n0 and n2 both on channel 2 at once: both frames collide at n1 and are lost
        links["n0"].send(_frame(2, "n0", "n1"), b"b" * 1000)
        links["n2"].send(_frame(2, "n2", "n1"), b"c" * 1000)
        wait_until(lambda: fabric.in_flight == 2, 10, "both frames on the wire at one time")
        clock.t += 1.0
        deadline = time.time() + 5
        while sum(fabric.stats.lost.values()) < 2 and time.time() < deadline:
            time.sleep(0.01)
        assert sum(v for k, v in fabric.stats.lost.items() if k.startswith("collision")) == 2
    finally:
        for link in links.values():
            link.close()
        fabric.close()
