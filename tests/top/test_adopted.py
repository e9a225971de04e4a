"""Zero copies for reused tensors (decision record 0017): a tensor's storage moved into
shared memory in place and adopted by the agent as an extra bucket.

The promotion rule and the agent's refusal of unsealed memory from another uid run against
the real bucket socket (`bucket_beds.BucketSockets`, served on a thread here); the collectives run
through four real agents of the emulated testbed (`test_buckets_e2e.Bed`) and `AgentClient`.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bucket_beds import Bed, BucketSockets
from helpers import ROOT

from oddl.agents.client.adopted import InRegion
from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.buckets import ClientBuckets
from oddl.agents.client.every_rank import allreduce_all
from oddl.common import memfd
from oddl.common.errors import OperationRefused

torch = pytest.importorskip("torch")
from oddl.torch.adopt import Promoter, array_of  # noqa: E402

pytestmark = pytest.mark.skipif(not memfd.supported(), reason="needs memfd (Linux)")
MB = 1 << 20


@pytest.fixture
def agent(folder: Path) -> Iterator[BucketSockets]:
    a = BucketSockets(folder)
    yield a
    a.close()


def _promoter(address: str) -> Promoter:
    return Promoter(AgentClient(address, timeout_s=60), min_bytes=64 * 1024, enabled=True)


# ---- which storages are promoted ------------------------------------------------------------
def test_a_storage_is_promoted_the_second_time_it_comes_and_its_views_follow(agent: BucketSockets):
    p = _promoter(agent.address)
    try:
        p.client.shared_array(MB // 8, np.float64)  # its bucket holds the size already
        bucket = torch.arange(MB // 8, dtype=torch.float64)
        grads = [bucket[:1000].view(10, 100), bucket[5000:9000]]  # as DDP's gradient views
        p.before_in_place(bucket)
        assert not bucket.untyped_storage().is_shared()  # once: the copy path
        p.before_in_place(bucket)
        storage = bucket.untyped_storage()
        assert storage.is_shared() and p.promoted == 1
        assert agent.registry.adopted_count(os.getpid()) == 1
        assert grads[0].data_ptr() == bucket.data_ptr()
        assert grads[1].data_ptr() == bucket.data_ptr() + 5000 * 8
        bucket.mul_(2)  # the views see the memory the bucket now lives in
        assert grads[0][3, 7].item() == 2 * 307 and grads[1][0].item() == 2 * 5000
        # an array in it is reduced where it lies, at its byte offset
        where = p.client._buckets.holding(array_of(bucket[5000:9000]))
        assert isinstance(where, InRegion) and where.offset == 5000 * 8
        with pytest.raises(RuntimeError, match="not resizable"):  # not a SIGSEGV in torch
            storage.resize_(2 * MB)
    finally:
        p.client.close()


def test_the_first_storage_of_a_size_the_bucket_cannot_hold_is_promoted_at_once(
        agent: BucketSockets):
    # the copy path would make a new bucket of that size anyway (decision record 0035)
    p = _promoter(agent.address)
    try:
        first = torch.ones(MB // 8, dtype=torch.float64)
        p.before_in_place(first)
        assert first.untyped_storage().is_shared() and p.promoted == 1
        assert agent.registry.adopted_count(os.getpid()) == 1
        # another fresh storage of that size (FSDP's outputs): its first sighting copies
        fresh = torch.ones(MB // 8, dtype=torch.float64)
        p.before_in_place(fresh)
        assert not fresh.untyped_storage().is_shared() and p.promoted == 1
        p.before_in_place(fresh)
        assert fresh.untyped_storage().is_shared() and p.promoted == 2
        # a size the client's bucket holds waits for its second sighting too
        p.client.shared_array(2 * MB // 8, np.float64)
        held = torch.ones(2 * MB // 8, dtype=torch.float64)
        p.before_in_place(held)
        assert not held.untyped_storage().is_shared() and p.promoted == 2
    finally:
        p.client.close()


def test_storages_others_point_into_are_never_promoted(agent: BucketSockets):
    p = _promoter(agent.address)
    try:
        backing = np.zeros(MB // 4, np.float32)
        aliased = torch.from_numpy(backing)  # numpy owns the memory
        exported = torch.zeros(MB // 4)
        view = exported.numpy()  # numpy points into it
        small = torch.zeros(100)
        pinned_like = torch.zeros(MB // 4)
        pinned_like.share_memory_()  # somebody else's shared memory
        for t in (aliased, exported, small, pinned_like, torch.zeros(MB // 2)[::2]):
            p.before_in_place(t)
            p.before_in_place(t)
        assert p.promoted == 0
        aliased.fill_(3)
        view[0] = 5
        assert backing[0] == 3 and exported[0].item() == 5  # the aliases still hold
    finally:
        p.client.close()


def test_a_new_storage_at_a_recycled_address_is_not_taken_for_the_first(agent: BucketSockets):
    p = _promoter(agent.address)
    try:
        p.client.shared_array(16 * MB, np.float32)  # its bucket holds the size already
        first = torch.zeros(16 * MB)  # 64 MB: glibc maps it on its own, and reuses the place
        address = first.data_ptr()
        p.before_in_place(first)
        del first
        second = None
        for _ in range(20):
            second = torch.zeros(16 * MB)
            if second.data_ptr() == address:
                break
            second = None
        if second is None:
            pytest.skip("the allocator never gave the same address again")
        p.before_in_place(second)  # same address and size, another storage: a first sighting
        assert not second.untyped_storage().is_shared() and p.promoted == 0
        p.before_in_place(second)
        assert second.untyped_storage().is_shared() and p.promoted == 1
        del second  # freed: the adopted memory is no longer there
        mem = p.client._buckets.adopted
        assert len(mem.sweep()) == 1 and len(mem) == 0
    finally:
        p.client.close()


# ---- who may hand over unsealed memory -------------------------------------------------------
def _unsealed_fd(nbytes: int) -> int:
    fd = os.memfd_create("not-sealed", os.MFD_CLOEXEC)  # as torch's shared storages are
    os.ftruncate(fd, nbytes)
    return fd


def test_unsealed_memory_is_mapped_only_when_the_agent_is_told_to_trust_it():
    fd = _unsealed_fd(MB)
    try:
        with pytest.raises(OperationRefused, match="only a process of the agent's own uid"):
            memfd.map_bucket_fd(fd)
        memfd.map_bucket_fd(fd, sealed=False).close()
    finally:
        os.close(fd)


_ADOPT_AS = """
import mmap, os, sys
import numpy as np
import torch  # first: this interpreter's files are root's
from oddl.agents.client.buckets import ClientBuckets
from oddl.agents.client.agent_client import AgentClient
from oddl.torch.adopt import Promoter
import json, select, socket, weakref, fcntl, logging  # noqa: F401  (as is the standard library)
os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[2]))
fd = os.memfd_create("not-sealed", os.MFD_CLOEXEC)
os.ftruncate(fd, 1 << 20)
buf = mmap.mmap(fd, 1 << 20)
a = np.frombuffer(buf, np.float64)
class Memory:
    start, nbytes = a.__array_interface__["data"][0], 1 << 20
    def descriptor(self): return fd
