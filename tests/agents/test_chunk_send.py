"""A chunk's header and payload leave in one system call where the socket takes both
(`oddl.agents.links.stream_wire.send_head_and_payload`); what it does not take goes on."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from oddl.agents.links.stream_wire import (
    POLL_S,
    ChunkHead,
    node_tag,
    recv_all,
    send_head_and_payload,
)
from oddl.agents.links.streams import StreamLink
from oddl.common.errors import CollectiveError


class _Stingy:
    """A socket that takes at most `most` bytes per call and records what it took."""

    def __init__(self, most: int):
        self.most, self.took, self.calls = most, bytearray(), 0

    def sendmsg(self, parts: tuple[bytes, memoryview]) -> int:
        self.calls += 1
        whole = b"".join(bytes(p) for p in parts)
        self.took += whole[:self.most]
        return min(self.most, len(whole))

    def send(self, data: memoryview) -> int:
        self.calls += 1
        self.took += bytes(data[:self.most])
        return min(self.most, len(data))


@pytest.mark.parametrize("most", [10, 56, 60, 1 << 20])
def test_a_partial_send_goes_on_where_it_stopped(most):
    head = ChunkHead(3, 1, 8, 1000, node_tag("n1")).pack()
    payload = memoryview(np.arange(250, dtype=np.float32)).cast("B")
    sock = _Stingy(most)
    send_head_and_payload(sock, head, payload, 1.0, None, threading.Event())  # type: ignore[arg-type]
    assert bytes(sock.took) == head + payload.tobytes()
    if most >= len(head) + len(payload):
        assert sock.calls == 1, "header and payload in one call"


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        out = socket.create_connection(server.getsockname())
        inn, _ = server.accept()
    return out, inn


def test_a_big_chunk_on_a_small_socket_buffer_arrives_whole():
    out, inn = _tcp_pair()
    try:
        out.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        out.settimeout(POLL_S)  # as the streams' sockets: a send takes what fits
        head = ChunkHead(1, 0, 0, 4 << 20, node_tag("n1")).pack()
        payload = np.random.default_rng(1).integers(0, 255, 4 << 20, dtype=np.uint8)
        got = bytearray(len(head) + payload.size)
        reader = threading.Thread(target=recv_all, args=(inn, memoryview(got)))
        reader.start()
        send_head_and_payload(out, head, memoryview(payload), 30.0, None, threading.Event())
        reader.join(60)
        assert bytes(got) == head + payload.tobytes()
    finally:
        out.close()
        inn.close()


def test_a_receiver_that_takes_nothing_stalls_the_send_with_an_error():
    out, inn = _tcp_pair()
    try:
        out.settimeout(POLL_S)
        head = ChunkHead(1, 0, 0, 64 << 20, node_tag("n1")).pack()
        started = time.monotonic()
        with pytest.raises(CollectiveError, match="took nothing for 0.5 s"):
            send_head_and_payload(out, head, memoryview(bytearray(64 << 20)), 0.5, None,
                                  threading.Event())
        assert time.monotonic() - started < 30
    finally:
        out.close()
        inn.close()


def test_chunks_between_links_arrive_exact_and_in_order():
    a, b = StreamLink("n0", "127.0.0.1:0"), StreamLink("n1", "127.0.0.1:0")
    try:
        a.set_peers({"n1": b.address})
        sent = [np.full(n, i, dtype=np.float32) for i, n in enumerate((1, 256, 300_000))]
        for i, x in enumerate(sent):
            a.send_chunk("j", "n1", ChunkHead(1, i, 0, x.nbytes, node_tag("n1")),
                         memoryview(x).cast("B"), 10.0)
        for i, x in enumerate(sent):
            head, payload = b.recv_chunk("j", "n0", 1, i, time.time() + 30)
            assert head.step == i
            assert np.array_equal(np.frombuffer(payload, dtype=np.float32), x)
    finally:
        a.close()
        b.close()
