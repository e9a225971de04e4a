"""Buckets cannot outlive their users (issue 23): descriptors over the bucket socket, and
self-cleaning named files where descriptors cannot be passed.

The agent's side here is the real bucket socket (`oddl.agents.local_api.bucket_server`) beside a real local
API socket, served on a thread of this process; clients are `oddl.agents.client.buckets` (what
`AgentClient` uses), raw sockets for malformed messages, and child processes for kills and
other users. `tests/e2e/test_buckets_e2e.py` runs the same through agents and `AgentClient`.
"""

from __future__ import annotations

import fcntl
import gc
import json
import mmap
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from bucket_beds import BucketSockets, bucket_maps, shm_files_of
from helpers import ROOT, wait_until

from oddl.agents.client.buckets import ClientBuckets
from oddl.agents.local_api import wire as localapi
from oddl.agents.local_api.bucket_server import BucketRegistry, BucketServer
from oddl.common import memfd
from oddl.common.errors import BucketUnavailable, ConfigError, OperationRefused

pytestmark = pytest.mark.skipif(not memfd.supported(), reason="needs memfd (Linux)")






@pytest.fixture
def agent(folder: Path) -> Iterator[BucketSockets]:
    a = BucketSockets(folder)
    yield a
    a.close()






# ---- the common path: a descriptor, nothing named --------------------------------------
def test_the_bucket_is_shared_memory_that_no_folder_names(agent: BucketSockets):
    size = 5 * mmap.PAGESIZE
    buckets = ClientBuckets(agent.address)
    assert buckets.passes_descriptors
    bucket = buckets.for_bytes(size)
    names = buckets.naming(bucket, 10)
    assert set(names) == {"bucket"}
    client = bucket.array((size // 8,), np.dtype("<i8"))
    client[:] = np.arange(size // 8)
    seen = np.frombuffer(agent.registry.view(names["bucket"], size), dtype="<i8")
    assert np.array_equal(seen, np.arange(size // 8))   # the agent sees the client's bytes
    seen *= 3                                           # and its writes land in the client's
    assert np.array_equal(client, 3 * np.arange(size // 8))
    del seen
    assert agent.registry.holders() == {os.getpid(): size}
    assert shm_files_of(os.getpid()) == []
    # the same bucket again: the same token, no second hand-over
    assert buckets.naming(bucket, 10) == names
    del client
    buckets.close()
    wait_until(lambda: agent.registry.holders() == {}, 30, "the agent letting go")
    assert bucket_maps(size=size) == []
    with pytest.raises(BucketUnavailable, match="hand the descriptor over again") as info:
        agent.registry.view(names["bucket"], size)
    assert info.value.kind == "bucket-unknown"


def test_a_bigger_bucket_replaces_the_old_one_at_the_agent(agent: BucketSockets):
    buckets = ClientBuckets(agent.address)
    try:
        first = buckets.naming(buckets.for_bytes(mmap.PAGESIZE), 10)["bucket"]
        second = buckets.naming(buckets.for_bytes(4 * mmap.PAGESIZE), 10)["bucket"]
        assert first != second
        assert agent.registry.holders() == {os.getpid(): 4 * mmap.PAGESIZE}
        with pytest.raises(BucketUnavailable):
            agent.registry.view(first, 1)
        with pytest.raises(OperationRefused, match="needs"):
            agent.registry.view(second, 5 * mmap.PAGESIZE)
    finally:
        buckets.close()


_CHILD = """
import sys, time
from oddl.agents.client.buckets import ClientBuckets
buckets = ClientBuckets(sys.argv[1])
bucket = buckets.for_bytes(int(sys.argv[2]))
bucket.array((4,), "<i8")[:] = [7, 8, 9, 10]
print(buckets.naming(bucket, 30)["bucket"], flush=True)
time.sleep(600)
"""


def test_a_client_killed_with_sigkill_leaves_nothing(agent: BucketSockets):
    size = 7 * mmap.PAGESIZE  # a size no other bucket here has
    child = subprocess.Popen([sys.executable, "-c", _CHILD, agent.address, str(size)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        token = child.stdout.readline().strip()
        assert len(token) == 32, "the child got no token"
        view = agent.registry.view(token, 32)
        assert list(np.frombuffer(view, dtype="<i8")) == [7, 8, 9, 10]
        del view
        assert agent.registry.holders() == {child.pid: size}
        # the child's bucket is anonymous memory: nothing of it in the shared-memory folder
        assert bucket_maps(child.pid, size) and "/dev/shm" not in Path(
            f"/proc/{child.pid}/maps").read_text()
        assert len(bucket_maps(size=size)) == 1   # the agent's map
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        wait_until(lambda: agent.registry.holders() == {}, 30, "the agent dropping the bucket")
        assert bucket_maps(size=size) == []        # unmapped at once: the memory is free
        assert shm_files_of(child.pid) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_client_never_closed_is_released_when_collected(agent: BucketSockets):
    size = 9 * mmap.PAGESIZE
    buckets = ClientBuckets(agent.address)
    buckets.naming(buckets.for_bytes(size), 10)
    assert agent.registry.holders() == {os.getpid(): size}
    del buckets
    gc.collect()
    wait_until(lambda: agent.registry.holders() == {}, 30, "the agent letting go")
    assert bucket_maps(size=size) == []


def test_an_agent_restart_gets_the_same_memory_handed_over_again(folder: Path):
    first = BucketSockets(folder)
    buckets = ClientBuckets(first.address)
    try:
        bucket = buckets.for_bytes(mmap.PAGESIZE)
        array = bucket.array((8,), np.dtype("<i8"))
        array[:] = 5
        old = buckets.naming(bucket, 10)["bucket"]
        first.close()
        second = BucketSockets(folder)  # the same path, a new agent
        try:
            new = buckets.naming(bucket, 10)["bucket"]  # found closed: handed over again
            assert new != old
            view = np.frombuffer(second.registry.view(new, 64), dtype="<i8")
            view += 1
            assert list(array) == [6] * 8  # the same pages
            del view
        finally:
            second.close()
    finally:
        buckets.close()


# ---- what the bucket socket refuses --------------------------------------------------------
def _sealed(size: int = mmap.PAGESIZE, seal: bool = True) -> int:
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def _ask(sock: socket.socket, data: bytes, fds: list[int]) -> dict:
    socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    sock.settimeout(30)
    return json.loads(sock.recv(4096))


def test_malformed_messages_are_refused_and_crash_nothing(agent: BucketSockets, folder: Path):
    registration = b'{"op": "bucket"}'
    plain = folder / "plain"
    plain.write_bytes(bytes(mmap.PAGESIZE))
    r, w = os.pipe()
    fds = {"sealed": _sealed(), "unsealed": _sealed(seal=False), "empty": _sealed(0),
           "file": os.open(plain, os.O_RDWR), "pipe": r, "pipe-w": w}
    fds["read-only"] = os.open(f"/proc/self/fd/{fds['sealed']}", os.O_RDONLY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(str(localapi.bucket_socket(agent.address)))
    open_fds: set[str] = set()
    gc.collect()
    gc.disable()  # no collection may close unrelated descriptors while they are counted
    cases = [
        (registration, [], "carries 0 descriptors"),
        (registration, [fds["sealed"], fds["file"]], "carries 2 descriptors"),
        (registration, [fds["pipe"]], "not a memory file"),
        (registration, [fds["file"]], "not a memfd sealed against shrinking"),
        (registration, [fds["unsealed"]], "not a memfd sealed against shrinking"),
        (registration, [fds["empty"]], "holds 0 B"),
        (registration, [fds["read-only"]], "cannot map the bucket for writing"),
        (b'{"op": "steal"}', [fds["sealed"]], "is not {\"op\": \"bucket\"}"),
        (b"\xff\x00garbage", [fds["sealed"]], "is not {\"op\": \"bucket\"}"),
        (b"[" * 5000, [fds["sealed"]], "longer than 1024 B"),
    ]
    try:
        for data, passed, why in cases:
            reply = _ask(sock, data, passed)
            assert reply["kind"] == "refused" and why in reply["message"], (why, reply)
            assert reply["message"].startswith("n0: ")
            # counted once the agent has accepted the connection (its end is an fd here)
            open_fds = open_fds or set(os.listdir("/proc/self/fd"))
        assert agent.registry.holders() == {}
        assert agent.thread.is_alive()
        # the agent closed every descriptor it was sent and refused
        assert set(os.listdir("/proc/self/fd")) == open_fds
        # and the same connection still registers a good bucket
        good = _ask(sock, registration, [fds["sealed"]])
        assert len(good["token"]) == 32 and good["bytes"] == mmap.PAGESIZE
    finally:
        gc.enable()
        sock.close()
        for fd in fds.values():
            os.close(fd)


def test_a_second_agent_does_not_take_over_a_live_bucket_socket(agent: BucketSockets):
    with pytest.raises(ConfigError, match="in use by another process"):
        BucketServer(agent.address, BucketRegistry(), "n0")


def test_the_bucket_socket_must_fit_beside_the_api_socket(folder: Path):
    api = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        long = folder / ("x" * (100 - len(str(folder))) + ".sock")
        with pytest.raises(ConfigError, match=r"\.buckets beside it"):
            localapi.bind(api, f"ipc://{long}", "n0")
    finally:
        api.close(0)


def test_requests_name_a_bucket_by_a_token_only():
    ok = localapi.parse_allreduce({"dtype": "<f4", "shape": [2], "bucket": "ab" * 16})
    assert ok.bucket == "ab" * 16 and ok.shm is None
    for bad, why in (({"bucket": "/dev/shm/x"}, "not a token"), ({"bucket": 7}, "not a token"),
                     ({"bucket": "ab" * 16, "shm": "/dev/shm/x"}, "name one")):
        with pytest.raises(OperationRefused, match=why):
            localapi.parse_allreduce({"dtype": "<f4", "shape": [2], **bad})


# ---- who may hand over a descriptor -------------------------------------------------------
_AS_USER = """
import os, sys
from oddl.agents.client.buckets import ClientBuckets  # first: this interpreter's files are root's
import json, mmap, select, socket, weakref, fcntl  # noqa: F401  (as is the standard library)
os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[2]))
b = ClientBuckets(sys.argv[1])
try:
    print(b.naming(b.for_bytes(4096), 30)["bucket"])
except Exception as exc:
    print(type(exc).__name__, getattr(exc, "kind", ""), exc)
"""


def _hand_over_as(address: str, uid: int, gid: int) -> str:
    proc = subprocess.run([sys.executable, "-c", _AS_USER, address, str(uid), str(gid)],
                          capture_output=True, text=True, timeout=60, cwd="/",
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as other users")
def test_only_the_local_apis_users_may_hand_over_a_descriptor(folder: Path):
    import grp

    folder.chmod(0o755)  # the shared folder's parent must be reachable
    shared = folder / "shared"
    shared.mkdir(mode=0o700)
    a = BucketSockets(shared, group=grp.getgrgid(65534).gr_name)
    try:
        api = Path(a.address[len("ipc://"):]).stat()
        fds = localapi.bucket_socket(a.address)
        assert fds is not None and fds.parent == shared
        st = fds.stat()
        assert stat.S_ISSOCK(st.st_mode)
        assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (api.st_gid, 0o660) == (
            65534, 0o660)
        # a member of the group hands its bucket over; a user outside it cannot connect
        assert len(_hand_over_as(a.address, 65534, 65534)) == 32
        outsider = _hand_over_as(a.address, 54321, 54321)
        assert outsider.startswith("BucketUnavailable bucket-unreachable") and \
            "must be in the local API's group" in outsider, outsider
    finally:
        a.close()
    private = BucketSockets(folder)  # no group: only this user
    try:
        assert stat.S_IMODE(localapi.bucket_socket(private.address).stat().st_mode) == 0o600
        assert "bucket-unreachable" in _hand_over_as(private.address, 65534, 65534)
    finally:
        private.close()


def test_a_forked_child_does_not_keep_its_parents_bucket_at_the_agent(agent: BucketSockets):
    buckets = ClientBuckets(agent.address)
    buckets.naming(buckets.for_bytes(mmap.PAGESIZE), 10)
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker: lives on, using nothing of the client
        os.close(release_w)
        os.read(release_r, 1)
        os._exit(0)
    os.close(release_r)
    try:
        buckets.close()
        wait_until(lambda: agent.registry.holders() == {}, 20,
                   "the agent letting go while the forked child lives")
    finally:
        os.close(release_w)
        os.waitpid(pid, 0)
