"""The workload of `oddl demo`: a small numpy MLP trained data-parallel over the agents.

Every all-reduce result is checked: against the exact sum (float32 summation bound), or with
an expectation (optinc) against it bit for bit. `integer_check` adds one bit-exact int64
all-reduce with uneven chunks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all
from oddl.common.errors import OddlError


@dataclass
class MlpModel:
    """A two-layer MLP (tanh hidden layer, softmax output) with flat float32 parameters."""

    n_in: int
    n_hidden: int
    n_out: int
    params: np.ndarray

    @classmethod
    def create(cls, n_in: int, n_hidden: int, n_out: int, seed: int) -> MlpModel:
        rng = np.random.default_rng(seed)
        w1 = rng.standard_normal((n_in, n_hidden)) / np.sqrt(n_in)
        w2 = rng.standard_normal((n_hidden, n_out)) / np.sqrt(n_hidden)
        return cls(n_in, n_hidden, n_out, np.concatenate([w1.ravel(), w2.ravel()]).astype(np.float32))

    def _split(self) -> tuple[np.ndarray, np.ndarray]:
        k = self.n_in * self.n_hidden
        return (self.params[:k].reshape(self.n_in, self.n_hidden),
                self.params[k:].reshape(self.n_hidden, self.n_out))

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray]:
        """Mean cross-entropy, accuracy and the flat gradient (summed over the batch)."""
        w1, w2 = self._split()
        h = np.tanh(x @ w1)
        logits = h @ w2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        n = x.shape[0]
        loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean())
        acc = float((p.argmax(axis=1) == y).mean())
        d = p
        d[np.arange(n), y] -= 1.0
        g2 = h.T @ d
        g1 = x.T @ ((d @ w2.T) * (1 - h * h))
        return loss, acc, np.concatenate([g1.ravel(), g2.ravel()]).astype(np.float32)


def model_shape(n_params: int) -> tuple[int, int, int]:
    """(inputs, hidden, outputs) of the demo MLP closest to `n_params` parameters."""
    n_in, n_out = 64, 10
    return n_in, max(8, n_params // (n_in + n_out)), n_out


def make_data(n: int, n_in: int, n_out: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A Gaussian-mixture classification set (deterministic)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_out, n_in)) * 0.22
    y = rng.integers(0, n_out, n)
    x = centres[y] + rng.standard_normal((n, n_in))
    return x.astype(np.float32), y


@dataclass
class RunResult:
    """What one training run measured."""

    network: str
    iteration_s: list[float] = field(default_factory=list)
    allreduce_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    accuracy: float = 0.0
    mismatches: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    train_accuracy: float = 0.0
    """Accuracy of the final model on the whole training set."""
    mismatched_elements: int = 0
    """With an expectation (optinc): elements of rank 0's results that differ from it."""

    def summary(self) -> dict[str, Any]:
        it = np.array(self.iteration_s[1:] or self.iteration_s or [0.0])
        ar = np.array(self.allreduce_s[1:] or self.allreduce_s or [0.0])
        return {"network": self.network, "iterations": len(self.iteration_s),
                "iteration_ms_mean": float(it.mean() * 1e3),
                "iteration_ms_median": float(np.median(it) * 1e3),
                "allreduce_ms_median": float(np.median(ar) * 1e3),
                "first_loss": self.losses[0] if self.losses else None,
                "final_loss": self.losses[-1] if self.losses else None,
                "final_accuracy": self.accuracy, "train_accuracy": self.train_accuracy,
                "mismatches": len(self.mismatches), "errors": self.errors}


Expectation = Callable[[Sequence[np.ndarray]], np.ndarray]
"""The exact result an all-reduce of these inputs must give (bit for bit)."""


@dataclass
class _Step:
    """One iteration's per-rank values, filled by the worker threads."""

    n_workers: int
    grads: list[np.ndarray | None] = field(default_factory=list)
    outs: list[np.ndarray | None] = field(default_factory=list)
    stats: list[tuple[float, float]] = field(default_factory=list)
    ar_time: list[float] = field(default_factory=list)
    failure: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.grads = [None] * self.n_workers
        self.outs = [None] * self.n_workers
        self.stats = [(0.0, 0.0)] * self.n_workers
        self.ar_time = [0.0] * self.n_workers


