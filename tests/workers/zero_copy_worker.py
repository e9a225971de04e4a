"""One rank of the zero-copy DDP test: `python tests/workers/zero_copy_worker.py`.

Started four times by tests/top/test_adopted.py with torchrun's environment and ODDL_LOCAL_API;
trains the same model with DDP over the `oddl` backend and over gloo, from the same seed on
the same data, with the gradients as views into DDP's buckets (as DDP does by default for
its buckets; `gradient_as_bucket_view` makes the parameters' grads views too), and prints
one JSON line: both runs' parameters, and whether the oddl run's buckets were promoted.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

import oddl.torch.backend  # noqa: F401  (registers the backend)
import oddl.torch.channel as oc


def train(group: Any, rank: int) -> tuple[torch.nn.Module, list[bool]]:
    """Five steps of DDP on `group`; the model and, per parameter, whether its grad lives in
    shared memory at the end."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 10))  # 540 KB of gradients
    ddp = DistributedDataParallel(model, process_group=group, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(5):
        x = torch.randn(16, 256, generator=data)
        y = torch.randint(0, 10, (16,), generator=data)
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    shared = [p.grad is not None and p.grad.untyped_storage().is_shared()
              for p in model.parameters()]
    return model, shared


def main() -> int:
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("oddl", timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    try:
        oddl_model, oddl_shared = train(None, rank)
        assert oc._channel is not None
        promoted = oc._channel.promoter.promoted
        gloo_model, _ = train(gloo, rank)
        out = {"rank": rank, "promoted": promoted, "grads_shared": oddl_shared,
               "oddl": [p.detach().reshape(-1).tolist() for p in oddl_model.parameters()],
               "gloo": [p.detach().reshape(-1).tolist() for p in gloo_model.parameters()]}
    finally:
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
