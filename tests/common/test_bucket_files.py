"""Where descriptors cannot be passed (a local API on tcp://127.0.0.1, no memfd), buckets are
named files that clean themselves up: removed on close, on garbage collection and at exit,
and swept by the next client when their creator was killed (issue 23)."""

from __future__ import annotations

import gc
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from oddl.agents.client.buckets import ClientBuckets
from oddl.common.errors import BucketUnavailable
from oddl.common.shm import BucketMaps, SharedBucket, creator_pid


def test_over_tcp_the_bucket_is_a_named_file_that_goes_with_its_client():
    buckets = ClientBuckets("tcp://127.0.0.1:1")
    assert not buckets.passes_descriptors
    bucket = buckets.for_bytes(mmap.PAGESIZE)
    assert isinstance(bucket, SharedBucket) and creator_pid(bucket.path.name) == os.getpid()
    assert buckets.naming(bucket, 1) == {"shm": str(bucket.path)}
    path = bucket.path
    assert path.exists()
    del bucket, buckets  # never closed
    gc.collect()
    assert not path.exists()


_NAMED_CHILD = """
from oddl.common.shm import SharedBucket
b = SharedBucket(4096)
print(b.path, flush=True)
import time; time.sleep(600)
"""


def test_a_killed_clients_file_is_swept_by_the_next_client():
    child = subprocess.Popen([sys.executable, "-c", _NAMED_CHILD], stdout=subprocess.PIPE,
                             text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.stdout is not None
    path = Path(child.stdout.readline().strip())
    child.stdout.close()
    assert path.exists() and creator_pid(path.name) == child.pid
    live = SharedBucket(4096)  # its creator lives: kept
    assert path.exists()
    child.kill()
    child.wait(30)
    assert path.exists()  # SIGKILL ran no clean-up
    nxt = SharedBucket(4096)
    try:
        assert not path.exists()  # swept: its creator is gone
        assert live.path.exists()  # this process's own bucket stays
    finally:
        live.close()
        nxt.close()
    assert not live.path.exists() and not nxt.path.exists()


def test_the_agent_lets_go_of_a_named_file_its_client_removed():
    maps = BucketMaps()
    bucket = SharedBucket(mmap.PAGESIZE)
    try:
        view = maps.open_bucket(str(bucket.path), 16)
        del view
        assert len(maps) == 1
        bucket.close()
        with pytest.raises(BucketUnavailable, match="cannot open bucket file") as info:
            maps.open_bucket(str(bucket.path), 16)
        assert info.value.kind == "bucket-unreachable"
        assert len(maps) == 0  # the removed file's pages were let go
    finally:
        maps.close()
