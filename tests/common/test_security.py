"""The security layer on loopback: `certs init` and mutual TLS + roles on gRPC (CURVE on ZeroMQ:
test_security_curve.py; the `lab` and `other_lab` CAs come from conftest.py)."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from aio_server import AioServer
from cryptography import x509
from cryptography.x509.oid import NameOID

from oddl.cli import certs as certs_cli
from oddl.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from oddl.common.errors import OddlError, SecurityError
from oddl.common.security.authorization import (
    METHOD_RULES,
    AuthorizationInterceptor,
    Rule,
    check_rules,
)
from oddl.common.security.files import ROLE_AGENT, ROLE_OPERATOR, SecurityFiles
from oddl.common.security.lab_ca import init_lab_ca
from oddl.common.security.tls import (
    Identity,
    channel_credentials,
    peer_identity,
    secure_channel,
    server_credentials,
    tls_channel_credentials,
)
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

NODES = ("n0", "n1", "n2", "n3")  # as conftest.LAB_NODES, the nodes of `lab`
TIMEOUT = 5.0




# --------------------------------------------------------------------------- certs init


def test_init_writes_every_file_with_private_keys_0600(lab: SecurityFiles) -> None:
    m = lab.manifest
    written = {f["path"]: f for f in m["files"]}
    expected = {"tls/ca.crt", "tls/ca.key", "tls/server.crt", "tls/server.key",
                "curve/fabric.key", "curve/fabric.key_secret"}
    for n in NODES:
        expected |= {f"tls/agent-{n}.crt", f"tls/agent-{n}.key", f"curve/{n}.key",
                     f"curve/{n}.key_secret"}
    for o in ("operator", "alice"):
        expected |= {f"tls/operator-{o}.crt", f"tls/operator-{o}.key",
                     f"curve/operator-{o}.key", f"curve/operator-{o}.key_secret"}
    assert set(written) == expected
    for rel, entry in written.items():
        mode = stat.S_IMODE((lab.root / rel).stat().st_mode)
        private = rel.endswith(".key_secret") or (rel.startswith("tls/") and rel.endswith(".key"))
        assert mode == (0o600 if private else 0o644), rel
        assert entry["mode"] == f"{mode:04o}"
    assert json.loads((lab.root / "manifest.json").read_text())["nodes"] == list(NODES)


def test_certificates_encode_role_and_node_and_chain_to_the_ca(lab: SecurityFiles) -> None:
    ca = x509.load_pem_x509_certificate(lab.server_tls().ca.read_bytes())

    def load(p: Path) -> x509.Certificate:
        cert = x509.load_pem_x509_certificate(p.read_bytes())
        cert.verify_directly_issued_by(ca)
        return cert

    agent = load(lab.agent_tls("n2").cert)
    assert agent.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == \
        ROLE_AGENT
    assert agent.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "n2"
    op = load(lab.operator_tls("alice").cert)
    assert op.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == \
        ROLE_OPERATOR
    server = load(lab.server_tls().cert)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_curve_keys_load_and_match_the_manifest(lab: SecurityFiles) -> None:
    keys = lab.curve_keys("n1")
    assert keys.secret and len(keys.public) == len(keys.secret) == 40
    assert keys.public == lab.curve_public("n1")
    allowed = lab.curve_clients()
    assert allowed[lab.curve_public("n3")] == "n3"
    assert allowed[lab.curve_public("operator:alice")] == "operator:alice"
    assert lab.curve_public("fabric") not in allowed
    assert lab.curve_public("operator:alice") not in lab.curve_clients(operators=False)


def test_init_refuses_to_overwrite_and_force_replaces(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    first = init_lab_ca(out, NODES)
    with pytest.raises(SecurityError, match=r"refusing to overwrite.*--force") as err:
        init_lab_ca(out, NODES)
    assert str(out) in str(err.value)
    assert isinstance(err.value, OddlError)
    second = init_lab_ca(out, ("n0",), force=True)
    assert second.curve_public("n0") != first.curve_public("n0")
    assert not (out / "tls" / "agent-n3.key").exists()  # no stale key survives --force
    assert not (out / "curve" / "n3.key_secret").exists()


@pytest.mark.parametrize("nodes,match", [((), "no nodes"), (("n0", "n0"), "repeat"),
                                         (("../n0",), "bad node name"),
                                         (("fabric",), "also node ids")])
def test_init_rejects_bad_names(tmp_path: Path, nodes: tuple[str, ...], match: str) -> None:
    with pytest.raises(SecurityError, match=match):
        init_lab_ca(tmp_path / "certs", nodes)


def test_cli_init_prints_files_and_refuses_overwrite(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    argv = ["certs", "init", "--out", str(out), "--nodes", "n0,n1", "--hosts",
            "127.0.0.1,ctl.lab"]
    assert certs_cli.main(argv) == EXIT_OK
    text = capsys.readouterr().out
    assert "0600  tls/agent-n1.key" in text and "curve/fabric.key_secret" in text
    assert certs_cli.main(argv) == EXIT_FAILED
    assert "--force" in capsys.readouterr().err
    assert certs_cli.main([*argv, "--force", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["hosts"] == ["127.0.0.1", "ctl.lab"]
    assert certs_cli.main(["certs", "init", "--out", str(out)]) == EXIT_USAGE


def test_missing_and_mismatched_files_name_the_file(lab: SecurityFiles, other_lab: SecurityFiles,
                                                    tmp_path: Path) -> None:
    with pytest.raises(SecurityError, match="manifest.json: no such manifest"):
        SecurityFiles.load(tmp_path)
    with pytest.raises(SecurityError, match="no node 'n9'"):
        lab.agent_tls("n9")
    mine, foreign = lab.agent_tls("n0"), other_lab.agent_tls("n0")
    with pytest.raises(SecurityError, match="not issued by the CA"):
        channel_credentials(mine.ca, foreign.cert, foreign.key)
    with pytest.raises(SecurityError, match="does not belong to"):
        channel_credentials(mine.ca, mine.cert, lab.agent_tls("n1").key)


# --------------------------------------------------------------------------- gRPC


class _Servicer(pb_grpc.ControllerServicer):
    """Empty replies; records who called."""

    def __init__(self) -> None:
        self.callers: list[Identity | None] = []

    def _seen(self, context: grpc.ServicerContext) -> None:
        self.callers.append(peer_identity(context))

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext
                  ) -> pb.HeartbeatReply:
        self._seen(context)
        return pb.HeartbeatReply()

    def WatchSchedule(self, request: pb.WatchScheduleRequest, context: grpc.ServicerContext
                      ) -> Iterator[pb.ScheduleEvent]:
        self._seen(context)
        yield pb.ScheduleEvent(ended=pb.JobEnded())

    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext
                  ) -> pb.Status:
        self._seen(context)
        return pb.Status(testbed="t")

    def Reconfigure(self, request: pb.ReconfigureRequest, context: grpc.ServicerContext
                    ) -> pb.ReconfigureReply:
        self._seen(context)
        return pb.ReconfigureReply(applied=True)


class _AioServicer(pb_grpc.ControllerServicer):
    """The same servicer for an asyncio server (the controller's): coroutines."""

    def __init__(self, inner: _Servicer) -> None:
        self.inner = inner

    async def Heartbeat(self, request, context):  # noqa: N802
        return self.inner.Heartbeat(request, context)

    async def WatchSchedule(self, request, context):  # noqa: N802
        for event in self.inner.WatchSchedule(request, context):
            yield event

    async def GetStatus(self, request, context):  # noqa: N802
        return self.inner.GetStatus(request, context)

    async def Reconfigure(self, request, context):  # noqa: N802
        return self.inner.Reconfigure(request, context)


@pytest.fixture(scope="module", params=["sync", "aio"])
def secure_server(lab: SecurityFiles, request: pytest.FixtureRequest
                  ) -> Iterator[tuple[str, _Servicer]]:
    """The interceptor on a thread-pool server and, as the controller serves, on an asyncio
    server: the same refusals on both."""
    servicer = _Servicer()
    if request.param == "aio":
        from oddl.common.security.authorization_aio import AioAuthorizationInterceptor

        aio = AioServer(_AioServicer(servicer), AioAuthorizationInterceptor(), lab.root)
        yield f"127.0.0.1:{aio.port}", servicer
        aio.stop()
        return
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         interceptors=[AuthorizationInterceptor()])
    pb_grpc.add_ControllerServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", server_credentials(lab.root))
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(0).wait(2)


