"""The emulated physical layer of a host with several ports on a circuit switch: a chunk goes
on the port whose light reaches its destination, each port is paced on its own (four ports
carry four times one port), a chunk for a node no port reaches is lost with what each port
reaches, a connection that changes under a chunk loses it, and each receiving port is paced
on its own. Time is a hand clock that moves only when the phy sleeps: no wall time."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeClock

from oddl.agents.links.light_phy import IDEAL_EPOCH, LightPhy
from oddl.agents.links.stream_wire import HEAD_BYTES, MAGIC, NO_ROW, ChunkHead, Sent, node_tag
from oddl.common import lighttable
from oddl.common.lighttable import LightTable, Row

NODES = ("n0", "n1", "n2", "n3", "n4")
PORTS = 4
ROWS = tuple(Row(n, p, "ocs0", PORTS * k + p) for k, n in enumerate(NODES)
             for p in range(1, PORTS + 1))
CHUNK = 1_000_000 - HEAD_BYTES
RATE = 8e6  # a chunk of CHUNK bytes (with its header) is on the wire for 1 s


def row(node: str, port: int) -> int:
    return ROWS.index(next(r for r in ROWS if (r.node, r.port) == (node, port)))


@pytest.fixture
def table(tmp_path: Path) -> Iterator[LightTable]:
    t = LightTable.create(len(ROWS), directory=tmp_path)
    stop = threading.Event()

    def beat() -> None:  # the writer's heartbeat, as the emulator host keeps it
        while not stop.wait(0.1):
            t.beat()

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    yield t
    stop.set()
    beater.join()
    t.close()


def connect(table: LightTable, clock: FakeClock, src: tuple[str, int],
            dst: tuple[str, int] | None) -> None:
    """From now, `src`'s port light reaches `dst`'s port (None: not connected)."""
    code = row(*dst) if dst is not None else lighttable.NOT_CONNECTED
    table.write(row(*src), [(clock(), code)], clock())


def phy(table: LightTable, node: str, clock: FakeClock) -> LightPhy:
    return LightPhy(table, NODES, node, RATE, clock=clock, rows=ROWS, sleep=clock.sleep)


def head_of(sent: Sent, dst: str) -> ChunkHead:
    return sent.stamp(ChunkHead(1, 0, 0, CHUNK, node_tag(dst)))


def wire_n0(table: LightTable, clock: FakeClock) -> None:
    """n0: p1 -> n1, p2 -> n2, p3 not connected, p4 -> n4 (each into the peer's p1)."""
    connect(table, clock, ("n0", 1), ("n1", 1))
    connect(table, clock, ("n0", 2), ("n2", 1))
    connect(table, clock, ("n0", 3), None)
    connect(table, clock, ("n0", 4), ("n4", 1))


def test_a_chunk_goes_on_the_port_whose_light_reaches_its_node(table: LightTable) -> None:
    clock = FakeClock()
    wire_n0(table, clock)
    sent = phy(table, "n0", clock).transmit("n0", "n2", CHUNK, None)
    assert (sent.to, sent.reason) == ("n2", "")
    assert (sent.tx, sent.rx) == (row("n0", 2), row("n2", 1))
    assert sent.t_end - sent.t_start == pytest.approx(1.0)


def test_no_port_reaching_the_node_loses_the_chunk_naming_each_port(table: LightTable) -> None:
    clock = FakeClock()
    wire_n0(table, clock)
    sent = phy(table, "n0", clock).transmit("n0", "n3", CHUNK, None)
    assert sent.to is None
    assert sent.reason == ("no port's light reaches n3 (p1→n1, p2→n2, "
                           "p3 dark: ocs0 ingress 3 is not connected, p4→n4)")


def test_ports_are_paced_each_on_its_own(table: LightTable) -> None:
    clock = FakeClock()
    wire_n0(table, clock)
    connect(table, clock, ("n0", 3), ("n3", 1))
    sender = phy(table, "n0", clock)
    start = clock()
    # four chunks to four nodes leave at once, on four ports
    spread = [sender.transmit("n0", dst, CHUNK, None) for dst in ("n1", "n2", "n3", "n4")]
    assert sorted(s.tx for s in spread) == [row("n0", p) for p in range(1, 5)]
    assert [s.t_start for s in spread] == [start] * 4
    assert max(s.t_end for s in spread) == pytest.approx(start + 1.0)
    # four chunks to one node take one port four times as long
    one = [sender.transmit("n0", "n1", CHUNK, None) for _ in range(4)]
    assert {s.tx for s in one} == {row("n0", 1)}
    assert [s.t_start - start for s in one] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert clock() - start == pytest.approx(4.0)  # it waited for its own port only


def test_two_ports_to_one_node_share_its_chunks(table: LightTable) -> None:
    clock = FakeClock()
    wire_n0(table, clock)
    connect(table, clock, ("n0", 4), ("n1", 2))
    sender = phy(table, "n0", clock)
    sent = [sender.transmit("n0", "n1", CHUNK, None) for _ in range(4)]
    assert [s.tx for s in sent] == [row("n0", p) for p in (1, 4, 1, 4)]
    assert [s.rx for s in sent] == [row("n1", p) for p in (1, 2, 1, 2)]


def test_a_connection_that_changes_under_a_chunk_loses_it(table: LightTable) -> None:
    clock = FakeClock()
    wire_n0(table, clock)
    sender, receiver = phy(table, "n0", clock), phy(table, "n1", clock)
    kept = sender.transmit("n0", "n1", CHUNK, None)
    assert receiver.receive("n0", head_of(kept, "n1"), clock(), None) == ""
    moved = sender.transmit("n0", "n1", CHUNK, None)
    # the switch starts moving n0.p1 halfway through the chunk
    table.write(row("n0", 1), [(clock(), row("n1", 1)),
                               (moved.t_start + 0.5, lighttable.SWITCHING),
                               (moved.t_start + 0.5 + 0.025, row("n3", 1))], clock())
    reason = receiver.receive("n0", head_of(moved, "n1"), clock(), None)
    assert reason == "the light path from n0.p1 changed during the chunk"
    assert receiver.lost_by_reason == {reason: 1}


def test_receiving_ports_are_paced_each_on_its_own(table: LightTable) -> None:
    clock = FakeClock()
    connect(table, clock, ("n1", 1), ("n0", 1))
    connect(table, clock, ("n2", 1), ("n0", 2))
    receiver = phy(table, "n0", clock)
    start = clock()
    a = phy(table, "n1", clock).transmit("n1", "n0", CHUNK, None)
    b = phy(table, "n2", clock).transmit("n2", "n0", CHUNK, None)
    assert receiver.receive("n1", head_of(a, "n0"), start, None) == ""
    assert receiver.receive("n2", head_of(b, "n0"), start, None) == ""
    assert clock() - start == pytest.approx(1.0)  # two ports received at once
    # two chunks into one port (the ideal network's, p1, as fast as a host's ports together)
    # at once: the second waits its turn
    ports = sum(1 for r in ROWS if r.node == "n1")
    start = clock()
    c = phy(table, "n1", clock).transmit("n1", "n0", CHUNK, None, on_light=False)
    d = phy(table, "n2", clock).transmit("n2", "n0", CHUNK, None, on_light=False)
    assert c.rx == d.rx == row("n0", 1) and c.t_start == d.t_start == start
    assert receiver.receive("n1", head_of(c, "n0"), start, None) == ""
    assert receiver.receive("n2", head_of(d, "n0"), start, None) == ""
    assert clock() - start == pytest.approx(2.0 / ports)


def test_a_chunk_naming_another_nodes_transmitter_is_refused(table: LightTable) -> None:
    clock = FakeClock()
    connect(table, clock, ("n1", 1), ("n0", 1))
    sent = phy(table, "n1", clock).transmit("n1", "n0", CHUNK, None)
    head = head_of(sent, "n0")
    forged = ChunkHead(head.seq, head.step, head.offset, head.nbytes, head.dst_tag,
                       head.epoch, head.t_start, head.t_end, row("n2", 1), head.rx)
    reason = phy(table, "n0", clock).receive("n1", forged, clock(), None)
    assert reason.startswith("a chunk from n1 names transmitter row 8, not one of n1's")


def test_the_ideal_network_ignores_the_light_on_a_ported_host(table: LightTable) -> None:
    clock = FakeClock()
    sent = phy(table, "n0", clock).transmit("n0", "n3", CHUNK, None, on_light=False)
    assert (sent.to, sent.epoch, sent.tx, sent.rx) == ("n3", IDEAL_EPOCH, row("n0", 1),
                                                       row("n3", 1))
    assert phy(table, "n3", clock).receive("n0", head_of(sent, "n3"), clock(), None) == ""
    one_port = 8.0 * (CHUNK + HEAD_BYTES) / RATE
    ports = sum(1 for r in ROWS if r.node == "n0")
    assert ports > 1
    assert sent.t_end - sent.t_start == pytest.approx(one_port / ports)  # all its ports' rate


def test_a_wss_host_still_sends_where_its_one_light_goes(tmp_path: Path) -> None:
    clock = FakeClock()
    table = LightTable.create(3, directory=tmp_path)
    try:
        table.write(0, [(clock(), 1)], clock())  # n0's laser reaches n1
        wss = LightPhy(table, ("n0", "n1", "n2"), "n0", RATE, clock=clock, sleep=clock.sleep)
        sent = wss.transmit("n0", "n2", CHUNK, None)
        assert (sent.to, sent.tx, sent.rx) == ("n1", 0, 1)  # misdirected, as before
        table.write(0, [(clock(), lighttable.DARK)], clock())
        dark = wss.transmit("n0", "n1", CHUNK, None)
        assert dark.to is None and dark.reason == lighttable.REASONS[lighttable.DARK]
    finally:
        table.close()


def test_a_table_of_another_testbed_is_refused(table: LightTable) -> None:
    with pytest.raises(ValueError, match="has 20 transmitter rows, the testbed file 5"):
        LightPhy(table, NODES, "n0", RATE)


# ---- the chunk header --------------------------------------------------------------------
def test_the_chunk_header_carries_the_rows_and_refuses_version_1() -> None:
    head = ChunkHead(7, 2, 4096, 1000, node_tag("n1"), 5, 1.5, 2.5, tx=3, rx=17)
    raw = head.pack()
    assert len(raw) == HEAD_BYTES == 56 and raw[:4] == MAGIC
    assert ChunkHead.unpack(raw) == head
    assert ChunkHead(1, 0, 0, 0, 0).tx == NO_ROW  # direct links name no row
    old = struct.pack("<4sIIQQIIdd", b"ODC1", 7, 2, 4096, 1000, 0, 5, 1.5, 2.5)
    with pytest.raises(ValueError, match="version 1 .* older oddl; run the same oddl version"):
        ChunkHead.unpack(old + b"\0" * 4)
    with pytest.raises(ValueError, match="a chunk header of 52 B"):
        ChunkHead.unpack(old)
