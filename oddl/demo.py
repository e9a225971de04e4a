"""`oddl demo` (= `make demo`): the emulated four-node testbed, end to end.

Starts the emulated devices and optical fabric, the controller and four agents as separate
processes (the same commands a lab runs), trains a small numpy MLP data-parallel on four
workers whose gradient all-reduce goes through the agents, first over the scheduled optical
circuits and then over an ideal electrical network (ungated full mesh, same line rate), and
prints a summary. Every all-reduce result is checked against the exact reduction; the demo
exits 1 if any differs. Everything it started is stopped, also on Ctrl-C and on failure.

With ``--collective optinc`` the two runs are ring all-reduce and optinc (both on the optical
network): optinc's results are checked against the exact *quantised* reduction
(`agents.executor.optinc_expected`), which they equal except where the OptINC device's
noisy optics missed a level — the device counts those elements, and the demo fails unless every
difference is one of them. The summary compares final accuracy and all-reduce time to ring.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.client import AgentClient, allreduce_all
from agents.executor import OPTINC, optinc_expected
from common.errors import OddlError
from oddl.operator import OperatorClient
from oddl.procs import ProcessGroup, oddl_command

logger = logging.getLogger(__name__)

DEFAULT_TESTBED = Path(__file__).resolve().parent.parent / "deploy" / "testbeds" / "emulated-4node.toml"


# ---- the workload: a small MLP trained data-parallel with numpy -----------------------------


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


def train(clients: list[AgentClient], iterations: int, n_params: int, network: str,
          seed: int = 7,
          expect: Callable[[Sequence[np.ndarray]], np.ndarray] | None = None) -> RunResult:
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
    grads: list[np.ndarray | None] = [None] * n_workers
    outs: list[np.ndarray | None] = [None] * n_workers
    stats: list[tuple[float, float]] = [(0.0, 0.0)] * n_workers
    ar_time = [0.0] * n_workers
    failure: list[str] = []

    def worker(rank: int, it: int) -> None:
        idx = shards[rank][(it * batch) % len(shards[rank]):][:batch]
        if len(idx) < batch:
            idx = shards[rank][:batch]
        loss, acc, g = model.loss_and_grad(x[idx], y[idx])
        grads[rank], stats[rank] = g, (loss, acc)
        barrier.wait()
        t = time.perf_counter()
        try:
            outs[rank] = clients[rank].allreduce(g)
        except OddlError as exc:
            failure.append(f"rank {rank}: {exc}")
            outs[rank] = None
        ar_time[rank] = time.perf_counter() - t

    for it in range(iterations):
        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(r, it)) for r in range(n_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failure:
            result.errors.extend(failure)
            break
        if expect is not None:
            want = expect([g for g in grads if g is not None])
            result.mismatched_elements += int(np.count_nonzero(outs[0] != want))
            for r, out in enumerate(outs):
                if out is None or not np.array_equal(out, outs[0]):
                    result.mismatches.append(f"iteration {it} rank {r}: differs from rank 0")
        else:
            stacked = np.stack(grads).astype(np.float64)
            exact = stacked.sum(axis=0)
            # float32 summation in any order stays within (N-1)·eps·Σ|x| of the exact sum
            bound = (n_workers - 1) * np.finfo(np.float32).eps * np.abs(stacked).sum(axis=0)
            for r, out in enumerate(outs):
                if out is None or out.shape != exact.shape or not np.all(
                        np.abs(out - exact) <= bound * 1.01 + 1e-30):
                    err = float(np.abs(out - exact).max()) if out is not None else float("nan")
                    result.mismatches.append(f"iteration {it} rank {r}: max error {err:.3g}")
        model.params -= lr * (outs[0] / (n_workers * batch)).astype(np.float32)
        result.iteration_s.append(time.perf_counter() - t0)
        result.allreduce_s.append(max(ar_time))
        result.losses.append(float(np.mean([s[0] for s in stats])))
        result.accuracy = float(np.mean([s[1] for s in stats]))
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


# ---- orchestration ------------------------------------------------------------------------


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50_us": 0.0, "p99_us": 0.0, "max_us": 0.0, "samples": 0}
    a = np.abs(np.array(values))
    return {"p50_us": float(np.percentile(a, 50) * 1e6), "p99_us": float(np.percentile(a, 99) * 1e6),
            "max_us": float(a.max() * 1e6), "samples": int(a.size)}


def _fabric_stats(address: str) -> dict[str, Any]:
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart([b"S"])
        if sock.poll(2000):
            frames = sock.recv_multipart()
            return json.loads(frames[1])
        return {}
    finally:
        sock.close(0)


def run_testbed_demo(config: Path, run_dir: Path, iterations: int, n_params: int,
                     collective: str, progress: bool = True) -> dict[str, Any]:
    """Start everything, run both trainings, stop everything; return the summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = run_dir / "testbed.resolved.toml"

    def say(msg: str) -> None:
        if progress:
            print(f"[demo] {msg}", flush=True)

    with ProcessGroup(run_dir) as group:
        say(f"starting emulated devices and fabric ({config.name}); logs in {run_dir}")
        emu = group.start("emulators", oddl_command("emulate", "testbed", "--config", str(config),
                                                    "--resolved", str(resolved)))
        say("starting the controller")
        ctl = group.start("controller", oddl_command(
            "controller", "serve", "--config", str(resolved), "--listen", "127.0.0.1:0",
            "--state", str(run_dir / "controller.sqlite")))
        address = ctl["address"]
        from common.config import load_testbed

        cfg = load_testbed(resolved)
        apis = {}
        for node in cfg.nodes:
            say(f"starting agent {node.id}")
            info = group.start(f"agent-{node.id}", oddl_command(
                "agent", "serve", "--config", str(resolved), "--node", node.id,
                "--controller", address))
            apis[node.id] = info["local_api"]
        operator = OperatorClient(address)
        clients = [AgentClient(apis[n.id]) for n in cfg.nodes]
        runs: dict[str, RunResult] = {}
        jobs: dict[str, dict[str, Any]] = {}
        problems: list[str] = []
        device: dict[str, Any] = {}
        # (run name, collective, network): optinc is compared with ring, the others with ideal
        legs = ([("ring", "ring", "optical"), (OPTINC, OPTINC, "optical")]
                if collective == OPTINC else
                [("optical", collective, "optical"), ("ideal", collective, "ideal")])
        try:
            for name, coll, network in legs:
                job = operator.submit(f"demo-{name}", [n.id for n in cfg.nodes], coll,
                                      network)
                say(f"{job['id']}: {coll} all-reduce on the {network} network")
                expect = None
                if coll == OPTINC:
                    dev = cfg.optinc_device(None)
                    if dev is None:
                        raise OddlError(f"{config}: no OptINC device; the optinc demo needs one")
                    bits = dev.bits
                    expect = functools.partial(optinc_expected, bits=bits)
                    before = _fabric_stats(emu["fabric"]).get(OPTINC, {}).get(dev.id, {})
                else:
                    problems += integer_check(clients)
                runs[name] = train(clients, iterations, n_params, network, expect=expect)
                if coll == OPTINC:
                    after = _fabric_stats(emu["fabric"]).get(OPTINC, {}).get(dev.id, {})
                    device = _device_delta(dev.id, bits, before, after)
                    inexact = device.get("inexact_elements", 0)
                    if runs[name].mismatched_elements > inexact:
                        problems.append(
                            f"optinc: {runs[name].mismatched_elements} result elements differ "
                            f"from the exact quantised mean, but the device's optics missed "
                            f"only {inexact}")
                s = runs[name].summary()
                say(f"  {s['iterations']} iterations, median {s['iteration_ms_median']:.1f} ms, "
                    f"loss {s['first_loss'] or 0:.3f} → {s['final_loss'] or 0:.3f}, "
                    f"accuracy {s['final_accuracy']:.2f}")
                jobs[name] = operator.cancel(job["id"])
            status = operator.status()
            agent_status = [c.status() for c in clients]
            fabric = _fabric_stats(emu["fabric"]) if emu.get("fabric") else {}
        finally:
            for c in clients:
                c.close()
            operator.close()
        say("stopping everything")
    gate_errors = [e for a in agent_status for e in a.get("gate_errors", [])]
    for r in runs.values():
        problems += r.mismatches + r.errors
    if collective == OPTINC:
        return _optinc_summary(cfg, runs, jobs, device, gate_errors, fabric, problems, n_params,
                               run_dir)
    opt, ideal = runs["optical"].summary(), runs["ideal"].summary()
    return {
        "testbed": cfg.name, "collective": collective, "nodes": len(cfg.nodes),
        "gradient_elements": model_shape(n_params)[1] * 74,
        "line_rate_gbps": cfg.fabric.line_rate_gbps,
        "optical": opt, "ideal": ideal,
        "ratio_optical_over_ideal": (opt["iteration_ms_median"] / ideal["iteration_ms_median"]
                                     if ideal["iteration_ms_median"] else None),
        "allreduce_ratio_optical_over_ideal": (
            opt["allreduce_ms_median"] / ideal["allreduce_ms_median"]
            if ideal["allreduce_ms_median"] else None),
        "reconfigurations": int(jobs["optical"].get("reconfigurations", 0)),
        "device_retunes_total": int(status.get("reconfigurations", 0)),
        "guard_time_ms": float(jobs["optical"].get("guard_time_s", 0.0)) * 1e3,
        "slot_gate_error": _percentiles(gate_errors),
        "fabric": fabric,
        "all_results_exact": not problems,
        "problems": problems[:20],
        "run_dir": str(run_dir),
    }