b = ClientBuckets(sys.argv[1])
print(b.adopt(Memory(), 30), b.holding(a[8:16]) is None)
# the backend's side: after the first refusal it moves no more storages
p = Promoter(AgentClient(sys.argv[1], timeout_s=30), min_bytes=4096, enabled=True)
first, second = torch.zeros(4096), torch.zeros(4096)
for t in (first, first, second, second):
    p.before_in_place(t)
print(p.promoted, p.enabled, second.untyped_storage().is_shared())
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_an_agent_of_another_uid_refuses_unsealed_memory_and_the_client_copies(
        folder: Path, caplog):
    import grp

    folder.chmod(0o755)
    shared = folder / "shared"
    shared.mkdir(mode=0o700)
    a = BucketSockets(shared, group=grp.getgrgid(65534).gr_name)
    try:
        proc = subprocess.run([sys.executable, "-c", _ADOPT_AS, a.address, "65534", "65534"],
                              capture_output=True, text=True, timeout=60, cwd="/",
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        # not adopted (so arrays in it take the copy path), and the reason is said
        assert proc.stdout.split() == ["False", "True", "1", "False", "False"], proc.stdout
        assert "not adopted" in proc.stderr and "sealed against shrinking" in proc.stderr \
            and "only a process of the agent's own uid" in proc.stderr, proc.stderr
        assert a.registry.holders() == {}
        # the agent's own uid (root here) may hand the same kind of memory over
        b = ClientBuckets(a.address)
        fd = _unsealed_fd(MB)
        try:
            class Memory:
                start, nbytes = 4096, MB

                def descriptor(self) -> int:
                    return fd
            assert b.adopt(Memory(), 30)
            assert a.registry.adopted_count(os.getpid()) == 1
        finally:
            b.close()
            os.close(fd)
    finally:
        a.close()


# ---- through the agents ------------------------------------------------------------------
@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    b = Bed()
    yield b
    b.close()


def _ranks(bed: Bed) -> list[Promoter]:
    return [Promoter(AgentClient(bed.api(n), timeout_s=60), min_bytes=64 * 1024,
                     enabled=True) for n in bed.nodes]


def _reduce(promoters: list[Promoter], tensors: list[torch.Tensor]) -> None:
    """One in-place all-reduce of each rank's tensor, as the backend runs it."""
    arrays = []
    for p, t in zip(promoters, tensors, strict=True):
        p.before_in_place(t)
        arrays.append(array_of(t))
    for out in allreduce_all([p.client for p in promoters], arrays, inplace=True)[1]:
        assert isinstance(out, np.ndarray), out


def _values(rank: int, n: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(1000 * seed + rank)
    return torch.from_numpy(rng.integers(-2**40, 2**40, n)).to(torch.float64)


def test_reused_tensors_are_reduced_in_place_exactly_and_across_an_agent_restart(bed: Bed):
    promoters = _ranks(bed)
    try:
        n = MB // 8
        buckets = [torch.zeros(n, dtype=torch.float64) for _ in promoters]
        grads = [b[100:200] for b in buckets]  # a view taken before the promotion
        api_bytes = sum(a.local.api_bytes for a in bed.agents.values())
        for step in range(4):
            if step == 3:  # n0's agent stops and a new one takes its place
                bed.agents["n0"].close()
                bed.start_agent("n0")
            values = [_values(r, n, step) for r in range(len(buckets))]
            for b, v in zip(buckets, values, strict=True):
                b.copy_(v)
            _reduce(promoters, buckets)
            exact = torch.stack(values).sum(0)
            for b, g in zip(buckets, grads, strict=True):
                assert torch.equal(b, exact) and torch.equal(g, exact[100:200])
            if step >= 1:  # promoted the second time; from then on in place, no copy
                for p, b in zip(promoters, buckets, strict=True):
                    assert b.untyped_storage().is_shared()
                    assert isinstance(p.client._buckets.holding(array_of(b)), InRegion)
        # the restarted agent was handed the tensor's memory again
        assert bed.agents["n0"].buckets.adopted_count(os.getpid()) == 1
        assert sum(a.local.api_bytes for a in bed.agents.values()) == api_bytes
    finally:
        for p in promoters:
            p.client.close()


def test_the_agents_bound_drops_the_oldest_and_the_client_hands_it_over_again(bed: Bed):
    promoters = _ranks(bed)
    limits = {n: a.buckets.max_adopted for n, a in bed.agents.items()}
    try:
        for a in bed.agents.values():
            a.buckets.max_adopted = 2
        n = 3 * 64 * 1024 // 8
        tensors = [[torch.zeros(n, dtype=torch.float64) for _ in promoters] for _ in range(3)]
        for step in range(3):
            for k, ts in enumerate(tensors):  # three reused tensors, two places per client
                values = [_values(r, n, 10 * step + k) for r in range(len(ts))]
                for t, v in zip(ts, values, strict=True):
                    t.copy_(v)
                _reduce(promoters, ts)
                exact = torch.stack(values).sum(0)
                assert all(torch.equal(t, exact) for t in ts)
        for a in bed.agents.values():
            assert a.buckets.adopted_count(os.getpid()) <= 2
        assert all(t.untyped_storage().is_shared() for ts in tensors for t in ts)
    finally:
        for node, limit in limits.items():
            bed.agents[node].buckets.max_adopted = limit
        for p in promoters:
            p.client.close()


def test_freed_adopted_memory_is_released_at_the_agent(agent: BucketSockets):
    p = _promoter(agent.address)
    try:
        t = torch.zeros(MB // 4)
        p.before_in_place(t)
        p.before_in_place(t)
        assert agent.registry.adopted_count(os.getpid()) == 1
        del t
        u = torch.zeros(MB // 4)  # adopting the next one lets the agent drop the freed one
        p.before_in_place(u)
        p.before_in_place(u)
        assert agent.registry.adopted_count(os.getpid()) == 1
        assert len(p.client._buckets.adopted) == 1
    finally:
        p.client.close()


# ---- DDP through the backend -----------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_ddp_over_oddl_trains_in_its_promoted_buckets_as_gloo_does(tmp_path: Path):
    from helpers import EMULATED, run_ranks

    from oddl.launch.testbed import RunningTestbed

    worker = Path(__file__).resolve().parents[1] / "workers" / "zero_copy_worker.py"
    with RunningTestbed(tmp_path, EMULATED) as tb:
        nodes = tb.launched.node_ids
        tb.operator.submit("zero-copy-ddp", nodes, "ring", "optical")
        results = run_ranks([sys.executable, str(worker)], tb.launched.apis[:len(nodes)], 240)
    for r in results:
        # DDP's bucket was promoted, and the parameters' grads (views into it) followed
        assert r["promoted"] >= 1 and all(r["grads_shared"]), r["grads_shared"]
        for mine, gloos in zip(r["oddl"], r["gloo"], strict=True):
            assert np.allclose(mine, gloos, rtol=1e-5, atol=1e-6)
    assert all(r["oddl"] == results[0]["oddl"] for r in results)  # replicas agree exactly


def test_requests_name_an_offset_only_into_a_bucket_token_and_within_it():
    from oddl.agents.local_api import wire as localapi
    from oddl.agents.local_api.bucket_registry import BucketRegistry
    from oddl.common.errors import BucketUnavailable

    token = "ab" * 16
    assert localapi.parse_allreduce({"dtype": "<f4", "shape": [2], "bucket": token,
                                     "offset": 64}).offset == 64
    for bad in ({"offset": 8}, {"bucket": token, "offset": -8},
                {"bucket": token, "offset": True}, {"bucket": token, "offset": "8"}):
        with pytest.raises(OperationRefused, match="is not a byte offset into the bucket"):
            localapi.parse_allreduce({"dtype": "<f4", "shape": [2], **bad})
    registry = BucketRegistry(max_adopted=1)
    try:
        first = registry.adopt(1, os.getpid(), mmap.mmap(-1, 4096))
        assert registry.view(first, 96, 4000).nbytes == 96
        with pytest.raises(OperationRefused, match="needs 97 B at offset 4000"):
            registry.view(first, 97, 4000)
        registry.adopt(1, os.getpid(), mmap.mmap(-1, 4096))  # over the bound: drops the first
        with pytest.raises(BucketUnavailable) as unknown:
            registry.view(first, 8)
        assert unknown.value.kind == "bucket-unknown"
    finally:
        registry.close()
