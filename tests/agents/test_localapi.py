"""The local API listens where only the agent's user can reach it (issue: secure by default)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
import zmq

from oddl.agents.local_api import wire as localapi
from oddl.common.errors import ConfigError, OperationRefused


@pytest.fixture
def zsock():
    s = zmq.Context.instance().socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    yield s
    s.close(0)


def test_auto_is_a_unix_socket_only_its_owner_can_open(zsock, private_runtime):
    address = localapi.bind(zsock, localapi.AUTO, "n0")
    assert address.startswith("ipc://")
    path = Path(address[len("ipc://"):])
    assert path.parent == private_runtime / "oddl"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
    localapi.unlink(address)
    assert not path.exists()


def test_a_client_of_the_same_user_gets_answers(zsock, private_runtime):
    address = localapi.bind(zsock, localapi.AUTO, "n1")
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(address)
    client.send(b"ping")
    assert zsock.poll(10_000)
    ident, body = zsock.recv_multipart()
    assert body == b"ping"
    client.close(0)


def _connects_as(path: str, uid: int, gid: int) -> bool:
    """Whether a process of that user and group may connect to the Unix socket `path`."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.setgid(gid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            code = 0
        except PermissionError:
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1), f"the probe failed otherwise (exit {code})"
    return code == 0


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_connect(zsock, private_runtime):
    address = localapi.bind(zsock, localapi.AUTO, "n2")
    assert not _connects_as(address[len("ipc://"):], uid=65534, gid=65534), \
        "another user reached the local API"


def test_tcp_beyond_loopback_is_refused(zsock):
    with pytest.raises(ConfigError, match="must not listen beyond this host"):
        localapi.bind(zsock, "tcp://0.0.0.0:0", "n0")


def test_tcp_on_loopback_still_works_with_a_warning(zsock, caplog):
    address = localapi.bind(zsock, "tcp://127.0.0.1:0", "n0")
    assert address.startswith("tcp://127.0.0.1:") and not address.endswith(":0")
    assert "every local user can reach it" in caplog.text


def test_a_folder_others_may_write_is_refused(zsock):
    shared = Path(f"/tmp/oddl-shared-{os.getpid()}")
    shared.mkdir(exist_ok=True)
    try:
        shared.chmod(0o777)
        with pytest.raises(ConfigError, match="writable by others"):
            localapi.bind(zsock, f"ipc://{shared}/n0.sock", "n0")
    finally:
        shared.rmdir()


def test_a_socket_in_use_is_not_taken_over(zsock, private_runtime):
    path = private_runtime / "busy.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    try:
        with pytest.raises(ConfigError, match="in use by another process"):
            localapi.bind(zsock, f"ipc://{path}", "n0")
    finally:
        listener.close()
        path.unlink()


def test_a_stale_socket_file_is_replaced(zsock, private_runtime):
    path = private_runtime / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: an agent that was killed
    assert localapi.bind(zsock, f"ipc://{path}", "n0") == f"ipc://{path}"
    localapi.unlink(f"ipc://{path}")


def test_relative_and_unknown_addresses_name_the_fix(zsock):
    with pytest.raises(ConfigError, match="absolute path"):
        localapi.bind(zsock, "ipc://agent.sock", "n0")
    with pytest.raises(ConfigError, match="ipc://auto"):
        localapi.bind(zsock, "udp://127.0.0.1:1", "n0")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_a_group_opens_the_api_to_its_members(zsock, private_runtime):
    import grp

    gid = 65534
    private_runtime.chmod(0o755)  # the parent of the shared folder must be reachable
    folder = private_runtime / "shared"
    folder.mkdir(mode=0o700)
    address = localapi.bind(zsock, f"ipc://{folder}/n3.sock", "n3",
                            group=grp.getgrgid(gid).gr_name)
    path = Path(address[len("ipc://"):])
    assert (path.stat().st_gid, stat.S_IMODE(path.stat().st_mode)) == (gid, 0o660)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750
    assert _connects_as(str(path), uid=65534, gid=gid), "a group member could not connect"
    # a client of another user shares its bucket files with the socket's group
    os.chown(path, 65534, -1)
    assert localapi.shared_group(address) == gid
    from oddl.common.shm import SharedBucket

    bucket = SharedBucket(1 << 16, group=gid)
    try:
        st = bucket.path.stat()
        assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (gid, 0o660)
    finally:
        bucket.close()


def test_an_unknown_group_names_the_fix(zsock):
    with pytest.raises(ConfigError, match="groupadd"):
        localapi.bind(zsock, localapi.AUTO, "n0", group="no-such-group-oddl")


def test_a_private_socket_shares_nothing(zsock, private_runtime):
    address = localapi.bind(zsock, localapi.AUTO, "n0")
    assert localapi.shared_group(address) is None
    assert localapi.shared_group("tcp://127.0.0.1:1") is None


# ---- request headers ---------------------------------------------------------------------
@pytest.mark.parametrize("header, why", [
    ([], "not a JSON object"),
    ({"shape": [2]}, "no dtype"),
    ({"dtype": "nope", "shape": [2]}, "dtype 'nope'"),
    ({"dtype": "?", "shape": [2]}, "can be summed exactly"),      # bool: OR, not a sum
    ({"dtype": "O", "shape": [2]}, "can be summed exactly"),
    ({"dtype": "<U4", "shape": [2]}, "can be summed exactly"),
    ({"dtype": "05f4", "shape": [2]}, "not a numeric dtype"),   # found by make fuzz
    ({"dtype": 4, "shape": [2]}, "not a numeric dtype"),
    ({"dtype": "<f4", "shape": [-1]}, "non-negative integers"),
    ({"dtype": "<f4", "shape": [True]}, "non-negative integers"),
    ({"dtype": "<f4", "shape": "4"}, "non-negative integers"),
    ({"dtype": "<f4", "shape": [1 << 40, 1 << 40]}, "larger than the local API takes"),
    ({"dtype": "<f4", "shape": [2], "timeout_s": "60"}, "timeout_s '60'"),
    ({"dtype": "<f4", "shape": [2], "timeout_s": float("nan")}, "timeout_s nan"),
    ({"dtype": "<f4", "shape": [2], "timeout_s": -1}, "timeout_s -1"),
    ({"dtype": "<f4", "shape": [2], "job": 7}, "job is not a job id"),
    ({"dtype": "<f4", "shape": [2], "shm": ["x"]}, "shm is not a file name"),
])
def test_malformed_headers_are_refused_with_the_reason(header, why):

    with pytest.raises(OperationRefused, match=why.replace("(", r"\(").replace("?", r"\?")):
        localapi.parse_allreduce(header)


def test_a_good_header_parses():
    req = localapi.parse_allreduce({"dtype": "<i8", "shape": [3, 4], "timeout_s": 5,
                                    "job": "job-1"})
    assert (req.dtype.str, req.shape, req.nbytes, req.job, req.timeout_s) == (
        "<i8", (3, 4), 96, "job-1", 5.0)