def _stub(address: str, creds: grpc.ChannelCredentials) -> pb_grpc.ControllerStub:
    return pb_grpc.ControllerStub(secure_channel(address, creds))


def _refused(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        result = call(request, timeout=TIMEOUT)  # type: ignore[operator]
        list(result) if isinstance(result, Iterator) else result
    return err.value  # type: ignore[return-value]


def test_operator_may_reconfigure_and_read(lab: SecurityFiles,
                                           secure_server: tuple[str, _Servicer]) -> None:
    address, servicer = secure_server
    stub = _stub(address, tls_channel_credentials(lab.operator_tls("alice")))
    assert stub.Reconfigure(pb.ReconfigureRequest(), timeout=TIMEOUT).applied
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT).testbed == "t"
    assert servicer.callers[-1] == Identity(role=ROLE_OPERATOR, node=None, name="alice")


def test_agent_may_not_reconfigure(lab: SecurityFiles,
                                   secure_server: tuple[str, _Servicer]) -> None:
    address, _ = secure_server
    stub = _stub(address, tls_channel_credentials(lab.agent_tls("n0")))
    err = _refused(stub.Reconfigure, pb.ReconfigureRequest())
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.details() == ("agent n0 may not call Reconfigure: only operators may "
                             "Reconfigure; use an operator certificate")
    for call, req in ((stub.SubmitJob, pb.SubmitJobRequest()),
                      (stub.CancelJob, pb.CancelJobRequest())):
        assert _refused(call, req).code() == grpc.StatusCode.PERMISSION_DENIED
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT).testbed == "t"


