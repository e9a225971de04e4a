"""Chunk streams on the light of host ports through the emulated optical circuit switch, end
to end: the real emulator host on a testbed of 3 hosts x 2 ports (as `oddl config new --hosts
3 --ports 2` writes it), the agents' links as an agent opens them, and the switch's connections
made by the real OCS driver on the emulator's SCPI socket. A chunk arrives exactly when a port
of its sender is connected to its receiver, over that port, and is lost, with the reason, when
none is; the same through the fabric process (`transport = "relay"`)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oddl.agents.links.choice import DataLinks, open_links
from oddl.agents.links.light_phy import LightPhy
from oddl.agents.links.stream_wire import ChunkHead, node_tag
from oddl.agents.links.streams import StreamLink
from oddl.agents.links.zeromq import FabricLink
from oddl.common import lighttable
from oddl.common.config import TestbedConfig, load_testbed
from oddl.common.errors import CollectiveError
from oddl.common.lighttable import LightTable, rows_of
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed
from oddl.drivers.ocs import PolatisOcs
from oddl.launch.shapes import Shape, switched

NODES = ("n0", "n1", "n2")


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[EmulatedTestbed]:
    path = tmp_path / "switched-3x2.toml"
    path.write_text(switched(Shape(3, ports=2)), encoding="utf-8")
    tb = start_emulated_testbed(load_testbed(path))
    try:
        yield tb
    finally:
        tb.close()


@pytest.fixture
def links(bed: EmulatedTestbed) -> Iterator[dict[str, DataLinks]]:
    opened = {n: open_links(bed.resolved, n, "127.0.0.1:0", None) for n in NODES}
    for link in opened.values():
        link.set_peers({n: other.address for n, other in opened.items()})
    try:
        yield opened
    finally:
        for link in opened.values():
            link.close()


@pytest.fixture
def switch(bed: EmulatedTestbed) -> Iterator[PolatisOcs]:
    with PolatisOcs.open(bed.resolved.device("ocs0").resource, name="ocs0",
                         timeout=5.0) as ocs:
        yield ocs


def ports(cfg: TestbedConfig) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(node, port) -> (its ingress, its egress, its light table row)."""
    rows = {(r.node, r.port): i for i, r in enumerate(rows_of(cfg))}
    return {(pl.node, pl.port): (pl.ingress, pl.egress, rows[(pl.node, pl.port)])
            for pl in cfg.port_links()}


def connect(bed: EmulatedTestbed, switch: PolatisOcs,
            table: dict[tuple[str, int], tuple[str, int]]) -> None:
    """Make `table` ({(src node, port): (dst node, port)}) the switch's whole table through the
    driver, and wait until the light table shows every connection made."""
    wiring = ports(bed.cfg)
    target = {wiring[src][0]: wiring[dst][1] for src, dst in table.items()}
    assert switch.apply_verified(target) == target
    assert bed.light is not None
    deadline = time.monotonic() + 10.0
    for src, dst in table.items():
        while bed.light.at(wiring[src][2], time.monotonic())[1] != wiring[dst][2]:
            assert time.monotonic() < deadline, bed.light.timeline(wiring[src][2])
            time.sleep(0.005)


def send(link: DataLinks, dst: str, seq: int, payload: bytes) -> None:
    """What a collective on the circuit network calls (optical=True: on the light)."""
    assert isinstance(link.link, StreamLink)
    link.link.send_chunk("j", dst, ChunkHead(seq, 0, 0, len(payload), node_tag(dst)),
                         memoryview(payload), 10.0, None, optical=True)


def recv(link: DataLinks, src: str, seq: int, wait_s: float = 10.0) -> tuple[ChunkHead, bytes]:
    assert isinstance(link.link, StreamLink)
    head, payload = link.link.recv_chunk("j", src, seq, 0, time.time() + wait_s)
    return head, bytes(payload)


def test_the_agents_run_streams_on_the_port_light(bed: EmulatedTestbed,
                                                  links: dict[str, DataLinks]) -> None:
    phy = links["n0"].phy
    assert phy is not None and len(phy.mine) == 2
    assert links["n0"].data_path == "tcp streams on the emulated light"


def test_chunks_arrive_over_the_connected_port_only(
        bed: EmulatedTestbed, links: dict[str, DataLinks], switch: PolatisOcs) -> None:
    wiring = ports(bed.cfg)
    connect(bed, switch, {("n0", 1): ("n1", 1), ("n0", 2): ("n2", 2)})
    send(links["n0"], "n1", 1, b"a" * 5000)
    send(links["n0"], "n2", 1, b"b" * 7000)
    head, payload = recv(links["n1"], "n0", 1)
    assert payload == b"a" * 5000
    assert (head.tx, head.rx) == (wiring[("n0", 1)][2], wiring[("n1", 1)][2])
    head, payload = recv(links["n2"], "n0", 1)
    assert payload == b"b" * 7000
    assert (head.tx, head.rx) == (wiring[("n0", 2)][2], wiring[("n2", 2)][2])
    # n1's ports are connected to nothing: its chunk for n0 is lost where it left
    send(links["n1"], "n0", 1, b"c" * 100)
    with pytest.raises(CollectiveError, match="lost data: nothing from n1"):
        recv(links["n0"], "n1", 1, wait_s=0.5)
    assert links["n1"].phy is not None
    assert links["n1"].phy.lost_by_reason == {
        "n1: no port's light reaches n0 (p1 dark: ocs0 ingress 3 is not connected, "
        "p2 dark: ocs0 ingress 4 is not connected)": 1}


