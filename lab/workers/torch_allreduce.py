"""`dist.all_reduce` on every host, one rank per host under torchrun (static rendezvous on the
first host, as `lab.procedure.torchrun` starts DDP): on torch's gloo backend, what a user
would run instead of oddl on the same hosts and links, or on the `oddl` backend (its job in
ODDL_JOB, its agent at ODDL_LOCAL_API), whose ranks move their own bytes where the job allows
it (decision record 0040).

The payloads are those `allreduce_worker.py` all-reduces through its agent: call k of rank r
sends a new int64 tensor made before the call's clock starts, and its result is checked exact.
One JSON line per call on stdout, in the same fields, so `lab.measure` times all alike; on
the `oddl` backend each line also says whether the rank path ran it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from allreduce_worker import expected, payload  # the same folder (lab/workers)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=("gloo", "oddl"), default="gloo")
    p.add_argument("--elements", type=int, default=1000)
    p.add_argument("--count", type=int, default=5)
    args = p.parse_args()
    if args.backend == "oddl":
        import oddl.torch.backend  # noqa: F401  registers the backend
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(args.count):
        mine = torch.from_numpy(payload(step, rank, args.elements))
        record: dict[str, object] = {"rank": rank, "step": step, "start": time.time()}
        dist.all_reduce(mine)
        record["end"] = time.time()
        record["ok"] = bool(np.array_equal(mine.numpy(), expected(step, world, args.elements)))
        if not record["ok"]:
            record["wrong"] = f"first elements {mine[:3].tolist()}"
        if args.backend == "oddl":
            import oddl.torch.channel as channel

            record["rank_path"] = channel._channel is not None and \
                channel._channel.rank_path is not None
        print(json.dumps(record), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
