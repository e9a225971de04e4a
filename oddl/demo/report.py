"""What `oddl demo` reports: the summary of its two runs, as a dict (`--json`) and as text."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oddl.common.config import OPTINC, TestbedConfig
from oddl.demo.workload import RunResult, model_shape


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of |values| in µs, and their count (the slot-gate error's report)."""
    if not values:
        return {"p50_us": 0.0, "p99_us": 0.0, "max_us": 0.0, "samples": 0}
    a = np.abs(np.array(values))
    return {"p50_us": float(np.percentile(a, 50) * 1e6), "p99_us": float(np.percentile(a, 99) * 1e6),
            "max_us": float(a.max() * 1e6), "samples": int(a.size)}


@dataclass
class DemoOutcome:
    """What the demo's runs left behind, for the summary."""

    cfg: TestbedConfig
    n_params: int
    run_dir: Path
    runs: dict[str, RunResult] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each run's job as the controller reported it when it was cancelled."""
    problems: list[str] = field(default_factory=list)
    device: dict[str, Any] = field(default_factory=dict)
    """The OptINC device's counters during the optinc run (`device_delta`)."""
    status: dict[str, Any] = field(default_factory=dict)
    agent_status: list[dict[str, Any]] = field(default_factory=list)
    fabric: dict[str, Any] = field(default_factory=dict)

    def gate_errors(self) -> list[float]:
        """Every agent's slot-gate errors (s)."""
        return [e for a in self.agent_status for e in a.get("gate_errors", [])]

    def all_problems(self) -> list[str]:
        """The problems found, and every run's mismatches and errors."""
        out = list(self.problems)
        for r in self.runs.values():
            out += r.mismatches + r.errors
        return out


def build_summary(out: DemoOutcome, collective: str) -> dict[str, Any]:
    """The demo's summary: the optical run next to the ideal one (or optinc next to ring)."""
    if collective == OPTINC:
        return optinc_summary(out)
    cfg, jobs, problems = out.cfg, out.jobs, out.all_problems()
    opt, ideal = out.runs["optical"].summary(), out.runs["ideal"].summary()
    extra: dict[str, Any] = {}
    if "ring_one_port" in out.runs:  # a circuit switch: the same hosts on one port each
        ring = extra["ring_one_port"] = out.runs["ring_one_port"].summary()
        extra["ratio_over_ring_one_port"] = (
            opt["iteration_ms_median"] / ring["iteration_ms_median"]
            if ring["iteration_ms_median"] else None)
        extra["allreduce_ratio_over_ring_one_port"] = (
            opt["allreduce_ms_median"] / ring["allreduce_ms_median"]
            if ring["allreduce_ms_median"] else None)
        extra["ports_per_host"] = min(n.ports for n in cfg.nodes)
    return {**extra,
        "testbed": cfg.name, "collective": collective, "nodes": len(cfg.nodes),
        "gradient_elements": model_shape(out.n_params)[1] * 74,
        "line_rate_gbps": cfg.fabric.line_rate_gbps,
        "optical": opt, "ideal": ideal,
        "ratio_optical_over_ideal": (opt["iteration_ms_median"] / ideal["iteration_ms_median"]
                                     if ideal["iteration_ms_median"] else None),
        "allreduce_ratio_optical_over_ideal": (
            opt["allreduce_ms_median"] / ideal["allreduce_ms_median"]
            if ideal["allreduce_ms_median"] else None),
        "reconfigurations": int(jobs["optical"].get("reconfigurations", 0)),
        "device_retunes_total": int(out.status.get("reconfigurations", 0)),
        "guard_time_ms": float(jobs["optical"].get("guard_time_s", 0.0)) * 1e3,
        "slot_gate_error": percentiles(out.gate_errors()),
        "fabric": out.fabric,
        "all_results_exact": not problems,
        "problems": problems[:20],
        "run_dir": str(out.run_dir),
    }


def device_delta(device_id: str, bits: int, before: dict[str, Any],
                 after: dict[str, Any]) -> dict[str, Any]:
    """What the OptINC device did during one run (its counters after minus before)."""
    out: dict[str, Any] = {"id": device_id, "bits": bits}
    for key in ("passes", "elements", "model_s", "inexact_elements", "scale_rounds"):
        out[key] = after.get(key, 0) - before.get(key, 0)
    out["elements_per_s"] = out["elements"] / out["model_s"] if out["model_s"] > 0 else 0.0
    out["refused"] = after.get("refused", {})
    return out


def optinc_summary(out: DemoOutcome) -> dict[str, Any]:
    """The summary of `oddl demo --collective optinc`: optinc next to ring."""
    cfg, runs, jobs, device, problems = out.cfg, out.runs, out.jobs, out.device, out.all_problems()
    ring, opt = runs["ring"].summary(), runs[OPTINC].summary()

    def ratio(key: str) -> float | None:
        return opt[key] / ring[key] if ring[key] else None

    return {
        "testbed": cfg.name, "collective": OPTINC, "baseline": "ring", "nodes": len(cfg.nodes),
        "gradient_elements": model_shape(out.n_params)[1] * 74,
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
        "slot_gate_error": percentiles(out.gate_errors()),
        "fabric": {k: v for k, v in out.fabric.items() if k != OPTINC},
        "all_results_exact": not problems,
        "problems": problems[:20],
        "run_dir": str(out.run_dir),
    }


