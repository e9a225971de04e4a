"""What `oddl demo --train` reports: each network's run from the ranks' result lines, the
checks that decide whether the demo passed, and the summary as a dict and as text."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from oddl.common.config import TestbedConfig
from oddl.demo.report import closing_lines, percentiles
from oddl.demo.train_supervisor import WORLD


@dataclass
class TrainOptions:
    """How `run_train_demo` trains (see its docstring)."""

    collective: str
    epochs: int
    seed: int
    bucket_cap_mb: float
    verify: bool
    sync_hook: bool
    accuracy_tolerance: float
    worker_module: str
    backend: str

    @property
    def first(self) -> str:
        """The network of the run compared with gloo: ``optical`` (hook) or ``oddl``."""
        return "optical" if self.backend == "hook" else "oddl"


@dataclass
class TrainOutcome:
    """What the training runs left behind, for the summary."""

    sizes: dict[str, int] = field(default_factory=dict)
    """Training and test images."""
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    inexact_ranks: set[int] = field(default_factory=set)
    """Ranks whose optical all-reduce differed from the exact reduction."""
    job_info: dict[str, Any] = field(default_factory=dict)
    agent_status: list[dict[str, Any]] = field(default_factory=list)
    fabric: dict[str, Any] = field(default_factory=dict)


def phase_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One network's run from the four ranks' result lines."""
    results = sorted(results, key=lambda r: r["rank"])
    n_epochs = len(results[0]["epochs"])
    # an epoch ends when its slowest rank ends
    epoch_s = [max(r["epochs"][e]["epoch_s"] for r in results) for e in range(n_epochs)]
    steady = epoch_s[1:] or epoch_s
    losses = [float(np.mean([r["epochs"][e]["loss"] for r in results])) for e in range(n_epochs)]
    accs = [results[0]["epochs"][e]["test_accuracy"] for e in range(n_epochs)]
    out: dict[str, Any] = {
        "epoch_s": epoch_s, "epoch_s_median": median(steady), "losses": losses,
        "test_accuracy": accs, "final_loss": losses[-1], "final_test_accuracy": accs[-1],
        "steps_per_epoch": results[0]["steps"] // max(1, n_epochs),
        "replicas_equal": len({r["param_digest"] for r in results}) == 1,
        "test_accuracy_equal_on_all_ranks": len({r["final_test_accuracy"] for r in results}) == 1,
    }
    if all(r.get("step_s") for r in results):
        # a step ends when its slowest rank ends
        steps = [max(r["step_s"][i] for r in results) for i in range(len(results[0]["step_s"]))]
        out["step_s_median"] = median(steps)
    if results[0].get("backend"):
        per_step = results[0]["backend"]  # rank 0's; every rank sends the same bytes
        out["backend_per_iteration"] = {
            key: {"median": median(v), "min": min(v), "max": max(v), "total": sum(v)}
            for key, v in per_step.items() if v}
    hooks = [r["hook"] for r in results if r.get("hook")]
    if hooks:
        h0 = hooks[0]
        out.update({
            "buckets": h0["buckets"], "buckets_per_step": h0["buckets"] / max(1, results[0]["steps"]),
            "bytes_per_rank": h0["bytes"],
            "verified_buckets": min(h["verified"] for h in hooks),
            "mismatches": sum(len(h["mismatches"]) for h in hooks),
            "max_error_over_bound": max(h["max_error_over_bound"] for h in hooks),
            "allreduce_ms_median": float(np.median([h["allreduce_ms_median"] for h in hooks])),
        })
    return out


def _check_first(opts: TrainOptions, opt: dict[str, Any], problems: list[str]) -> None:
    """The optical (or oddl) run: replicas equal, every bucket exact and verified."""
    if not opt["replicas_equal"]:
        problems.append("optical run: the model replicas differ between ranks")
    if opt.get("mismatches"):
        problems.append(f"optical run: {opt['mismatches']} bucket(s) differed from the exact "
                        "reduction")
    if (opts.verify and opts.backend == "hook"
            and opt.get("verified_buckets", 0) != opt.get("buckets", -1)):
        problems.append(f"optical run: only {opt.get('verified_buckets')} of "
                        f"{opt.get('buckets')} buckets were verified")