def test_agent_acts_only_for_its_own_node(lab: SecurityFiles,
                                          secure_server: tuple[str, _Servicer]) -> None:
    address, servicer = secure_server
    stub = _stub(address, tls_channel_credentials(lab.agent_tls("n0")))
    stub.Heartbeat(pb.HeartbeatRequest(node_id="n0"), timeout=TIMEOUT)
    assert servicer.callers[-1] == Identity(role=ROLE_AGENT, node="n0", name="n0")
    err = _refused(stub.Heartbeat, pb.HeartbeatRequest(node_id="n1"))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "agent n0 may not call Heartbeat" in err.details()
    assert "'n1'" in err.details() and "own node" in err.details()
    # the server-streaming agent RPC is checked too
    events = list(stub.WatchSchedule(pb.WatchScheduleRequest(node_id="n0"), timeout=TIMEOUT))
    assert len(events) == 1
    err = _refused(stub.WatchSchedule, pb.WatchScheduleRequest(node_id="n1"))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED


def test_operator_may_not_act_as_an_agent(lab: SecurityFiles,
                                          secure_server: tuple[str, _Servicer]) -> None:
    address, _ = secure_server
    stub = _stub(address, tls_channel_credentials(lab.operator_tls("operator")))
    err = _refused(stub.Heartbeat, pb.HeartbeatRequest(node_id="n0"))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "only agents may Heartbeat" in err.details()


def test_client_without_certificate_cannot_connect(lab: SecurityFiles,
                                                   secure_server: tuple[str, _Servicer]) -> None:
    address, _ = secure_server
    creds = grpc.ssl_channel_credentials(root_certificates=lab.server_tls().ca.read_bytes())
    err = _refused(_stub(address, creds).GetStatus, pb.GetStatusRequest())
    assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)