def _device_delta(device_id: str, bits: int, before: dict[str, Any],
                  after: dict[str, Any]) -> dict[str, Any]:
    """What the OptINC device did during one run (its counters after minus before)."""
    out: dict[str, Any] = {"id": device_id, "bits": bits}
    for key in ("passes", "elements", "model_s", "inexact_elements", "scale_rounds"):
        out[key] = after.get(key, 0) - before.get(key, 0)
    out["elements_per_s"] = out["elements"] / out["model_s"] if out["model_s"] > 0 else 0.0
    out["refused"] = after.get("refused", {})
    return out


def _optinc_summary(cfg: Any, runs: dict[str, RunResult], jobs: dict[str, dict[str, Any]],
                    device: dict[str, Any], gate_errors: list[float], fabric: dict[str, Any],
                    problems: list[str], n_params: int, run_dir: Path) -> dict[str, Any]:
    """The summary of `oddl demo --collective optinc`: optinc next to ring."""
    ring, opt = runs["ring"].summary(), runs[OPTINC].summary()

    def ratio(key: str) -> float | None:
        return opt[key] / ring[key] if ring[key] else None

    return {
        "testbed": cfg.name, "collective": OPTINC, "baseline": "ring", "nodes": len(cfg.nodes),
        "gradient_elements": model_shape(n_params)[1] * 74,
        "line_rate_gbps": cfg.fabric.line_rate_gbps,
        "ring": ring, OPTINC: opt,
        "allreduce_ratio_optinc_over_ring": ratio("allreduce_ms_median"),
        "iteration_ratio_optinc_over_ring": ratio("iteration_ms_median"),
        "final_accuracy_difference": opt["final_accuracy"] - ring["final_accuracy"],
        "train_accuracy_difference": opt["train_accuracy"] - ring["train_accuracy"],
        "quantisation": {"bits": device.get("bits"), "encoding": "offset binary, per-tensor "
                         "scale = agreed max|x| / (2^(b-1) - 1)",
                         "result": "N x decoded quantised mean (approximate sum)"},
        "device": device,
        "mismatched_elements": runs[OPTINC].mismatched_elements,
        "reconfigurations": int(jobs[OPTINC].get("reconfigurations", 0)),
        "slot_gate_error": _percentiles(gate_errors),
        "fabric": {k: v for k, v in fabric.items() if k != OPTINC},
        "all_results_exact": not problems,
        "problems": problems[:20],
        "run_dir": str(run_dir),
    }