def _compare(summary: dict[str, Any], opt: dict[str, Any], base: dict[str, Any],
             tolerance: float, problems: list[str]) -> None:
    """Accuracy and time of the optical run against gloo, into `summary`."""
    diff = abs(opt["final_test_accuracy"] - base["final_test_accuracy"])
    summary["accuracy_difference"] = diff
    summary["accuracy_match"] = diff <= tolerance
    summary["epoch_time_ratio_optical_over_gloo"] = (
        opt["epoch_s_median"] / base["epoch_s_median"] if base["epoch_s_median"] else None)
    summary["iteration_time_ratio_over_gloo"] = (
        opt["step_s_median"] / base["step_s_median"] if base["step_s_median"] else None)
    if diff > tolerance:
        problems.append(f"final test accuracy optical {opt['final_test_accuracy']:.4f} vs gloo "
                        f"{base['final_test_accuracy']:.4f}: differs by more than "
                        f"{tolerance:.2f}")


def build_train_summary(opts: TrainOptions, cfg: TestbedConfig, out: TrainOutcome,
                        run_dir: Path) -> dict[str, Any]:
    """The summary of `oddl demo --train` (`ok` False on any problem)."""
    problems = out.problems
    summary: dict[str, Any] = {
        "testbed": cfg.name, "collective": opts.collective, "nodes": WORLD,
        "epochs": opts.epochs, "dataset": {"name": "sklearn digits 8x8", **out.sizes},
        "seed": opts.seed, "bucket_cap_mb": opts.bucket_cap_mb, "backend": opts.backend,
        "hook": (("synchronous" if opts.sync_hook else "worker thread")
                 if opts.backend == "hook" else "none"),
        "line_rate_gbps": cfg.fabric.line_rate_gbps,
    }
    for network in (opts.first, "gloo"):
        if len(out.results.get(network, [])) == WORLD:
            summary[network] = phase_summary(out.results[network])
        elif not problems:
            problems.append(f"no complete result from the {network} run")
    opt, base = summary.get(opts.first), summary.get("gloo")
    if opt:
        _check_first(opts, opt, problems)
    if base and not base["replicas_equal"]:
        problems.append("gloo run: the model replicas differ between ranks")
    if opt and base:
        _compare(summary, opt, base, opts.accuracy_tolerance, problems)
    gate_errors = [e for a in out.agent_status for e in a.get("gate_errors", [])]
    job_info = out.job_info
    summary.update({
        "accuracy_tolerance": opts.accuracy_tolerance,
        "reconfigurations": int(job_info.get("reconfigurations", 0)),
        "collectives_done": int(job_info.get("collectives_done", 0)),
        "guard_time_ms": float(job_info.get("guard_time_s", 0.0)) * 1e3,
        "slot_gate_error": percentiles(gate_errors),
        "fabric": out.fabric,
        # the backend path is not checked bucket by bucket (tests/top/test_torch_backend.py checks
        # every collective's exactness); None says so
        "all_results_exact": None if opts.backend == "oddl" else bool(opt) and not (
            opt or {}).get("mismatches") and not out.inexact_ranks,
        "ok": not problems, "problems": problems[:20], "run_dir": str(run_dir),
    })
    return summary


