"""One data-parallel training process of `oddl demo --train`: `python -m oddl.demo.train_worker`.

Trains a small CNN on scikit-learn's digits (8x8 images, shipped offline) with torch's
DistributedDataParallel over gloo, once per network named in `--networks`:

- `optical`: the gradient buckets go through the local oddl agent (the optical comm hook,
  `oddl.torch.ddp_hook`), each checked against the exact reduction over gloo (`--verify`);
- `oddl`: DDP with no hook over the `oddl` torch.distributed backend (oddl.torch.backend):
  every collective of the group goes through the local agent; bytes per iteration counted;
- `gloo`: DDP's own all-reduce over gloo, the baseline.

Both runs start from the same seed (same initial weights, same data order). The process talks
to its parent in JSON lines on stdout: `{"event": "ready"}` once torch is imported, then one
`epoch` line per epoch, one `result` line per network, or one `failed` line (exit code 1).
Logs go to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

NETWORKS = ("optical", "oddl", "gloo")


class PhaseFailed(Exception):
    """Training over one network failed; carries the hook's mismatch reports, if any."""

    def __init__(self, network: str, error: str, mismatches: list[str]):
        super().__init__(error)
        self.network = network
        self.mismatches = mismatches


def emit(event: str, **fields: Any) -> None:
    """One JSON line to the parent."""
    print(json.dumps({"event": event, **fields}), flush=True)


def load_digits_split(seed: int = 0) -> dict[str, np.ndarray]:
    """Digits as float32 images in [0, 1] (N, 1, 8, 8) and int64 labels; 75/25 stratified."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed,
                                              stratify=y)
    return {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te}


def build_model() -> Any:
    """A small CNN for 8x8 digits (about 38k parameters)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


def param_digest(model: Any) -> str:
    """SHA-256 of every parameter's bytes: equal on every rank iff the replicas agree."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class _Training:
    """One network's model, DDP wrapper, data and what its steps measured."""

    model: Any
    ddp: Any
    loader: Any
    sampler: Any
    optimizer: Any
    backend: Any
    """oddl.torch.backend when training over it (its counters are read per step), or None."""
    state: Any
    """The optical hook's state, or None."""
    test: tuple[Any, Any]
    steps: int = 0
    step_s: list[float] = field(default_factory=list)
    per_step: dict[str, list[int]] = field(default_factory=lambda: {
        "optical_bytes": [], "fallback_bytes": [], "fallback_calls": []})


def _setup(network: str, args: argparse.Namespace, data: dict[str, np.ndarray]) -> _Training:
    """The model (from the seed), DDP over `network` and the sharded data."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.manual_seed(args.seed)
    model = build_model()
    group, backend = None, None
    if network == "oddl":  # the backend: no hook, DDP's own calls go through the agent
        os.environ["ODDL_LOCAL_API"] = args.agent
        backend = importlib.import_module("oddl.torch.backend")
        group = dist.new_group(backend="oddl")
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb, process_group=group)
    state = None
    if network == "optical":
        from oddl.torch.ddp_hook import register

        state = register(ddp, args.agent, args.world, verify=args.verify,
                         asynchronous=not args.sync_hook, optinc_bits=args.optinc_bits)
    train_set = TensorDataset(torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"]))
    sampler: Any = DistributedSampler(train_set, num_replicas=args.world, rank=args.rank,
                                      shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch, sampler=sampler)
    return _Training(model, ddp, loader, sampler, torch.optim.Adam(ddp.parameters(), lr=args.lr),
                     backend, state, (torch.from_numpy(data["x_test"]),
                                      torch.from_numpy(data["y_test"])))


def _epoch(t: _Training, epoch: int) -> dict[str, Any]:
    """Train one epoch, then test; the epoch's record."""
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    t.sampler.set_epoch(epoch)
    t.ddp.train()
    total, correct, loss_sum = 0, 0, 0.0
    t0 = time.perf_counter()
    for x, y in t.loader:
        if t.backend is not None:
            t.backend.reset_counters()
        t_step = time.perf_counter()
        t.optimizer.zero_grad(set_to_none=True)
        out = t.ddp(x)
        loss = loss_fn(out, y)
        loss.backward()
        t.optimizer.step()
        t.step_s.append(time.perf_counter() - t_step)
        if t.backend is not None:
            sent = t.backend.counters()["total"]
            for key, values in t.per_step.items():
                values.append(sent[key])
        t.steps += 1
        loss_sum += float(loss) * len(y)
        correct += int((out.argmax(1) == y).sum())
        total += len(y)
    epoch_s = time.perf_counter() - t0
    t.model.eval()
    x_test, y_test = t.test
    with torch.no_grad():
        test_acc = float((t.model(x_test).argmax(1) == y_test).float().mean())
    return {"epoch": epoch + 1, "loss": loss_sum / total, "train_accuracy": correct / total,
            "test_accuracy": test_acc, "epoch_s": epoch_s}