def format_optinc_summary(s: dict[str, Any]) -> str:
    """`oddl demo --collective optinc`'s summary for people."""
    r, o, d = s["ring"], s[OPTINC], s["device"]
    g = s["slot_gate_error"]

    def ms(x: float) -> str:
        return f"{x:>17.1f} ms"

    ar = s["allreduce_ratio_optinc_over_ring"]
    lines = [
        "",
        f"oddl demo — {s['testbed']}: optinc (OptINC device, {d.get('bits')}-bit levels) vs "
        f"ring all-reduce of {s['gradient_elements']:,} float32 gradients on {s['nodes']} "
        f"nodes at {s['line_rate_gbps']:g} Gbit/s",
        "",
        f"{'':24}{'ring (optical)':>20}{'optinc (optical)':>20}",
        f"{'iteration time (median)':24}{ms(r['iteration_ms_median'])}{ms(o['iteration_ms_median'])}",
        f"{'all-reduce (median)':24}{ms(r['allreduce_ms_median'])}{ms(o['allreduce_ms_median'])}",
        f"{'final loss':24}{r['final_loss'] or 0:>20.4f}{o['final_loss'] or 0:>20.4f}",
        f"{'final batch accuracy':24}{r['final_accuracy']:>20.3f}{o['final_accuracy']:>20.3f}",
        f"{'training-set accuracy':24}{r['train_accuracy']:>20.3f}{o['train_accuracy']:>20.3f}",
        "",
        f"all-reduce time ratio optinc/ring: {ar:.3f}" if ar else "all-reduce ratio: n/a",
        f"accuracy difference optinc − ring: {s['train_accuracy_difference']:+.4f} "
        f"(training set), {s['final_accuracy_difference']:+.4f} (final batch)",
        f"OptINC device: {d.get('passes', 0)} passes, {d.get('elements', 0):,} elements, "
        f"MZI model {d.get('elements_per_s', 0.0) / 1e6:.1f} M elements/s, "
        f"{d.get('inexact_elements', 0)} elements missed by the noisy optics",
        f"slot-gate error: p50 {g['p50_us']:.1f} µs, p99 {g['p99_us']:.1f} µs, "
        f"max {g['max_us']:.1f} µs ({g['samples']} sends)",
        f"every all-reduce equal to the exact (quantised, for optinc) reduction: "
        f"{'yes' if s['all_results_exact'] else 'NO'}",
    ]
    if s["problems"]:
        lines += ["problems:", *[f"  {p}" for p in s["problems"]]]
    lines.append(f"logs: {s['run_dir']}")
    return "\n".join(lines)


