"""Profile a few DDP steps on the `oddl` backend with torch.profiler, one Chrome trace per rank.

    oddl testbed up --run-dir runs/testbed --trace runs/trace    # the testbed records too
    oddl jobs submit --collective ring
    export ODDL_LOCAL_API=$(python -c "import json; d=json.load(open('runs/testbed/state.json'));
    print(','.join(d['agents'][n]['local_api'] for n in sorted(d['agents'])))")
    ODDL_TRACE_DIR=runs/trace torchrun --nproc-per-node 4 examples/profile_ddp.py --out runs/profile
    oddl testbed down                                           # writes the testbed's files
    oddl trace merge runs/trace runs/profile/rank*.json -o runs/timeline.json

Each rank writes `OUT/rank<R>.json` (the profiler's trace: `ProfilerStep#N` and an
`oddl:allreduce pg=0 seq=K` annotation per collective) and, with ODDL_TRACE_DIR set, the
backend writes `ODDL_TRACE_DIR/torch-rank<R>.trace.json` (the same calls as `torch` events,
with the agent's job and call number). The merged timeline puts them beside the testbed's
circuits, slots and chunks; open it in https://ui.perfetto.dev. Prints one JSON line per rank.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, schedule

import oddl.torch.backend  # noqa: F401  (registers the "oddl" backend)
from oddl.torch import trace as torch_trace


def main() -> None:
    """Train a small MLP for `--steps` profiled steps (after one warm-up step)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/profile", help="folder of the per-rank traces")
    p.add_argument("--steps", type=int, default=3, help="profiled training steps")
    p.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    args = p.parse_args()
    dist.init_process_group("oddl")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 10))
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    trace_file = os.path.join(args.out, f"rank{rank}.json")
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=1, active=args.steps),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(trace_file)) as prof:
        for _ in range(1 + args.steps):
            x = torch.randn(32, 64, generator=gen)
            loss = ddp(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    dist.barrier()
    written = torch_trace.flush()  # also written at exit; flushed here to print its path
    print(json.dumps({"rank": rank, "profile": trace_file, "oddl_trace": written,
                      "loss": float(loss)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