def test_a_reconfiguration_moves_the_chunks(
        bed: EmulatedTestbed, links: dict[str, DataLinks], switch: PolatisOcs) -> None:
    connect(bed, switch, {("n0", 1): ("n1", 1)})
    send(links["n0"], "n1", 1, b"x" * 1000)
    assert recv(links["n1"], "n0", 1)[1] == b"x" * 1000
    connect(bed, switch, {("n0", 1): ("n2", 1)})  # the switch moves n0.p1 to n2
    send(links["n0"], "n1", 2, b"y" * 1000)
    with pytest.raises(CollectiveError, match="lost data: nothing from n0"):
        recv(links["n1"], "n0", 2, wait_s=0.5)
    assert links["n0"].phy is not None
    assert links["n0"].phy.lost_by_reason == {
        "n0: no port's light reaches n1 (p1→n2, p2 dark: ocs0 ingress 2 is not connected)": 1}
    send(links["n0"], "n2", 2, b"z" * 1000)
    assert recv(links["n2"], "n0", 2)[1] == b"z" * 1000


def test_a_connection_broken_under_a_chunk_loses_it(
        bed: EmulatedTestbed, switch: PolatisOcs) -> None:
    """A chunk on the wire for 1 s; the switch breaks its connection right after it left."""
    cfg = bed.resolved
    assert bed.light is not None
    rate = 8 * 50_000 / 1.0
    streams = {n: StreamLink(n, "127.0.0.1:0", phy=LightPhy(
        LightTable.open(bed.light.path), NODES, n, rate, rows=rows_of(cfg))) for n in NODES}
    for link in streams.values():
        link.set_peers({n: other.address for n, other in streams.items()})
    try:
        connect(bed, switch, {("n0", 1): ("n1", 1)})
        got: list[object] = []

        def receive() -> None:
            try:
                got.append(streams["n1"].recv_chunk("j", "n0", 1, 0, time.time() + 5))
            except CollectiveError as exc:
                got.append(exc)

        reader = threading.Thread(target=receive)
        reader.start()
        streams["n0"].send_chunk("j", "n1", ChunkHead(1, 0, 0, 50_000, node_tag("n1")),
                                 memoryview(b"z" * 50_000), 10.0, None, optical=True)
        phy = streams["n0"].phy
        assert isinstance(phy, LightPhy)
        chunk_end = max(phy._tx_free.values())
        bed.circuit_switches["ocs0"].handle_line(":OXC:SWIT:CONN:SUB (@1)")
        broke_at = time.monotonic()
        reader.join(60)
        if broke_at < chunk_end:  # the connection broke while the chunk was on the wire
            assert isinstance(got[0], CollectiveError)
            assert "the light path from n0.p1 changed during the chunk" in str(got[0])
        else:  # this machine stalled for the chunk's whole 1 s: it crossed intact
            assert not isinstance(got[0], CollectiveError)
    finally:
        for link in streams.values():
            link.close()


def test_the_relay_carries_frames_over_the_connected_port(
        bed: EmulatedTestbed, switch: PolatisOcs) -> None:
    """`transport = "relay"`: the fabric process picks the port the same way."""
    cfg = bed.resolved
    relay = dataclasses.replace(cfg, fabric=dataclasses.replace(cfg.fabric, transport="relay"))
    opened = {n: open_links(relay, n, "127.0.0.1:0", None) for n in NODES}
    try:
        assert all(isinstance(link.link, FabricLink) for link in opened.values())
        connect(bed, switch, {("n0", 2): ("n1", 1)})
        send_relay(opened["n0"], "n1", 1, b"r" * 3000)
        frame = opened["n1"].link.inbox.take(("j", 1, 0, "n0"), time.time() + 10)
        assert frame is not None and bytes(frame.payload) == b"r" * 3000
        send_relay(opened["n0"], "n2", 1, b"s" * 10)
        assert opened["n2"].link.inbox.take(("j", 1, 0, "n0"), time.time() + 0.5) is None
        assert bed.fabric is not None
        reason = ("no port's light reaches n2 (p1 dark: ocs0 ingress 1 is not connected, "
                  "p2→n1)")
        assert bed.fabric.stats.lost == {reason: 1}
    finally:
        for link in opened.values():
            link.close()


def send_relay(link: DataLinks, dst: str, seq: int, payload: bytes) -> None:
    assert isinstance(link.link, FabricLink)
    link.link.send_chunk("j", dst, ChunkHead(seq, 0, 0, len(payload), node_tag(dst)),
                         memoryview(payload), 10.0, None, optical=True)


def test_the_emulator_host_lights_nothing_before_a_connection(bed: EmulatedTestbed) -> None:
    assert bed.light is not None
    now = time.monotonic()
    assert all(bed.light.at(i, now)[1] == lighttable.NOT_CONNECTED for i in range(6))