def test_certificate_from_another_ca_cannot_connect(lab: SecurityFiles, other_lab: SecurityFiles,
                                                    secure_server: tuple[str, _Servicer]) -> None:
    address, _ = secure_server
    foreign = other_lab.operator_tls("operator")
    # trusts our CA but presents a foreign client certificate
    creds = grpc.ssl_channel_credentials(root_certificates=lab.server_tls().ca.read_bytes(),
                                         private_key=foreign.key.read_bytes(),
                                         certificate_chain=foreign.cert.read_bytes())
    err = _refused(_stub(address, creds).GetStatus, pb.GetStatusRequest())
    assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
    # a client of the other lab does not trust our server either
    err = _refused(_stub(address, tls_channel_credentials(foreign)).GetStatus,
                   pb.GetStatusRequest())
    assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)


def test_plaintext_peer_is_unauthenticated() -> None:
    """Even a server mistakenly opened without TLS refuses callers: they have no certificate."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         interceptors=[AuthorizationInterceptor()])
    pb_grpc.add_ControllerServicer_to_server(_Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            err = _refused(pb_grpc.ControllerStub(channel).GetStatus, pb.GetStatusRequest())
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "client certificate" in err.details()
    finally:
        server.stop(0).wait(2)


def test_plaintext_peer_is_unauthenticated_on_the_event_loop() -> None:
    """The asyncio interceptor (the controller's) refuses a caller without TLS too."""
    from oddl.common.security.authorization_aio import AioAuthorizationInterceptor

    aio = AioServer(_AioServicer(_Servicer()), AioAuthorizationInterceptor(), None)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{aio.port}") as channel:
            stub = pb_grpc.ControllerStub(channel)
            err = _refused(stub.GetStatus, pb.GetStatusRequest())
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "client certificate" in err.details()
            err = _refused(stub.WatchSchedule, pb.WatchScheduleRequest(node_id="n0"))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        aio.stop()


def test_method_table_covers_every_rpc_of_the_service() -> None:
    service = pb.DESCRIPTOR.services_by_name["Controller"]
    names = {m.name for m in service.methods}
    assert set(METHOD_RULES) == names
    for name, rule in METHOD_RULES.items():
        assert rule.roles, name
        if rule.own_node_field:
            assert rule.own_node_field in service.methods_by_name[name].input_type.fields_by_name
    # the reconfiguring RPCs are operator-only, the agent RPCs agent-only and node-checked
    for name in ("Reconfigure", "SubmitJob", "CancelJob"):
        assert METHOD_RULES[name].roles == {ROLE_OPERATOR}
    for name in ("RegisterAgent", "Heartbeat", "SyncClock", "WatchSchedule", "ReadyCollective",
                 "ReportCollective", "ConfirmDelivery"):
        assert METHOD_RULES[name].roles == {ROLE_AGENT}
        assert METHOD_RULES[name].own_node_field == "node_id"


def test_a_forgotten_rpc_fails_fast() -> None:
    rules = {k: v for k, v in METHOD_RULES.items() if k != "Reconfigure"}
    with pytest.raises(SecurityError, match="no rule for Reconfigure"):
        AuthorizationInterceptor(rules)
    with pytest.raises(SecurityError, match="unknown methods Frobnicate"):
        check_rules({**METHOD_RULES, "Frobnicate": METHOD_RULES["GetStatus"]})


def test_the_table_checks_against_the_service_descriptor() -> None:
    """The ground floor names the RPCs without the generated code; given the descriptor, the
    check also covers the request fields an agent rule names."""
    service = pb.DESCRIPTOR.services_by_name["Controller"]
    check_rules(METHOD_RULES, service)
    AuthorizationInterceptor(service_descriptor=service)
    bad = {**METHOD_RULES, "GetStatus": Rule(frozenset({ROLE_AGENT}), own_node_field="nope")}
    with pytest.raises(SecurityError, match="GetStatus's request GetStatusRequest has no field"):
        check_rules(bad, service)
    with pytest.raises(SecurityError, match="unknown methods Frobnicate"):
        check_rules({**METHOD_RULES, "Frobnicate": METHOD_RULES["GetStatus"]}, service)
