"""Revoked credentials are refused; data streams in secure mode prove both ends' identity."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from oddl.agents.links.stream_auth import StreamAuth
from oddl.agents.links.stream_wire import ChunkHead, node_tag
from oddl.agents.links.streams import StreamLink
from oddl.common.errors import CollectiveError
from oddl.common.revocation import revoke
from oddl.common.security.authorization import AuthorizationInterceptor
from oddl.common.security.files import SecurityFiles
from oddl.common.security.lab_ca import init_lab_ca
from oddl.common.security.revoked import RevocationList, read_revoked
from oddl.common.security.tls import secure_channel, server_credentials, tls_channel_credentials
from oddl.launch.processes import oddl_command
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

NODES = ("n0", "n1", "n2")


@pytest.fixture
def lab(tmp_path: Path) -> SecurityFiles:
    return init_lab_ca(tmp_path / "certs", NODES, operators=("operator", "alice"))


def _auth(files: SecurityFiles, node: str) -> StreamAuth:
    peers = {n: files.curve_public(n) for n in files.nodes}
    return StreamAuth(node, files.curve_keys(node).secret, peers,
                      revoked=set(read_revoked(files.root).keys))


def _send(link: StreamLink, dst: str, seq: int, payload: bytes) -> None:
    link.send_chunk("j", dst, ChunkHead(seq, 0, 0, len(payload), node_tag(dst)),
                    memoryview(payload), time.time() + 30)


# ---- authenticated streams ------------------------------------------------------------
def test_streams_of_one_lab_carry_data(lab):
    a = StreamLink("n0", "127.0.0.1:0", auth=_auth(lab, "n0"))
    b = StreamLink("n1", "127.0.0.1:0", auth=_auth(lab, "n1"))
    try:
        a.set_peers({"n1": b.address})
        _send(a, "n1", 1, b"g" * 1000)
        assert bytes(b.recv_chunk("j", "n0", 1, 0, time.time() + 30)[1]) == b"g" * 1000
        assert b.refused_auth == 0
    finally:
        a.close()
        b.close()


def test_a_node_of_another_lab_is_refused_both_ways(lab, tmp_path):
    other = init_lab_ca(tmp_path / "other", NODES)
    ours = StreamLink("n1", "127.0.0.1:0", auth=_auth(lab, "n1"))
    intruder = StreamLink("n0", "127.0.0.1:0", auth=_auth(other, "n0"))
    try:
        intruder.set_peers({"n1": ours.address})
        with pytest.raises(CollectiveError, match="failed to prove its identity"):
            _send(intruder, "n1", 1, b"bad")
        with pytest.raises(CollectiveError, match="nothing from n0"):
            ours.recv_chunk("j", "n0", 1, 0, time.time() + 1.0)
    finally:
        ours.close()
        intruder.close()


def test_a_client_without_keys_is_refused(lab):
    ours = StreamLink("n1", "127.0.0.1:0", auth=_auth(lab, "n1"))
    plain = StreamLink("n0", "127.0.0.1:0")
    try:
        plain.set_peers({"n1": ours.address})
        try:
            _send(plain, "n1", 1, b"x" * 10)  # the plain hello goes out; the server refuses it
        except CollectiveError:
            pass  # the refusal (a closed stream) may reach the sender before its chunk is out
        deadline = time.time() + 30
        while ours.refused_auth == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert ours.refused_auth >= 1
        with pytest.raises(CollectiveError, match="nothing from n0"):
            ours.recv_chunk("j", "n0", 1, 0, time.time() + 1.0)
    finally:
        ours.close()
        plain.close()


def test_a_revoked_node_cannot_open_streams(lab):
    revoke(lab.root, node="n0", reason="host decommissioned")
    ours = StreamLink("n1", "127.0.0.1:0", auth=_auth(lab, "n1"))
    revoked = StreamLink("n0", "127.0.0.1:0", auth=_auth(lab, "n0"))
    try:
        revoked.set_peers({"n1": ours.address})
        with pytest.raises(CollectiveError, match="revoked|prove"):
            _send(revoked, "n1", 1, b"x")
    finally:
        ours.close()
        revoked.close()


# ---- revocation of certificates and keys ------------------------------------------------
def test_revoked_keys_leave_the_curve_allow_list(lab):
    before = lab.curve_clients()
    entry = revoke(lab.root, node="n2")
    after = SecurityFiles.load(lab.root).curve_clients()
    assert entry["curve_public"].encode() in before
    assert entry["curve_public"].encode() not in after
    assert len(after) == len(before) - 1
    revoke(lab.root, node="n2")  # twice: still one entry
    assert read_revoked(lab.root).serials == {int(entry["serial"], 16)}


def test_unknown_names_are_refused_with_the_known_ones(lab):
    from oddl.common.errors import SecurityError

    with pytest.raises(SecurityError, match="the nodes are n0, n1, n2"):
        revoke(lab.root, node="n9")
    with pytest.raises(SecurityError, match="the operators are operator, alice"):
        revoke(lab.root, operator="bob")


class _Status(pb_grpc.ControllerServicer):
    def GetStatus(self, request, context):  # noqa: N802
        return pb.Status(testbed="t")


@pytest.fixture
def server(lab) -> Iterator[str]:
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[
        AuthorizationInterceptor(revocations=RevocationList(lab.root))])
    pb_grpc.add_ControllerServicer_to_server(_Status(), srv)
    port = srv.add_secure_port("127.0.0.1:0", server_credentials(lab.root))
    srv.start()
    yield f"127.0.0.1:{port}"
    srv.stop(0).wait(2)


def test_a_running_controller_refuses_a_certificate_once_revoked(lab, server):
    stub = pb_grpc.ControllerStub(secure_channel(
        server, tls_channel_credentials(lab.operator_tls("alice"))))
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=30).testbed == "t"
    result = subprocess.run(oddl_command("certs", "revoke", "--certs", str(lab.root),
                                         "--operator", "alice", "--reason", "left the lab"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "revoked operator alice" in result.stdout
    with pytest.raises(grpc.RpcError) as err:
        stub.GetStatus(pb.GetStatusRequest(), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "revoked" in err.value.details() and "oddl certs rotate" in err.value.details()
    # another operator is not affected
    other = pb_grpc.ControllerStub(secure_channel(
        server, tls_channel_credentials(lab.operator_tls("operator"))))
    assert other.GetStatus(pb.GetStatusRequest(), timeout=30).testbed == "t"


def test_rotation_replaces_an_operator_and_refuses_the_old_certificate(lab, server):
    old_creds = tls_channel_credentials(lab.operator_tls("alice"))
    result = subprocess.run(oddl_command("certs", "rotate", "--certs", str(lab.root),
                                         "--operator", "alice"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "rotated operator alice" in result.stdout
    fresh = SecurityFiles.load(lab.root)
    new_stub = pb_grpc.ControllerStub(secure_channel(
        server, tls_channel_credentials(fresh.operator_tls("alice"))))
    assert new_stub.GetStatus(pb.GetStatusRequest(), timeout=30).testbed == "t"
    old_stub = pb_grpc.ControllerStub(secure_channel(server, old_creds))
    with pytest.raises(grpc.RpcError) as err:
        old_stub.GetStatus(pb.GetStatusRequest(), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_rotated_node_speaks_with_its_new_key_only(lab):
    stale = _auth(lab, "n0")  # the key pair n0 held before the rotation
    from oddl.common.revocation import rotate

    rotate(lab.root, node="n0")
    fresh = SecurityFiles.load(lab.root)
    assert fresh.curve_public("n0") != lab.curve_public("n0")
    assert lab.curve_public("n0") not in fresh.curve_clients()
    ours = StreamLink("n1", "127.0.0.1:0", auth=_auth(fresh, "n1"))
    new = StreamLink("n0", "127.0.0.1:0", auth=_auth(fresh, "n0"))
    old = StreamLink("n0", "127.0.0.1:0", auth=stale)
    try:
        new.set_peers({"n1": ours.address})
        _send(new, "n1", 1, b"new")
        assert bytes(ours.recv_chunk("j", "n0", 1, 0, time.time() + 30)[1]) == b"new"
        old.set_peers({"n1": ours.address})
        with pytest.raises(CollectiveError, match="prove"):
            _send(old, "n1", 2, b"old")
    finally:
        for link in (ours, new, old):
            link.close()