def train(network: str, args: argparse.Namespace, data: dict[str, np.ndarray]) -> dict[str, Any]:
    """Train `args.epochs` epochs over `network`; emit an epoch line each; return the result."""
    import torch.distributed as dist

    t = _setup(network, args, data)
    epochs: list[dict[str, Any]] = []
    try:
        for epoch in range(args.epochs):
            record = _epoch(t, epoch)
            epochs.append(record)
            emit("epoch", network=network, rank=args.rank, **record)
            logger.info("%s epoch %d: loss %.4f, test accuracy %.4f, %.3f s", network, epoch + 1,
                        record["loss"], record["test_accuracy"], record["epoch_s"])
        dist.barrier()
    except Exception as exc:
        # DDP re-raises a failed hook future as a RuntimeError without the cause; the hook's
        # state has the exact report
        mismatches = t.state.stats()["mismatches"] if t.state is not None else []
        raise PhaseFailed(network, f"{type(exc).__name__}: {exc}", mismatches) from exc
    finally:
        hook = t.state.stats() if t.state is not None else None
        if t.state is not None:
            t.state.close()
    return {"network": network, "rank": args.rank, "epochs": epochs, "steps": t.steps,
            "final_test_accuracy": epochs[-1]["test_accuracy"] if epochs else 0.0,
            "param_digest": param_digest(t.model), "hook": hook, "step_s": t.step_s,
            "backend": t.per_step if t.backend is not None else None}


def run(args: argparse.Namespace) -> int:
    """Initialise torch.distributed, train over each network, report; return the exit code."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # four workers share the machine with the agents
    emit("ready", rank=args.rank)
    if args.data:
        with np.load(args.data) as npz:
            data = {k: npz[k] for k in npz.files}
    else:
        data = load_digits_split()
    dist.init_process_group("gloo", init_method=f"tcp://{args.store}", rank=args.rank,
                            world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    network = ""
    try:
        for network in args.networks.split(","):
            if network not in NETWORKS:
                raise ValueError(f"unknown network {network!r}; use {', '.join(NETWORKS)}")
            if network in ("optical", "oddl") and not args.agent:
                raise ValueError(f"--networks {network} needs --agent ADDRESS (the local agent "
                                 "API)")
            emit("result", **train(network, args, data))
    except PhaseFailed as exc:
        logger.exception("rank %d: training over %s failed", args.rank, exc.network)
        emit("failed", rank=args.rank, network=exc.network, mismatch=bool(exc.mismatches),
             error=exc.mismatches[0] if exc.mismatches else str(exc))
        return 1
    except Exception as exc:
        logger.exception("rank %d: training over %s failed", args.rank, network)
        emit("failed", rank=args.rank, network=network, mismatch=False,
             error=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The worker's options (the parent, oddl.demo.train, passes all of them)."""
    p = argparse.ArgumentParser(prog="python -m oddl.demo.train_worker", description=__doc__.split("\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True, help="HOST:PORT of rank 0's TCP store")
    p.add_argument("--agent", default="", help="the local agent API address (for optical)")
    p.add_argument("--networks", default="optical,gloo", help="comma-separated, run in order")
    p.add_argument("--data", default="", help="digits split as .npz (default: load it here)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="per-worker batch size")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--bucket-cap-mb", type=float, default=0.1,
                   help="DDP bucket size (small, so a step all-reduces more than one bucket)")
    p.add_argument("--optinc-bits", type=int, default=None,
                   help="the job runs optinc at this bit width: verify against the exact "
                   "quantised mean instead of the exact sum")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="check every optical bucket against the exact reduction over gloo")
    p.add_argument("--sync-hook", action="store_true",
                   help="call the agent on the backward pass's thread (no overlap)")
    p.add_argument("--timeout", type=float, default=120.0, help="torch.distributed timeout, s")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = build_parser().parse_args(argv)
    if sys.platform.startswith("linux"):
        from oddl.launch.processes import request_parent_death_signal

        parent = os.getppid()
        # the parent starts us without a preexec_fn (see oddl.demo.train)
        request_parent_death_signal()
        if os.getppid() != parent:
            return 1
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s rank{args.rank} %(name)s: %(message)s")
    if args.data and not Path(args.data).is_file():
        print(f"no such data file: {args.data}", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
