"""Buckets through real agents and `AgentClient` (issue 23): an agent restarted under its
clients keeps their `shared_array()` results exact, a training process killed with SIGKILL
or a client never closed leaves no bucket behind, and no bucket byte crosses the local API.

The emulated testbed's controller and four agents run in this process (so the test can read
the agents' maps); each agent's local API is a fixed ipc path, as the systemd unit gives it,
so that a restarted agent is found where the old one was.
"""

from __future__ import annotations

import gc
import mmap
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from bucket_beds import Bed, bucket_maps, shm_files_of
from helpers import ROOT, wait_until

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all
from oddl.common import memfd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.skipif(not memfd.supported(), reason="needs memfd (Linux)")]




@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    b = Bed()
    yield b
    b.close()


def test_shared_arrays_stay_exact_across_an_agent_restart(bed: Bed):
    clients = [AgentClient(bed.api(n), timeout_s=60) for n in bed.nodes]
    try:
        rng = np.random.default_rng(5)
        values = [rng.integers(-2**40, 2**40, 100_000) for _ in clients]
        shared = [c.shared_array(v.shape, v.dtype) for c, v in zip(clients, values,
                                                                   strict=True)]
        api_bytes = [bed.agents[n].local.api_bytes for n in bed.nodes]
        exact = np.sum(values, axis=0)

        def reduce_in_place() -> None:
            for s, v in zip(shared, values, strict=True):
                s[...] = v
            outs = allreduce_all(clients, shared)[1]
            for out, s in zip(outs, shared, strict=True):
                assert out is s and np.array_equal(s, exact), out  # in place
        reduce_in_place()
        # n0's agent stops and a new one takes its place; its client keeps its memory
        bed.agents["n0"].close()
        restarted = bed.start_agent("n0")
        reduce_in_place()
        assert restarted.buckets.holders() == {os.getpid(): shared[0].nbytes}
        # no bucket byte went through any local API socket
        assert [bed.agents[n].local.api_bytes for n in bed.nodes][1:] == api_bytes[1:]
        assert restarted.local.api_bytes == 0
        assert shm_files_of(os.getpid()) == []
    finally:
        for c in clients:
            c.close()


_TRAINER = """
import sys
import numpy as np
from oddl.agents.client.agent_client import AgentClient
c = AgentClient(sys.argv[1], timeout_s=60)
a = c.shared_array(int(sys.argv[2]) // 8, np.int64)
a[:] = 1
c.allreduce(a)
print(int(a.sum()), flush=True)
import time; time.sleep(600)
"""


def test_a_training_process_killed_with_sigkill_leaves_no_bucket(bed: Bed):
    size = 13 * mmap.PAGESIZE  # a size no other bucket here has
    # the other ranks send bytes, so that the only bucket of this size is the trainer's
    others = [AgentClient(bed.api(n), timeout_s=60, shared_memory=False)
              for n in bed.nodes[1:]]
    trainer = subprocess.Popen([sys.executable, "-c", _TRAINER, bed.api("n0"), str(size)],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        ones = [np.ones(size // 8, np.int64) for _ in others]
        for out in allreduce_all(others, ones)[1]:  # with the trainer's ones: fours
            assert isinstance(out, np.ndarray) and np.all(out == 4), out
        assert trainer.stdout is not None
        assert trainer.stdout.readline().strip() == str(4 * size // 8)  # its sum was exact
        agent = bed.agents["n0"]
        assert agent.buckets.holders().get(trainer.pid) == size
        # n0's agent maps it, as memory that no folder names
        assert len(bucket_maps(size=size)) == 1
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        wait_until(lambda: trainer.pid not in agent.buckets.holders(), 30,
                   "the agent dropping the killed process's bucket")
        assert bucket_maps(size=size) == []
        assert shm_files_of(trainer.pid) == []
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        if trainer.stdout is not None:
            trainer.stdout.close()
        for c in others:
            c.close()


def test_clients_never_closed_leave_nothing_once_collected(bed: Bed):
    size = 17 * mmap.PAGESIZE
    clients = [AgentClient(bed.api(n), timeout_s=60) for n in bed.nodes]
    arrays = [c.shared_array(size // 8, np.int64) for c in clients]
    for i in range(len(arrays)):
        arrays[i][:] = i
    for out in allreduce_all(clients, arrays)[1]:
        assert isinstance(out, np.ndarray) and np.all(out == 0 + 1 + 2 + 3), out
    assert all(bed.agents[n].buckets.holders().get(os.getpid()) == size for n in bed.nodes)
    del clients, arrays, out  # as `AgentClient(...).allreduce(array)` leaves it
    gc.collect()
    wait_until(lambda: all(not a.buckets.holders() for a in bed.agents.values()), 30,
               "the agents letting go of collected clients' buckets")
    assert bucket_maps(size=size) == []