def format_summary(s: dict[str, Any]) -> str:
    """The demo's summary for people."""
    if s.get("collective") == OPTINC:
        return format_optinc_summary(s)
    o, i = s["optical"], s["ideal"]
    g = s["slot_gate_error"]
    lines = [
        "",
        f"oddl demo — {s['testbed']}: {s['collective']} all-reduce of "
        f"{s['gradient_elements']:,} float32 gradients on {s['nodes']} nodes at "
        f"{s['line_rate_gbps']:g} Gbit/s",
        "",
        f"{'':24}{'optical (scheduled)':>22}{'ideal electrical':>20}",
        f"{'iteration time (median)':24}{o['iteration_ms_median']:>19.1f} ms{i['iteration_ms_median']:>17.1f} ms",
        f"{'all-reduce (median)':24}{o['allreduce_ms_median']:>19.1f} ms{i['allreduce_ms_median']:>17.1f} ms",
        f"{'final loss':24}{o['final_loss'] or 0:>22.4f}{i['final_loss'] or 0:>20.4f}",
        f"{'final accuracy':24}{o['final_accuracy']:>22.3f}{i['final_accuracy']:>20.3f}",
        "",
        f"iteration-time ratio optical/ideal: {s['ratio_optical_over_ideal']:.3f}"
        if s["ratio_optical_over_ideal"] else "iteration-time ratio: n/a",
        f"reconfigurations (transmitter retunes in the job): {s['reconfigurations']}",
        f"guard time spent: {s['guard_time_ms']:.2f} ms",
        f"slot-gate error: p50 {g['p50_us']:.1f} µs, p99 {g['p99_us']:.1f} µs, "
        f"max {g['max_us']:.1f} µs ({g['samples']} sends)",
        _fabric_line(s["fabric"]),
        f"every all-reduce equal to the exact reduction: {'yes' if s['all_results_exact'] else 'NO'}",
    ]
    if s["problems"]:
        lines += ["problems:", *[f"  {p}" for p in s["problems"]]]
    lines.append(f"logs: {s['run_dir']}")
    return "\n".join(lines)


def _fabric_line(fabric: dict[str, Any]) -> str:
    """What the emulated fabric carried: the agents' streams (chunks) or the relay (frames)."""
    st = fabric.get("streams")
    if st:
        return (f"fabric: {st['delivered']:.0f} chunks delivered ({st['delivered_bytes'] / 2**20:.0f}"
                f" MiB), {st['lost']:.0f} lost, {st['late']:.0f} late (worst "
                f"{st['worst_late_s'] * 1e3:.1f} ms after their serialisation end)")
    return (f"fabric: {fabric.get('delivered', 0)} frames delivered, "
            f"{sum(fabric.get('lost', {}).values())} lost")


def run_demo(args: argparse.Namespace) -> int:
    """The `oddl demo` command."""
    config = Path(args.config) if args.config else DEFAULT_TESTBED
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    summary = run_testbed_demo(config, run_dir, args.iterations, args.params, args.collective,
                               progress=not args.json)
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0 if summary["all_results_exact"] else 1
