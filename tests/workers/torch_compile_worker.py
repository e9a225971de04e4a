"""One rank of a `torch.compile`d model trained with DDP (issue 33), under torchrun.

`python tests/workers/torch_compile_worker.py OUT_DIR BACKEND COMPILER`: the model is seeded
alike on every rank, wrapped in DistributedDataParallel on process group BACKEND (`oddl` or
`gloo`) and compiled with `torch.compile(ddp, backend=COMPILER)` (inductor, or aot_eager,
which needs no C compiler); DDP's optimizer splits the compiled graph at its gradient buckets,
so the all-reduces run between compiled pieces. Each rank trains a few steps on its own data
and writes its final parameters (and the backend's counters) to OUT_DIR/rank<r>.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from oddl.torch import backend as oddl_backend

STEPS = 4
BATCH = 16
IN, OUT = 256, 8


def main() -> int:
    out, backend, compiler = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group(backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, OUT))
    # 1.6 MB of parameters in 1 MB buckets (DDP's first bucket is 1 MB, and its optimizer for
    # compiled graphs wants no smaller ones): the compiled graph is split in two
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)
    compiled = torch.compile(ddp, backend=compiler)
    opt = torch.optim.SGD(compiled.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, IN, generator=data)
        y = torch.randn(BATCH, OUT, generator=data)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "losses": losses, "params": params.tolist(),
        "digest": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
        "counters": oddl_backend.counters()}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    sys.exit(main())