def check_results(result: RunResult, it: int, step: _Step, expect: Expectation | None) -> None:
    """Record in `result` every rank whose all-reduce result of iteration `it` is wrong."""
    grads, outs = step.grads, step.outs
    if expect is not None:
        want = expect([g for g in grads if g is not None])
        first = outs[0]
        result.mismatched_elements += int(np.count_nonzero(first != want))
        for r, out in enumerate(outs):
            if out is None or first is None or not np.array_equal(out, first):
                result.mismatches.append(f"iteration {it} rank {r}: differs from rank 0")
        return
    stacked = np.stack([g for g in grads if g is not None]).astype(np.float64)
    exact = stacked.sum(axis=0)
    # float32 summation in any order stays within (N-1)·eps·Σ|x| of the exact sum
    bound = (step.n_workers - 1) * np.finfo(np.float32).eps * np.abs(stacked).sum(axis=0)
    for r, out in enumerate(outs):
        if out is None or out.shape != exact.shape or not np.all(
                np.abs(out - exact) <= bound * 1.01 + 1e-30):
            err = float(np.abs(out - exact).max()) if out is not None else float("nan")
            result.mismatches.append(f"iteration {it} rank {r}: max error {err:.3g}")


def train(clients: list[AgentClient], iterations: int, n_params: int, network: str,
          seed: int = 7, expect: Expectation | None = None) -> RunResult:
    """Train data-parallel on len(clients) workers; check every all-reduce against np.sum.

    With `expect` (optinc) every result must equal ``expect(gradients)`` instead, bit for bit;
    differing elements of rank 0 are counted in `RunResult.mismatched_elements` (the caller
    compares them with the device's count) and ranks must agree with each other exactly.
    """
    n_workers = len(clients)
    n_in, n_hidden, n_out = model_shape(n_params)
    model = MlpModel.create(n_in, n_hidden, n_out, seed)
    x, y = make_data(256 * n_workers * 4, n_in, n_out, seed + 1)
    shards = np.array_split(np.arange(len(y)), n_workers)
    result = RunResult(network)
    lr = 0.05
    batch = 64
    barrier = threading.Barrier(n_workers)
    step = _Step(n_workers)

    def worker(rank: int, it: int) -> None:
        idx = shards[rank][(it * batch) % len(shards[rank]):][:batch]
        if len(idx) < batch:
            idx = shards[rank][:batch]
        loss, acc, g = model.loss_and_grad(x[idx], y[idx])
        step.grads[rank], step.stats[rank] = g, (loss, acc)
        barrier.wait()
        t = time.perf_counter()
        try:
            step.outs[rank] = clients[rank].allreduce(g)
        except OddlError as exc:
            step.failure.append(f"rank {rank}: {exc}")
            step.outs[rank] = None
        step.ar_time[rank] = time.perf_counter() - t

    for it in range(iterations):
        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(r, it)) for r in range(n_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if step.failure:
            result.errors.extend(step.failure)
            break
        check_results(result, it, step, expect)
        first = step.outs[0]
        assert first is not None  # every rank returned (no failure)
        model.params -= lr * (first / (n_workers * batch)).astype(np.float32)
        result.iteration_s.append(time.perf_counter() - t0)
        result.allreduce_s.append(max(step.ar_time))
        result.losses.append(float(np.mean([s[0] for s in step.stats])))
        result.accuracy = float(np.mean([s[1] for s in step.stats]))
    result.train_accuracy = model.loss_and_grad(x, y)[1]
    return result


def integer_check(clients: list[AgentClient]) -> list[str]:
    """One bit-exact all-reduce of int64 arrays (odd length, so chunks are uneven)."""
    rng = np.random.default_rng(3)
    arrays = [rng.integers(-2**40, 2**40, 100_003) for _ in clients]
    _elapsed, outs = allreduce_all(clients, arrays)
    exact = np.sum(np.stack(arrays), axis=0)
    bad = []
    for r, out in enumerate(outs):
        if isinstance(out, Exception):
            bad.append(f"int64 check rank {r}: {out}")
        elif not np.array_equal(out, exact):
            bad.append(f"int64 check rank {r}: result differs from the exact sum")
    return bad
