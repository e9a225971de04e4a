"""The security layer on loopback: CURVE on ZeroMQ (the `lab` and `other_lab` CAs come from
conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from oddl.common.errors import SecurityError
from oddl.common.security.curve import (
    CurveServer,
    authenticated_user,
    configure_curve_client,
    sender_matches,
    wait_handshake,
)
from oddl.common.security.files import CurveKeys, SecurityFiles
from oddl.common.security.lab_ca import init_lab_ca
from oddl.common.security.tls import tls_channel_credentials

TIMEOUT = 5.0



@pytest.fixture
def zctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def _router(ctx: zmq.Context, curve: CurveServer) -> tuple[zmq.Socket, str]:
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    curve.configure(sock)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def _dealer(ctx: zmq.Context, identity: bytes | None = None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    if identity:
        sock.identity = identity
    return sock


def test_allowed_key_exchanges_messages(lab: SecurityFiles, zctx: zmq.Context) -> None:
    with CurveServer(lab.curve_keys("fabric"), lab.curve_clients(), context=zctx,
                     name="fabric") as curve:
        router, address = _router(zctx, curve)
        dealer = _dealer(zctx, b"n0/tx")
        configure_curve_client(dealer, lab.curve_keys("n0"), lab.curve_public("fabric"))
        wait_handshake(dealer, lambda: dealer.connect(address), TIMEOUT, what="fabric")
        dealer.send_multipart([b"H"])
        assert router.poll(int(TIMEOUT * 1000))
        frames = router.recv_multipart(copy=False)
        assert [bytes(f) for f in frames] == [b"n0/tx", b"H"]
        assert authenticated_user(frames[-1]) == "n0"
        assert sender_matches(bytes(frames[0]), frames[-1])
        router.send_multipart([b"n0/tx", b"H"])
        assert dealer.poll(int(TIMEOUT * 1000))
        assert dealer.recv_multipart() == [b"H"]
        router.close(0)
        dealer.close(0)


def test_unknown_key_and_plain_client_get_nothing(lab: SecurityFiles, other_lab: SecurityFiles,
                                                  zctx: zmq.Context) -> None:
    with CurveServer(lab.curve_keys("fabric"), lab.curve_clients(), context=zctx,
                     name="fabric") as curve:
        router, address = _router(zctx, curve)
        stranger = _dealer(zctx, b"n0")  # another lab's n0 key: not in the allow-list
        configure_curve_client(stranger, other_lab.curve_keys("n0"), lab.curve_public("fabric"))
        with pytest.raises(SecurityError, match="refused this CURVE key"):
            wait_handshake(stranger, lambda: stranger.connect(address), TIMEOUT, what="fabric")
        plain = _dealer(zctx, b"n1")
        with pytest.raises(SecurityError, match="handshake with fabric failed"):
            wait_handshake(plain, lambda: plain.connect(address), TIMEOUT, what="fabric")
        fresh = _dealer(zctx)  # an unknown random key, no handshake wait
        public, secret = zmq.curve_keypair()
        configure_curve_client(fresh, CurveKeys(public, secret), lab.curve_public("fabric"))
        fresh.connect(address)
        for s in (stranger, plain, fresh):
            # a refused connection leaves the DEALER no pipe: a blocking send would wait for
            # ever (or not, as the handshake's timing falls); either way nothing may arrive
            with contextlib.suppress(zmq.Again):
                s.send_multipart([b"H"], flags=zmq.DONTWAIT)
        assert not router.poll(600)
        for s in (stranger, plain, fresh):
            assert not s.poll(100)
            s.close(0)
        router.close(0)


def test_a_node_cannot_send_under_another_identity(lab: SecurityFiles,
                                                   zctx: zmq.Context) -> None:
    with CurveServer(lab.curve_keys("fabric"), lab.curve_clients(), context=zctx,
                     name="fabric") as curve:
        router, address = _router(zctx, curve)
        spoof = _dealer(zctx, b"n1/tx")  # n0's key, n1's identity
        configure_curve_client(spoof, lab.curve_keys("n0"), lab.curve_public("fabric"))
        spoof.connect(address)
        spoof.send_multipart([b"D", b"{}", b"x"])
        assert router.poll(int(TIMEOUT * 1000))
        frames = router.recv_multipart(copy=False)
        assert authenticated_user(frames[-1]) == "n0"
        assert not sender_matches(bytes(frames[0]), frames[-1])
        spoof.close(0)
        router.close(0)


def test_direct_links_share_one_authenticator_per_context(lab: SecurityFiles,
                                                          zctx: zmq.Context) -> None:
    """Two CURVE servers in one process (two nodes' direct links), each with its own key."""
    peers = lab.curve_clients(operators=False)
    s0 = CurveServer(lab.curve_keys("n0"), peers, context=zctx, name="n0-direct")
    s1 = CurveServer(lab.curve_keys("n1"), peers, context=zctx, name="n1-direct")
    r0, a0 = _router(zctx, s0)
    r1, a1 = _router(zctx, s1)
    to0 = _dealer(zctx, b"n1")
    configure_curve_client(to0, lab.curve_keys("n1"), lab.curve_public("n0"))
    to0.connect(a0)
    to1 = _dealer(zctx, b"n0")
    configure_curve_client(to1, lab.curve_keys("n0"), lab.curve_public("n1"))
    to1.connect(a1)
    to0.send_multipart([b"D", b"a"])
    to1.send_multipart([b"D", b"b"])
    assert r0.poll(int(TIMEOUT * 1000)) and r1.poll(int(TIMEOUT * 1000))
    assert r0.recv_multipart() == [b"n1", b"D", b"a"]
    assert r1.recv_multipart() == [b"n0", b"D", b"b"]
    r0.close(0)
    s0.close()
    # the other server keeps authenticating after the first one is gone
    late = _dealer(zctx, b"n2")
    configure_curve_client(late, lab.curve_keys("n2"), lab.curve_public("n1"))
    late.connect(a1)
    late.send_multipart([b"D", b"c"])
    assert r1.poll(int(TIMEOUT * 1000))
    assert r1.recv_multipart() == [b"n2", b"D", b"c"]
    for s in (r1, to0, to1, late):
        s.close(0)
    s1.close()


def test_curve_misuse_names_the_fix(lab: SecurityFiles, zctx: zmq.Context) -> None:
    with pytest.raises(SecurityError, match="secret key"):
        CurveServer(CurveKeys(lab.curve_public("fabric")), {}, context=zctx)
    sock = _dealer(zctx)
    with pytest.raises(SecurityError, match="secret key"):
        configure_curve_client(sock, CurveKeys(lab.curve_public("n0")), lab.curve_public("fabric"))
    sock.close(0)
    with pytest.raises(SecurityError, match="no CURVE key 'n9'"):
        lab.curve_keys("n9")


def test_a_shared_private_key_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = init_lab_ca(tmp_path / "certs", ("n0",))
    files.agent_tls("n0").key.chmod(0o644)
    with caplog.at_level("WARNING", logger="oddl.common.security"):
        tls_channel_credentials(files.agent_tls("n0"))
    assert "chmod 600" in caplog.text and "agent-n0.key" in caplog.text
