"""The testbed in secure mode, end to end: mutual TLS and roles on gRPC, CURVE on ZeroMQ.

`oddl certs init` makes a lab CA and keys; the controller, agents and fabric run with them
(real processes); all-reduce works; and every refusal the issue names is checked.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
import zmq
from beds import allreduce_all
from fingerprints import fingerprint
from helpers import EMULATED

from oddl.agents.client.agent_client import AgentClient
from oddl.common.config import load_testbed
from oddl.common.security.curve import configure_curve_client
from oddl.common.security.files import SecurityFiles
from oddl.common.security.lab_ca import init_lab_ca
from oddl.common.security.tls import secure_channel, tls_channel_credentials
from oddl.launch.processes import ProcessGroup, oddl_command
from oddl.launch.testbed import launch_emulated
from oddl.operator.client import OperatorClient
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _start(tmp: Path, link: str, transport: str = ""
           ) -> tuple[ProcessGroup, OperatorClient, list[AgentClient], dict]:
    certs = tmp / "certs"
    result = subprocess.run(oddl_command("certs", "init", "--out", str(certs), "--nodes",
                                         "n0,n1,n2,n3"), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    text = EMULATED.read_text().replace(
        'link = "fabric"', f'link = "{link}"' + (f'\ntransport = "{transport}"' if transport else ""))
    if link == "direct":
        for i in range(4):
            text = text.replace(f'id = "n{i}"\nhost = "127.0.0.1"',
                                f'id = "n{i}"\nhost = "127.0.0.{i + 1}"')
    config = tmp / "secure.toml"
    config.write_text(text + f'\n[security]\ncerts = "{certs}"\n')
    group = ProcessGroup(tmp)
    try:
        tb = launch_emulated(group, config, tmp, resolved_name="resolved.toml")
        clients = [AgentClient(api, timeout_s=30) for api in tb.apis]
        return group, OperatorClient(tb.controller, certs=str(certs)), clients, {
            "address": tb.controller, "certs": certs, "fabric": tb.fabric, "apis": tb.apis}
    except BaseException:
        group.stop_all()
        raise


@contextmanager
def _running(tmp: Path, link: str, transport: str = ""
             ) -> Iterator[tuple[OperatorClient, list[AgentClient], dict]]:
    """`_start`, then the operator, the agent clients and the testbed's addresses; closes
    the clients and stops the processes on leaving."""
    group, op, clients, info = _start(tmp, link, transport)
    try:
        yield op, clients, info
    finally:
        for c in clients:
            c.close()
        op.close()
        group.stop_all()


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Iterator[tuple[OperatorClient, list[AgentClient], dict]]:
    with _running(tmp_path_factory.mktemp("secure"), "fabric") as running:
        yield running


def _exact(clients: list[AgentClient], seed: int) -> bool:
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(-1000, 1000, 3000) for _ in clients]
    exact = np.sum(arrays, axis=0)
    return all(isinstance(o, np.ndarray) and np.array_equal(o, exact)
               for o in allreduce_all(clients, arrays))


def test_secure_testbed_runs_collectives(secure):
    op, clients, info = secure
    job = op.submit("secure", [], "halving-doubling", "optical")
    assert _exact(clients, 1)
    op.cancel(job["id"])


def _stub(info: dict, tls) -> pb_grpc.ControllerStub:
    return pb_grpc.ControllerStub(secure_channel(info["address"], tls_channel_credentials(tls)))


def test_only_operators_reconfigure_and_agents_act_for_their_own_node(secure):
    op, _clients, info = secure
    files = SecurityFiles.load(info["certs"])
    agent_n0 = _stub(info, files.agent_tls("n0"))
    change = pb.ReconfigureRequest(set_channel=pb.SetChannel(transmitter="laser0", channel=3))
    with pytest.raises(grpc.RpcError) as err:
        agent_n0.Reconfigure(change, timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "only operators may Reconfigure" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        agent_n0.Heartbeat(pb.HeartbeatRequest(node_id="n1"), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert agent_n0.Heartbeat(pb.HeartbeatRequest(node_id="n0"), timeout=10).reregister
    # the operator may
    dry = op.reconfigure({"set_channel": {"transmitter": "laser0", "channel": 3}}, dry_run=True)
    assert dry["changes"] == ["laser0: channel → 3"]


def test_strangers_are_kept_out(secure, tmp_path):
    _op, _clients, info = secure
    plain = pb_grpc.ControllerStub(grpc.insecure_channel(info["address"]))
    with pytest.raises(grpc.RpcError) as err:
        plain.GetStatus(pb.GetStatusRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    init_lab_ca(tmp_path / "other-lab", ["n0"])
    stranger = _stub(info, SecurityFiles.load(tmp_path / "other-lab").operator_tls())
    with pytest.raises(grpc.RpcError) as err:
        stranger.GetStatus(pb.GetStatusRequest(), timeout=5)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
    # ZeroMQ: a client with another lab's key, and a plain client, get nothing from the fabric
    ctx = zmq.Context.instance()
    foreign = SecurityFiles.load(tmp_path / "other-lab")
    mine = SecurityFiles.load(info["certs"])
    for curve in (True, False):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, b"n0")
        if curve:
            configure_curve_client(sock, foreign.curve_keys("n0"), mine.curve_public("fabric"))
        sock.connect(info["fabric"])
        sock.send_multipart([b"S"], zmq.NOBLOCK)
        assert not sock.poll(1500), "the fabric answered a client it must not admit"
        sock.close(0)
    # an agent's relay link with that key fails with the reason instead of hanging
    from oddl.agents.links.zeromq import FabricLink

    with pytest.raises(ConnectionError, match="CURVE key"):
        FabricLink("n0", info["fabric"], connect_timeout=1.5,
                   curve=(foreign.curve_keys("n0"), mine.curve_public("fabric")))


def test_secure_direct_links(tmp_path):
    """Secure direct links: mutually authenticated TCP streams (agents/links/stream_auth.py)."""
    with _running(tmp_path, "direct") as (op, clients, _info):
        op.submit("secure-direct", [], "ring", "optical")
        assert _exact(clients, 2)
        # the lab path keeps its speed in secure mode: streams whose ends proved their keys
        assert {c.status()["data_path"] for c in clients} == {"tcp streams, authenticated"}


@pytest.mark.timeout(450)
def test_the_ranks_of_a_secure_lab_move_their_bytes_with_the_jobs_keys(tmp_path):
    """An ideal-network job on authenticated streams: every rank gets the job's rank-path keys
    with its lease (decision record 0042) and the ranks reduce exactly, the agents running
    none of the calls."""
    from helpers import run_ranks

    worker = Path(__file__).resolve().parents[1] / "workers" / "rank_path_worker.py"
    with _running(tmp_path, "direct") as (op, _clients, info):
        op.submit("secure-rank-path", [], "ring", "ideal")
        res = run_ranks([sys.executable, str(worker), "exact"], info["apis"], 400)
    assert all(r["leased"] for r in res), "every rank took the lease"
    assert {r["auth"] for r in res} == {"JobKeys"}, "their streams proved both ends"
    for r in res:
        assert r["agent_done_after"] == r["agent_done_before"], r
        assert r["rank_path_calls"] == r["calls"], r
    for n in (1, 7, 1000, 300_001):
        want = sum(np.random.default_rng(300 + rank + n).integers(-100, 100, n)
                   for rank in range(4))
        assert all(r["results"][f"{n}/torch.int64/SUM"] == fingerprint(want)
                   for r in res), n


def test_secure_direct_links_encrypted(tmp_path):
    """transport = "curve": the direct links as ZeroMQ CURVE sockets (encrypted)."""
    with _running(tmp_path, "direct", transport="curve") as (op, clients, _info):
        op.submit("secure-curve", [], "ring", "ideal")
        assert _exact(clients, 1)
        assert {c.status()["data_path"] for c in clients} == {"zeromq with curve"}


# ---- secure by default: no plaintext control beyond loopback unless asked for ----------------

def test_the_controller_refuses_plaintext_beyond_loopback():
    from oddl.common.errors import ConfigError
    from oddl.controller.server import ControllerServer

    cfg = load_testbed(EMULATED)
    with pytest.raises(ConfigError, match=r"refusing to serve without TLS on 0\.0\.0\.0:0.*"
                                          r"oddl certs init.*--insecure"):
        ControllerServer(cfg, "0.0.0.0:0", metrics_listen=None)


def test_insecure_serves_plaintext_on_purpose_and_says_so(caplog):
    from oddl.controller.server import ControllerServer

    cfg = load_testbed(EMULATED)
    server = ControllerServer(cfg, "0.0.0.0:0", metrics_listen=None, insecure=True)
    try:
        assert server.port > 0
        assert "WITHOUT TLS" in caplog.text
    finally:
        server.stop(0)


def test_the_cli_refusal_names_the_fix():
    result = subprocess.run(oddl_command("controller", "serve", "--config", str(EMULATED),
                                         "--listen", "0.0.0.0:0", "--metrics", ""),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "--insecure" in result.stderr and "oddl certs init" in result.stderr


def test_the_lab_file_uses_the_certificates():
    lab = Path(__file__).resolve().parents[2] / "deploy" / "testbeds" / "lab-4node.toml"
    cfg = load_testbed(lab)
    assert cfg.security.enabled, "the lab testbed file must run with TLS and CURVE"


def test_encrypted_links_without_certificates_name_the_fix():
    from oddl.agents.agent import Agent
    from oddl.common.config import parse_testbed
    from oddl.common.errors import ConfigError

    text = EMULATED.read_text().replace('link = "fabric"', 'link = "direct"\ntransport = "curve"')
    cfg = parse_testbed(text)
    with pytest.raises(ConfigError, match=r'transport = "curve".*\[security\] certs'):
        Agent(cfg, "n0", "127.0.0.1:1")
