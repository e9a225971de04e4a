"""A torchrun script on the `oddl` backend, one rank per host, or (with --reference) the same
training in one process on the whole batch. Writes the trained parameters (exact float64
values as hex) to --out.

With equal batches per rank, DDP's averaged gradient equals the full batch's gradient, so
the parameters of every rank must be identical and equal the reference up to summation order.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn

FEATURES, BATCH, STEPS = 16, 32, 20


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1)).double()


def data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(world * BATCH, FEATURES, generator=g, dtype=torch.float64)
    return x, x[:, :1] * 0.5 - x[:, 1:2]


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def dump(model: nn.Module, path: str) -> None:
    params = [p.detach().numpy().ravel().tolist() for p in model.parameters()]
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"params": [[v.hex() for v in group] for group in params]}, fh)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reference", type=int, default=0, help="world size to emulate in one process")
    args = p.parse_args()
    if args.reference:
        model = make_model()
        x, y = data(args.reference)
        train(model, x, y)
        dump(model, args.out)
        return 0
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import oddl.torch.backend  # noqa: F401  registers the backend

    dist.init_process_group("oddl")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = data(world)
    ddp = DistributedDataParallel(make_model())
    train(ddp, x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH])
    dump(ddp.module, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