def format_optinc_summary(s: dict[str, Any]) -> str:
    """`oddl demo --collective optinc`'s summary for people."""
    r, o, d = s["ring"], s[OPTINC], s["device"]

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
        gate_line(s["slot_gate_error"]),
        f"every all-reduce equal to the exact (quantised, for optinc) reduction: "
        f"{'yes' if s['all_results_exact'] else 'NO'}",
    ]
    return "\n".join(lines + closing_lines(s))


def format_summary(s: dict[str, Any]) -> str:
    """The demo's summary for people."""
    if s.get("collective") == OPTINC:
        return format_optinc_summary(s)
    if "ring_one_port" in s:
        return format_circuit_summary(s)
    o, i = s["optical"], s["ideal"]
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
        gate_line(s["slot_gate_error"]),
        fabric_line(s["fabric"]),
        f"every all-reduce equal to the exact reduction: {'yes' if s['all_results_exact'] else 'NO'}",
    ]
    return "\n".join(lines + closing_lines(s))


def format_circuit_summary(s: dict[str, Any]) -> str:
    """The summary on a circuit switch: the collective on every port, a ring on one port,
    and the ideal network with each host's bandwidth that of all its ports."""
    o, r, i = s["optical"], s["ring_one_port"], s["ideal"]
    d = s["ports_per_host"]
    head = f"{s['collective']} ({d} ports)"
    lines = [
        "",
        f"oddl demo — {s['testbed']}: {s['collective']} all-reduce of "
        f"{s['gradient_elements']:,} float32 gradients on {s['nodes']} hosts of {d} ports at "
        f"{s['line_rate_gbps']:g} Gbit/s per port, through an optical circuit switch",
        "",
        f"{'':24}{head:>22}{'ring on one port':>20}{f'ideal ({d} x rate)':>20}",
        f"{'iteration time (median)':24}{o['iteration_ms_median']:>19.1f} ms"
        f"{r['iteration_ms_median']:>17.1f} ms{i['iteration_ms_median']:>17.1f} ms",
        f"{'all-reduce (median)':24}{o['allreduce_ms_median']:>19.1f} ms"
        f"{r['allreduce_ms_median']:>17.1f} ms{i['allreduce_ms_median']:>17.1f} ms",
        f"{'final loss':24}{o['final_loss'] or 0:>22.4f}{r['final_loss'] or 0:>20.4f}"
        f"{i['final_loss'] or 0:>20.4f}",
        f"{'final accuracy':24}{o['final_accuracy']:>22.3f}{r['final_accuracy']:>20.3f}"
        f"{i['final_accuracy']:>20.3f}",
        "",
        _ratio_line(f"iteration-time ratio {s['collective']}/ideal", s["ratio_optical_over_ideal"]),
        _ratio_line(f"iteration-time ratio {s['collective']}/one-port ring",
                    s["ratio_over_ring_one_port"]),
        _ratio_line(f"all-reduce ratio {s['collective']}/one-port ring",
                    s["allreduce_ratio_over_ring_one_port"]),
        fabric_line(s["fabric"]),
        f"every all-reduce equal to the exact reduction: {'yes' if s['all_results_exact'] else 'NO'}",
    ]
    return "\n".join(lines + closing_lines(s))


def _ratio_line(what: str, ratio: float | None) -> str:
    return f"{what}: {ratio:.3f}" if ratio else f"{what}: n/a"


def gate_line(g: dict[str, Any]) -> str:
    """The agents' slot-gate error (`percentiles`) in one line."""
    return (f"slot-gate error: p50 {g['p50_us']:.1f} µs, p99 {g['p99_us']:.1f} µs, "
            f"max {g['max_us']:.1f} µs ({g['samples']} sends)")


def closing_lines(s: dict[str, Any]) -> list[str]:
    """The problems found, if any, and where the logs are."""
    lines = ["problems:", *[f"  {p}" for p in s["problems"]]] if s["problems"] else []
    return [*lines, f"logs: {s['run_dir']}"]


def fabric_line(fabric: dict[str, Any]) -> str:
    """What the emulated fabric carried: the agents' streams (chunks) or the relay (frames)."""
    st = fabric.get("streams")
    if st:
        return (f"fabric: {st['delivered']:.0f} chunks delivered ({st['delivered_bytes'] / 2**20:.0f}"
                f" MiB), {st['lost']:.0f} lost, {st['late']:.0f} late (worst "
                f"{st['worst_late_s'] * 1e3:.1f} ms after their serialisation end)")
    return (f"fabric: {fabric.get('delivered', 0)} frames delivered, "
            f"{sum(fabric.get('lost', {}).values())} lost")
