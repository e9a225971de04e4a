"""PyTorch Lightning's DDP on the `oddl` backend: a small classifier on synthetic data.

    oddl testbed up --run-dir runs/testbed
    oddl jobs submit --collective ring --nodes n0,n1       # a job of as many nodes as ranks
    export ODDL_LOCAL_API=$(python -c "import json; d=json.load(open('runs/testbed/state.json'));
    print(','.join(d['agents'][n]['local_api'] for n in ('n0', 'n1')))")
    torchrun --standalone --nproc-per-node 2 examples/lightning_ddp.py --out runs/lightning
    oddl testbed down

The only line that names the optics is the strategy: ``DDPStrategy(process_group_backend=
"oddl")`` (``--backend gloo`` runs the same script on gloo, for comparison). The module logs its
losses with ``sync_dist=True`` (all-reduced across the ranks every step), validates every
epoch, keeps the best checkpoint (ModelCheckpoint on ``val_loss``) and stops early when it stops
improving (EarlyStopping). Lightning itself all-reduces the loaders' lengths as 0-d tensors,
broadcasts the checkpoint path and all-reduces the early-stopping decision. Needs the extra
``oddl[lightning]``. Each rank prints one JSON line: its final parameters, their digest, the
epochs run, the synced validation losses (the sanity check's first) and the best checkpoint.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import oddl.torch.backend as oddl_backend  # registers the "oddl" backend

FEATURES, CLASSES = 8, 3


def synthetic(n: int, seed: int) -> TensorDataset:
    """`n` points of FEATURES features, labelled by a fixed random linear map (every rank
    makes the same set; Lightning's distributed sampler gives each rank its share)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1234))
    return TensorDataset(x, (x @ w).argmax(1))


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class History(pl.Callback):
    """The synced validation loss at each validation's end (the sanity check's first)."""

    def __init__(self) -> None:
        self.val_losses: list[float] = []

    def on_validation_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.val_losses.append(float(trainer.callback_metrics["val_loss"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/lightning", help="folder of the checkpoints")
    p.add_argument("--backend", default="oddl", help="process group backend (oddl or gloo)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="the process group's timeout (bounds every collective)")
    args = p.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    checkpoints = ModelCheckpoint(dirpath=Path(args.out) / "checkpoints", monitor="val_loss",
                                  save_top_k=1)
    history = History()
    trainer = pl.Trainer(
        accelerator="cpu", devices=local, num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // local,
        strategy=DDPStrategy(process_group_backend=args.backend,
                             timeout=datetime.timedelta(seconds=args.timeout_s)),
        max_epochs=args.epochs,
        callbacks=[checkpoints, EarlyStopping("val_loss", patience=2), history],
        logger=False, enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    model = Classifier()
    trainer.fit(model, DataLoader(synthetic(256, args.seed), batch_size=16),
                DataLoader(synthetic(64, args.seed + 1), batch_size=16))
    params = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    line = json.dumps({
        "rank": trainer.global_rank, "backend": args.backend, "epochs": trainer.current_epoch,
        "global_step": trainer.global_step, "metrics": metrics, "val_losses": history.val_losses,
        "best_checkpoint": checkpoints.best_model_path,
        "digest": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
        "params": params.tolist(), "counters": oddl_backend.counters()})
    print(line, flush=True)
    # the ranks share torchrun's stdout, where two long lines can interleave: a file each too
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"result-rank{trainer.global_rank}.json").write_text(line)


if __name__ == "__main__":
    main()
