"""The stream data plane on the emulated light: chunks go where the emulated lasers and WSS
send the light, at the line rate, and are lost when the path changes under them."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from oddl.agents.links.light_phy import LightPhy
from oddl.agents.links.stream_wire import ChunkHead, node_tag
from oddl.agents.links.streams import StreamLink
from oddl.common import lighttable
from oddl.common.config import load_testbed
from oddl.common.errors import CollectiveError
from oddl.common.lighttable import LightTable
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "testbeds" / "emulated-4node.toml"
NODES = ("n0", "n1", "n2", "n3")


# ---- the light table alone --------------------------------------------------------------
def test_timeline_withdraws_only_the_future(tmp_path):
    table = LightTable.create(2, tmp_path)
    try:
        assert table.at(0, 0.0)[1] == lighttable.DARK
        table.write(0, [(10.0, lighttable.DARK), (12.0, 1)], now=10.0)  # dark until locked
        assert table.at(0, 11.0)[1] == lighttable.DARK and table.at(0, 12.5)[1] == 1
        table.write(0, [(11.0, lighttable.DARK), (13.0, 1)], now=11.0)  # a new command
        assert table.at(0, 12.5)[1] == lighttable.DARK and table.at(0, 13.5)[1] == 1
        epoch, dst = table.at(0, 13.5)
        assert table.held(0, epoch, 20.0)
        table.write(0, [(14.0, lighttable.BLOCKED)], now=14.0)
        assert not table.held(0, epoch, 14.5)  # changed under a chunk ending at 14.5
        assert table.held(0, epoch, 13.9)
        reader = LightTable.open(table.path)
        assert reader.timeline(0) == table.timeline(0)
        reader.close()
    finally:
        table.close()
    assert not table.path.exists()


def test_a_table_whose_writer_died_has_no_light(tmp_path):
    table = LightTable.create(1, tmp_path)
    try:
        table.write(0, [(0.0, 0)], now=0.0)
        assert table.at(0, 1.0)[1] == 0
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
        table._writer[0] = int(gone.stdout)  # a process that has exited
        table._alive_checked = (0.0, True)
        assert table.at(0, 1.0)[1] == lighttable.GONE
        assert not table.held(0, 1, 1.0)
    finally:
        table.close()


def test_not_a_light_table(tmp_path):
    bogus = tmp_path / "bogus"
    bogus.write_bytes(b"x" * 4096)
    with pytest.raises(ValueError, match="not a light table"):
        LightTable.open(bogus)


# ---- streams on the emulated devices ----------------------------------------------------
@pytest.fixture
def emulated() -> Iterator[EmulatedTestbed]:
    tb = start_emulated_testbed(load_testbed(CONFIG))
    yield tb
    tb.close()


def _links(tb: EmulatedTestbed, rate_bps: float) -> dict[str, StreamLink]:
    assert tb.light is not None
    links = {n: StreamLink(n, "127.0.0.1:0",
                           phy=LightPhy(LightTable.open(tb.light.path), NODES, n, rate_bps))
             for n in NODES}
    for link in links.values():
        link.set_peers({n: other.address for n, other in links.items()})
    return links


def _light(tb: EmulatedTestbed, laser: str, channel: int) -> None:
    """Tune an emulated laser (over its frame interface) and route channels 1-4 to ports 1-4."""
    from oddl.drivers.itla_frames import encode_request

    emu = tb.lasers[laser]
    emu.handle_frame(encode_request(0x32, 0x00, write=True))
    emu.handle_frame(encode_request(0x30, channel, write=True))
    emu.handle_frame(encode_request(0x32, 0x08, write=True))
    wss = tb.switches["wss0"]
    wss.handle_line("URA 1,1,0.0;2,2,0.0;3,3,0.0;4,4,0.0")
    wss.handle_line("RSW")


def _wait_path(tb: EmulatedTestbed, src: int, dst: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while tb.light.at(src, time.monotonic())[1] != dst:
        assert time.monotonic() < deadline, tb.light.timeline(src)
        time.sleep(0.01)


def _send(link: StreamLink, dst: str, seq: int, payload: bytes, optical: bool = True) -> None:
    link.send_chunk("j", dst, ChunkHead(seq, 0, 0, len(payload), node_tag(dst)),
                    memoryview(payload), 10.0, None, optical)


def test_chunks_go_where_the_light_goes(emulated):
    tb = emulated
    links = _links(tb, 1e9)
    try:
        _light(tb, "laser0", 2)  # channel 2 = n1's receiver
        _wait_path(tb, 0, 1)
        _send(links["n0"], "n1", 1, b"a" * 1000)
        head, payload = links["n1"].recv_chunk("j", "n0", 1, 0, time.time() + 10)
        assert bytes(payload) == b"a" * 1000 and head.nbytes == 1000
        # the schedule says n2, the light goes to n1: n1 gets it and drops it as misrouted,
        # n2 hears nothing and reports lost data
        _send(links["n0"], "n2", 2, b"b" * 1000)
        with pytest.raises(CollectiveError, match="lost data: nothing from n0"):
            links["n2"].recv_chunk("j", "n0", 2, 0, time.time() + 0.5)
        with pytest.raises(CollectiveError, match="misrouted"):
            links["n1"].recv_chunk("j", "n0", 2, 0, time.time() + 2)
        assert links["n1"].misrouted == 1
        # and the sender says where its chunk went (nothing tells n2)
        assert links["n0"].phy is not None and links["n0"].phy.misdirected_chunks == 1
        # the ideal network ignores the light: named destination
        _send(links["n0"], "n3", 3, b"c" * 10, optical=False)
        assert bytes(links["n3"].recv_chunk("j", "n0", 3, 0, time.time() + 10)[1]) == b"c" * 10
        # a chunk on the emulated light is checked once it is in: nothing lands in place
        assert not links["n1"].post_landing("j", "n0", (4, 0, 0), memoryview(bytearray(10)))
    finally:
        for link in links.values():
            link.close()


def test_a_dark_transmitter_sends_nothing(emulated):
    links = _links(emulated, 1e9)
    try:
        _send(links["n0"], "n1", 1, b"x" * 100)  # laser0 never lit
        with pytest.raises(CollectiveError, match="lost data"):
            links["n1"].recv_chunk("j", "n0", 1, 0, time.time() + 0.5)
        assert links["n0"].phy.lost_by_reason  # counted where the light went nowhere
        assert emulated.fabric.stream_stats()["lost"] >= 1
    finally:
        for link in links.values():
            link.close()


def test_a_retune_under_a_chunk_loses_it(emulated):
    tb = emulated
    rate = 8 * 50_000 / 2.0  # a 50 kB chunk is on the wire for 2 s
    links = _links(tb, rate)
    try:
        _light(tb, "laser0", 2)
        _wait_path(tb, 0, 1)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(_recv_or_error(links["n1"])))
        t.start()
        _send(links["n0"], "n1", 1, b"z" * 50_000)
        from oddl.drivers.itla_frames import encode_request

        tb.lasers["laser0"].handle_frame(encode_request(0x30, 3, write=True))  # retune now
        t.join(30)
        assert isinstance(got[0], CollectiveError)
        assert "changed during the chunk" in str(got[0])
    finally:
        for link in links.values():
            link.close()


def _recv_or_error(link: StreamLink) -> object:
    try:
        return link.recv_chunk("j", "n0", 1, 0, time.time() + 8)
    except CollectiveError as exc:
        return exc


def test_the_transmitter_is_paced_at_the_line_rate(emulated):
    tb = emulated
    rate = 8 * 100_000 / 0.1  # 100 kB per 0.1 s
    links = _links(tb, rate)
    try:
        _light(tb, "laser0", 2)
        _wait_path(tb, 0, 1)
        data = np.zeros(100_000, dtype=np.uint8).tobytes()
        start = time.monotonic()
        for seq in range(1, 6):
            _send(links["n0"], "n1", seq, data)
            links["n1"].recv_chunk("j", "n0", seq, 0, time.time() + 10)
        # five chunks cannot cross faster than the wire carries them (never early)
        assert time.monotonic() - start >= 5 * 0.1
    finally:
        for link in links.values():
            link.close()


def test_an_agent_without_the_light_table_refuses_to_start_and_says_why(tmp_path):
    from dataclasses import replace

    from oddl.agents.links.choice import light_phy as _light_phy
    from oddl.common.errors import OddlError

    cfg = load_testbed(CONFIG)
    missing = replace(cfg, fabric=replace(cfg.fabric, light_table=str(tmp_path / "gone")))
    with pytest.raises(OddlError, match='transport = "relay"'):
        _light_phy(missing, "n0")
    relay = replace(cfg, fabric=replace(cfg.fabric, transport="relay",
                                        light_table=str(tmp_path / "gone")))
    assert _light_phy(relay, "n0") is None


def test_a_forgotten_job_closes_its_streams_and_a_new_collective_reconnects():
    a, b = StreamLink("n0", "127.0.0.1:0"), StreamLink("n1", "127.0.0.1:0")
    try:
        a.set_peers({"n1": b.address})
        _send(a, "n1", 1, b"x" * 10, optical=False)
        assert bytes(b.recv_chunk("j", "n0", 1, 0, time.time() + 10)[1]) == b"x" * 10
        b.forget_job("j")
        a.forget_job("j")
        assert not any(k[0] == "j" for k in b._in)
        _send(a, "n1", 2, b"y" * 10, optical=False)  # a fresh connection
        assert bytes(b.recv_chunk("j", "n0", 2, 0, time.time() + 10)[1]) == b"y" * 10
    finally:
        a.close()
        b.close()


def test_connect_opens_a_jobs_streams_before_its_first_chunk():
    a, b, c = (StreamLink(n, "127.0.0.1:0") for n in ("n0", "n1", "n2"))
    try:
        a.set_peers({"n1": b.address, "n2": c.address})
        a.connect("j")
        opened = {dst: a._out[("j", dst)] for dst in ("n1", "n2")}
        _send(a, "n1", 1, b"x" * 10, optical=False)
        assert bytes(b.recv_chunk("j", "n0", 1, 0, time.time() + 10)[1]) == b"x" * 10
        assert a._out[("j", "n1")] is opened["n1"], "the chunk went on the opened stream"
        c.close()  # a peer that is gone is named
        a.set_peers({"n2": "127.0.0.1:1"})
        with pytest.raises(CollectiveError, match="cannot reach n2"):
            a.connect("k")
    finally:
        for link in (a, b, c):
            link.close()


def test_a_killed_hosts_light_table_is_swept_at_the_next_start(tmp_path):
    """An emulator host killed with SIGKILL cannot remove its table; the next one to create a
    table in that folder removes it, and leaves a live host's table alone."""
    live = LightTable.create(2, tmp_path)
    script = ("import sys, time; from oddl.common.lighttable import LightTable; "
              "t = LightTable.create(2, sys.argv[1]); print(t.path, flush=True); time.sleep(60)")
    with subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                          stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        orphan = Path(child.stdout.readline().strip())
        child.kill()
    assert orphan.exists()
    # its heartbeat goes stale after STALE_S; until then it counts as live (no removal)
    deadline = time.monotonic() + 30
    fresh = None
    while time.monotonic() < deadline:
        removed = lighttable.sweep_dead_tables(tmp_path)
        if removed:
            assert removed == [orphan]
            break
        time.sleep(0.2)
    try:
        fresh = LightTable.create(2, tmp_path)
        assert not orphan.exists()
        assert live.path.exists() and fresh.path.exists()
    finally:
        live.close()
        if fresh is not None:
            fresh.close()