def format_train_summary(s: dict[str, Any]) -> str:
    """The summary table for people."""
    lines = ["", f"oddl demo --train — {s['testbed']}: CNN on {s['dataset']['name']} "
                 f"({s['dataset']['train']} train / {s['dataset']['test']} test), {s['nodes']} "
                 f"workers, {s['epochs']} epochs, {s['collective']} all-reduce at "
                 f"{s['line_rate_gbps']:g} Gbit/s", ""]
    o, g = s.get("optical") or s.get("oddl"), s.get("gloo")
    if o and g and s.get("backend") == "oddl":
        lines += _format_backend(s, o, g)
    elif o and g:
        lines.append(f"{'epoch':>6}{'optical loss':>14}{'acc':>8}{'s':>8}"
                     f"{'gloo loss':>14}{'acc':>8}{'s':>8}")
        for e in range(len(o["losses"])):
            lines.append(f"{e + 1:>6}{o['losses'][e]:>14.4f}{o['test_accuracy'][e]:>8.4f}"
                         f"{o['epoch_s'][e]:>8.2f}{g['losses'][e]:>14.4f}"
                         f"{g['test_accuracy'][e]:>8.4f}{g['epoch_s'][e]:>8.2f}")
        lines += [
            "",
            f"{'':30}{'optical (hook)':>16}{'gloo':>12}",
            f"{'final test accuracy':30}{o['final_test_accuracy']:>16.4f}"
            f"{g['final_test_accuracy']:>12.4f}",
            f"{'final training loss':30}{o['final_loss']:>16.4f}{g['final_loss']:>12.4f}",
            f"{'time per epoch (median)':30}{o['epoch_s_median']:>14.2f} s{g['epoch_s_median']:>10.2f} s",
            f"{'replicas equal on all ranks':30}{'yes' if o['replicas_equal'] else 'NO':>16}"
            f"{'yes' if g['replicas_equal'] else 'NO':>12}",
            "",
            f"accuracy difference {s['accuracy_difference']:.4f} (tolerance "
            f"{s['accuracy_tolerance']:.2f}): {'match' if s['accuracy_match'] else 'NO MATCH'}",
            f"epoch-time ratio optical/gloo: {s['epoch_time_ratio_optical_over_gloo']:.1f}",
            f"optical all-reduces: {o.get('buckets', 0)} buckets "
            f"({o.get('buckets_per_step', 0):.1f} per step, {o.get('bytes_per_rank', 0) / 1e6:.1f} MB "
            f"per rank), median {o.get('allreduce_ms_median', 0):.1f} ms; hook on a "
            f"{s['hook']}",
            f"verified against the exact "
            f"{'quantised mean (buckets gathered' if s['collective'] == 'optinc' else 'reduction ('}"
            f" over gloo): {o.get('verified_buckets', 0)} of "
            f"{o.get('buckets', 0)} buckets, {o.get('mismatches', 0)} mismatched (worst error "
            f"{o.get('max_error_over_bound', 0):.2f} of the bound)",
            f"reconfigurations: {s['reconfigurations']}, guard time spent "
            f"{s['guard_time_ms']:.2f} ms",
        ]
    if s["all_results_exact"] is not None:
        lines.append(f"every all-reduce equal to the exact reduction: "
                     f"{'yes' if s['all_results_exact'] else 'NO'}")
    return "\n".join(lines + closing_lines(s))


def _format_backend(s: dict[str, Any], o: dict[str, Any], g: dict[str, Any]) -> list[str]:
    """The table of a `--backend oddl` run: accuracy, iteration time, bytes per iteration."""
    lines = [f"{'epoch':>6}{'oddl loss':>14}{'acc':>8}{'s':>8}{'gloo loss':>14}{'acc':>8}{'s':>8}"]
    for e in range(len(o["losses"])):
        lines.append(f"{e + 1:>6}{o['losses'][e]:>14.4f}{o['test_accuracy'][e]:>8.4f}"
                     f"{o['epoch_s'][e]:>8.2f}{g['losses'][e]:>14.4f}"
                     f"{g['test_accuracy'][e]:>8.4f}{g['epoch_s'][e]:>8.2f}")
    per = o.get("backend_per_iteration", {})
    opt_b, fb_b = per.get("optical_bytes", {}), per.get("fallback_bytes", {})
    ratio = s.get("iteration_time_ratio_over_gloo")
    lines += [
        "",
        f"{'':30}{'oddl backend':>16}{'gloo':>12}",
        f"{'final test accuracy':30}{o['final_test_accuracy']:>16.4f}"
        f"{g['final_test_accuracy']:>12.4f}",
        f"{'time per iteration (median)':30}{o.get('step_s_median', 0) * 1e3:>13.1f} ms"
        f"{g.get('step_s_median', 0) * 1e3:>9.1f} ms",
        f"{'replicas equal on all ranks':30}{'yes' if o['replicas_equal'] else 'NO':>16}"
        f"{'yes' if g['replicas_equal'] else 'NO':>12}",
        "",
        f"accuracy difference {s['accuracy_difference']:.4f} (tolerance "
        f"{s['accuracy_tolerance']:.2f}): {'match' if s['accuracy_match'] else 'NO MATCH'}",
        f"iteration-time ratio oddl/gloo: {ratio:.2f}" if ratio else "iteration-time ratio: n/a",
        f"per iteration and rank: {opt_b.get('median', 0) / 1e3:.1f} kB over the optical "
        f"circuits (min {opt_b.get('min', 0) / 1e3:.1f}, max {opt_b.get('max', 0) / 1e3:.1f}), "
        f"{fb_b.get('median', 0) / 1e3:.1f} kB over the gloo fallback (total "
        f"{fb_b.get('total', 0)} B); DDP with no hook, every collective of its group through "
        "the agents",
        f"reconfigurations: {s['reconfigurations']}, guard time spent "
        f"{s['guard_time_ms']:.2f} ms",
    ]
    return lines

