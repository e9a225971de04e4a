"""One rank of the timeout tests: `python tests/workers/torch_timeout_worker.py SCENARIO`.

Started four times by tests/top/test_torch_timeouts.py with torchrun's environment. Every
scenario leaves one side out of a barrier, as PyTorch's `test_barrier_timeout_*` do:

- ``resume``: init_process_group(timeout=3 s); ranks 1..3 call a barrier that rank 0 never
  joins; then every rank makes a new group of the world and sums on it (the job's step
  numbers are re-agreed at its creation), and passes the world group's barrier.
- ``new_group``: init_process_group(timeout=60 s), a full new_group(timeout=3 s); rank 0 alone
  calls the group's barrier (the group's timeout bounds it, not the world's).
- ``subgroup``: init_process_group(timeout=60 s), new_group([1, 2], timeout=3 s); rank 1 alone
  calls the subgroup's barrier, then receives from rank 2, which sends nothing.

A rank that calls reports how long the barrier took and its error, then the error of its
next collective on the world group. A rank that stays out waits (on c10d's store) until the
callers are done, then leaves. Prints one JSON line.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import oddl.torch.backend  # noqa: F401  registers "oddl"

TIMEOUT = datetime.timedelta(seconds=3)


def attempt(call: Any) -> dict[str, Any]:
    start = time.monotonic()
    try:
        call()
        error = ""
    except Exception as exc:  # reported to the test
        error = f"{type(exc).__name__}: {exc}"
    return {"error": error, "seconds": time.monotonic() - start}


def main() -> int:
    scenario = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    short = scenario == "resume"
    dist.init_process_group("oddl", timeout=TIMEOUT if short else datetime.timedelta(seconds=60))
    group = dist.new_group(ranks=[1, 2] if scenario == "subgroup" else None,
                           timeout=TIMEOUT) if not short else None
    callers = [0] if scenario == "new_group" else [1] if scenario == "subgroup" else \
        list(range(1, world))
    store = dist.distributed_c10d._get_default_store()
    out: dict[str, Any] = {"rank": rank, "called": rank in callers}
    if rank in callers:
        out["barrier"] = attempt(lambda: dist.barrier(group=group))
        if scenario == "subgroup":  # a subgroup's flows break no sequence of the job
            out["next"] = attempt(lambda: dist.recv(torch.empty(2), src=2, group=group))
        else:
            out["next"] = attempt(lambda: dist.all_reduce(torch.ones(2)))
        store.set(f"done{rank}", "1")
    else:
        store.wait([f"done{r}" for r in callers], datetime.timedelta(seconds=100))
    if scenario == "resume":
        store.wait([f"done{r}" for r in callers], datetime.timedelta(seconds=100))
        fresh = dist.new_group(timeout=datetime.timedelta(seconds=60))
        mine = torch.full((3,), rank + 1.0)
        out["fresh"] = attempt(lambda: dist.all_reduce(mine, group=fresh))
        out["fresh_sum"] = mine.tolist()
        out["world_after"] = attempt(lambda: dist.barrier())
    store.set(f"left{rank}", "1")
    if rank == 0:  # the store's host leaves last
        store.wait([f"left{r}" for r in range(world)], datetime.timedelta(seconds=100))
    print(json.dumps(out), flush=True)
    os._exit(0)  # no destroy_process_group: the group's sequence is broken on purpose


if __name__ == "__main__":
    sys.exit(main())
