"""Posted landings on the stream link (decision record 0039): a chunk posted before it
arrives is read straight into its place, everything else into the link's buffers, and a run
that ends while a chunk is landing leaves nothing that could land later."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest
from loopback_ranks import loopback_links, on_every_rank, step_specs

from oddl.agents.collective.chunks import chunk_plan
from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.plan_run import run_collective
from oddl.agents.links.stream_wire import CHUNK_BYTES, HELLO, ChunkHead, node_tag, parse_address
from oddl.agents.links.streams import StreamLink
from oddl.agents.slot_gate import SlotGate
from oddl.controller.scheduling import make_plan


@pytest.fixture
def pair() -> Iterator[tuple[StreamLink, StreamLink]]:
    a, b = StreamLink("n0", "127.0.0.1:0"), StreamLink("n1", "127.0.0.1:0")
    a.set_peers({"n1": b.address})
    yield a, b
    a.close()
    b.close()


def _send(link: StreamLink, seq: int, offset: int, payload: bytes) -> None:
    link.send_chunk("j", "n1", ChunkHead(seq, 0, offset, len(payload), node_tag("n1")),
                    memoryview(payload), 10.0)


def test_a_posted_chunk_lands_in_place_and_the_others_in_buffers(pair):
    a, b = pair
    dest = np.zeros(30, dtype=np.uint8)
    assert b.post_landing("j", "n0", (1, 0, 0), dest[0:10].data.cast("B"))
    assert b.post_landing("j", "n0", (1, 0, 20), dest[20:25].data.cast("B"))  # wrong size
    _send(a, 1, 0, b"x" * 10)
    _send(a, 1, 10, b"y" * 10)
    _send(a, 1, 20, b"z" * 10)
    got = []  # a payload is valid until the next call for its source: read each at once
    for _ in range(3):
        payload = b.recv_chunk("j", "n0", 1, 0, time.time() + 10)[1]
        got.append((bytes(payload), np.shares_memory(np.frombuffer(payload, np.uint8), dest)))
    assert got == [(b"x" * 10, True), (b"y" * 10, False), (b"z" * 10, False)]
    assert bytes(dest[:10]) == b"x" * 10
    assert not dest[10:].any(), "only the posted chunk of the right size landed"
    b.end_landings("j", 1)


def test_a_run_that_ends_mid_landing_leaves_nothing_to_land_later(pair):
    a, b = pair
    dest = np.zeros(1 << 16, dtype=np.uint8)
    assert b.post_landing("j", "n0", (1, 0, 0), dest.data.cast("B"))
    raw = socket.create_connection(parse_address(b.address), timeout=10)
    hello = json.dumps({"job": "j", "src": "n0"}).encode()
    raw.sendall(HELLO + struct.pack("<H", len(hello)) + hello)
    raw.sendall(ChunkHead(1, 0, 0, len(dest), node_tag("n1")).pack() + b"\x01" * 1000)
    deadline = time.monotonic() + 30
    while not any(c.landing_seq == 1 for conns in b._in.values() for c in conns):
        assert time.monotonic() < deadline, "the reader never started the landing"
        time.sleep(0.01)
    b.end_landings("j", 1)  # the run failed before it took the chunk
    assert all(c.join(0) for conns in b._in.values() for c in conns), "the reader stopped"
    try:
        raw.sendall(b"\x02" * (len(dest) - 1000))
    except OSError:
        pass  # the receiver closed the stream
    raw.close()
    assert not (dest == 2).any(), "nothing landed after the run ended"
    # the sender's next collective opens a new stream and is read as usual
    a.reset_peer("n1")
    _send(a, 2, 0, b"w" * 10)
    assert bytes(b.recv_chunk("j", "n0", 2, 0, time.time() + 10)[1]) == b"w" * 10


def test_a_posting_not_taken_is_withdrawn_with_its_collective(pair):
    a, b = pair
    dest = np.zeros(10, dtype=np.uint8)
    assert b.post_landing("j", "n0", (1, 0, 0), dest.data.cast("B"))
    b.end_landings("j", 1)  # collective 1 ended (its chunk came before it was posted)
    _send(a, 1, 0, b"q" * 10)  # a late duplicate of collective 1's chunk
    payload = b.recv_chunk("j", "n0", 1, 0, time.time() + 10)[1]
    assert bytes(payload) == b"q" * 10
    assert not dest.any()


def test_the_ring_all_reduce_lands_its_all_gather_half_in_place():
    """Over real stream links, every chunk of the ring's all-gather half comes after this
    node posted it (it carries what this node sent in the reduce-scatter half), so each is
    read straight into the bucket, and the sum stays exact."""
    n, nodes = 4, tuple(f"n{i}" for i in range(4))
    plan = make_plan("ring", n, 3 * 2**17 + 5)
    steps = step_specs(plan.steps)
    rng = np.random.default_rng(5)
    arrays = [rng.integers(-2**20, 2**20, plan.n_elems) for _ in range(n)]
    with loopback_links(nodes) as links:
        def go(r: int) -> object:
            run = CollectiveRun("j", 1, r, nodes, steps, network="ideal", receive_timeout_s=30)
            return run_collective(run, arrays[r], links[nodes[r]], SlotGate())

        outs = on_every_rank(n, go)
        exact = np.sum(arrays, axis=0)
        assert all(isinstance(o, np.ndarray) and np.array_equal(o, exact) for o in outs), outs
        chunk = CHUNK_BYTES // 8
        for r, nd in enumerate(nodes):
            plan_r = chunk_plan(steps, r, chunk)
            copies = sum(1 for op in plan_r.recvs if steps[op.step].op == "copy")
            assert links[nd].landed_chunks == copies > 0
