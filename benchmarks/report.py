"""Turn benchmarks/results/latest.json into the README's performance table (markdown).

    python benchmarks/report.py            # print the table
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

LATEST = Path(__file__).resolve().parent / "results" / "latest.json"


def _get(results: dict[str, Any], name: str) -> Any:
    entry = results.get(name)
    return entry["result"] if entry and entry.get("ok") else None


Row = tuple[str, str, str, str]
"""(what, result, baseline in the same run, command)"""


def _scheduler(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    by = {(x["collective"], x["n_nodes"]): x for x in r["rows"]}
    for coll in ("ring", "halving-doubling"):
        small, big = by.get((coll, 4)), by.get((coll, 1024))
        if small and big:
            out.append((f"plan + schedule, {coll}, N = 4 / N = 1024 (VGG19, 574.67 MB)",
                        f"{small['total_ms']:.2f} / {big['total_ms']:.1f} ms (aim ≤ 50 ms)",
                        f"ring successor lists in plain Python: ×{big['ratio_to_baseline']:.2f}",
                        "`python benchmarks/bench_scheduler.py`"))
    return out


def _plans(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    big = [x for x in r.get("rows", []) if x.get("n_nodes", x.get("N")) == 1024
           and "total_ms" in x]
    text = ", ".join(f"{x['collective']}{_params(x)} {x['total_ms']:.1f}" for x in big)
    if text:
        out.append(("plan + schedule of every collective at N = 1024 (ms)", text,
                    "", "`python benchmarks/bench_plans.py`"))
    return out


def _drivers(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    rt, rc = r["round_trips"], r["reconfiguration"]
    base = rt["tcp_echo_baseline"]
    for key, what in (("itla_nop", "ITLA NOP round trip, driver → emulator"),
                      ("wss_rra", "WSS `RRA?` (48 channels) round trip")):
        out.append((what, f"p50 {rt[key]['p50_us']:.0f} µs, p99 {rt[key]['p99_us']:.0f} µs",
                    f"4-byte TCP echo p50 {base['p50_us']:.0f} µs: ×{rt[key]['ratio_p50']:.1f}",
                    "`python benchmarks/bench_drivers.py`"))
    out.append(("full 4-node reconfiguration, request → verified, minus the "
                f"{rc['device_delay_ms']:.0f} ms WSS settle",
                f"p50 {rc['overhead_ms_p50']:.2f} ms, p99 {rc['overhead_ms_p99']:.2f} ms "
                "(aim ≤ 5 ms)", "", "`python benchmarks/bench_drivers.py`"))
    return out


def _demo(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    g = r["slot_gate_error"]
    out.append(("demo: iteration time optical / ideal electrical (20 iterations, 1M-param MLP)",
                f"{r['ratio_optical_over_ideal']:.3f} (aim within 10%); all-reduce "
                f"{r['allreduce_ratio_optical_over_ideal']:.3f}",
                f"ideal network, same run: {r['ideal']['iteration_ms_median']:.0f} ms",
                "`oddl demo --json`"))
    out.append(("slot-gate error of the agents (demo)",
                f"p50 {g['p50_us']:.1f} µs, p99 {g['p99_us']:.0f} µs ({g['samples']} sends)",
                "the machine's floor: the data-plane gate row", "`oddl demo --json`"))
    return out


def _collectives(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for coll in r.get("collectives", []):
        xs = [x for x in r["sizes"] if x.get("collective") == coll]
        text = ", ".join(f"{x['bytes'] / 1e6:.0f} MB {x['optical_ms']:.0f} ms ×{x['ratio']:.2f}"
                         f" ({x['retunes_per_allreduce']:.0f} retunes)" for x in xs)
        out.append((f"{coll} on the testbed: time, ratio to ideal, retunes", text,
                    "ideal electrical network, same run",
                    "`python benchmarks/bench_allreduce.py --collective "
                    "ring,halving-doubling,wrht,totientperms,parameter-server --sizes "
                    "1000000,16000000,64000000,256000000 --repeats 2`"))
    return out


def _demo_optinc(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    out.append(("optinc demo: all-reduce / iteration time vs ring, accuracy difference",
                f"{r['allreduce_ratio_optinc_over_ring']:.2f} / "
                f"{r['iteration_ratio_optinc_over_ring']:.2f}, "
                f"{r['final_accuracy_difference']:+.3f}", "ring in the same run",
                "`oddl demo --collective optinc --json`"))
    return out


def _optinc_testbed(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    text = ", ".join(f"{x['mb']:.0f} MB {x['ratio']:.2f}"
                     for x in r.get("sizes", r.get("rows", [])))
    out.append(("optinc / ring all-reduce time on the testbed", text,
                "ideal one pass: 0.167", "`python benchmarks/bench_optinc_testbed.py`"))
    return out


def _simulator(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    out.append(("simulate one 1024-node VGG19 iteration (all systems) / 10-point sweep",
                f"{r['iteration_s']['best']:.2f} s (aim < 5 s) / "
                f"{r['sweep']['seconds']:.1f} s (aim < 60 s)",
                "", "`python benchmarks/bench_simulator.py`"))
    return out


def _optinc(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    if "throughput" not in r:
        return []
    t = r["throughput"]
    net, quiet, noisy = t["network"], t["forward_no_noise"], t["forward_noise"]
    out.append((f"OptINC device model, N = {net['n_inputs']}, {net['bits']}-bit "
                f"({net['mzi_count']:,} MZIs, {net['hidden']:,} thresholders)",
                f"no noise {quiet['elements_per_s']:.2g} el/s, exact "
                f"{quiet['exact_fraction']:.1%}; {noisy['noise_rad']:g} rad phase noise "
                f"{noisy['elements_per_s']:.2g} el/s, exact {noisy['exact_fraction']:.1%}",
                f"plain Python loop, identical results: {t['naive']['elements_per_s']:.0f} "
                "el/s", "`python benchmarks/bench_optinc.py`"))
    return out


def _torch_backend(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    text = ", ".join(f"{x['size_mb']:g} MB ×{x['ratio']:.2f} (async_op ×{x['async_ratio']:.2f})"
                     for x in r["rows"])
    out.append((f"`oddl` torch.distributed backend: `dist.all_reduce` / the agent's own "
                f"all-reduce ({r['collective']}, {r['network']})", text + " (aim ≤ 1.05)",
                "`AgentClient.allreduce`, same processes and agent, alternating",
                "`python benchmarks/bench_torch_backend.py`"))
    return out


def _torch_collectives(r: dict[str, Any]) -> list[Row]:
    text = ", ".join(f"{x['kind']} {x['size_mb']:g} MB {x['oddl_ms']:.1f} ms ×"
                     f"{x['oddl_x_gloo']:.2f}" for x in r["rows"])
    base = ", ".join(f"{x['kind']} {x['size_mb']:g} MB {x['gloo_ms']:.1f} ms"
                     for x in r["rows"])
    return [("`dist.all_gather_into_tensor` / `dist.reduce_scatter_tensor` on the `oddl` "
             "backend, ring, direct links: time, × gloo", text + " (aim ≤ 1.2)",
             f"gloo, {r['nodes']} ranks, same run: {base}",
             "`python benchmarks/bench_torch_collectives.py`")]


def _topoopt(r: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    ds = r["default_search"]
    equal_bw = (f", ×{ds['fat_tree_equal_bw_ms'] / ds['iteration_ms']:.2f} vs an "
                "equal-bandwidth one" if "fat_tree_equal_bw_ms" in ds else "")
    out.append((f"TopoOpt search, {ds.get('nodes', 128)}-node {ds.get('model', 'DLRM')}, "
                f"budget {ds['budget']}",
                f"{ds['search_seconds']:.1f} s (aim < 60 s); ×{ds['speedup_vs_fat_tree']:.2f} "
                f"vs similar-cost fat-tree{equal_bw}, ×{ds['speedup_vs_dp_rings']:.1f} vs DP "
                "on rings", "", "`python benchmarks/bench_topoopt.py`"))
    return out


def _allreduce(label: str) -> Callable[[dict[str, Any]], list[Row]]:
    def section(r: dict[str, Any]) -> list[Row]:
        text = ", ".join(f"{x['bytes'] // 1024} KiB {x['ratio']:.2f}" for x in r["sizes"])
        g = r["gate_error_us"]
        return [(f"{label} all-reduce, optical / ideal by size", text,
                 f"gate error p50 {g['p50']:.0f} µs, p99 {g['p99']:.0f} µs",
                 "`python benchmarks/bench_allreduce.py"
                 + (" --collective halving-doubling" if label != "ring" else "") + "`")]

    return section


DATAPLANE = "`python benchmarks/bench_dataplane.py`"


def _mb(row: dict[str, Any]) -> str:
    mb = row["bytes"] / 2**20
    return f"{mb:.0f} MB" if mb >= 1 else f"{row['bytes'] // 1024} KiB"


def _dataplane_rows(r: dict[str, Any] | None) -> list[Row]:
    """The data-plane targets: against gloo, the wire, the ideal network and the gate floor."""
    if r is None:
        return []
    out = []
    rows = r["rows"]

    def pick(mode: str, coll: str, net: str) -> list[dict[str, Any]]:
        return [x for x in rows if (x["mode"], x["collective"], x["network"]) == (mode, coll, net)]

    for coll in ("ring", "halving-doubling"):
        for net, what in (("ideal", "in place, out=a"), ("ideal-zero-copy", "shared_array")):
            xs = [x for x in pick("direct", coll, net) if "x_gloo" in x]
            if xs:
                out.append((f"{coll}, direct links (lab path), {what}: time, × gloo",
                            ", ".join(f"{_mb(x)} {x['ms']:.1f} ms ×{x['x_gloo']:.2f}" for x in xs),
                            "gloo, 4 ranks, same run: " + ", ".join(
                                f"{_mb(x)} {x['gloo_ms']:.1f} ms" for x in xs),
                            DATAPLANE))
    for coll in ("ring", "halving-doubling"):
        xs = [x for x in pick("fabric", coll, "ideal") if "x_wire_plus_fixed" in x]
        if xs:
            out.append((f"{coll}, emulated fabric, ideal network: time / (line-rate bound + "
                        f"fixed {xs[0]['fixed_overhead_ms']:.1f} ms)",
                        ", ".join(f"{_mb(x)} ×{x['x_wire_plus_fixed']:.2f} (×{x['x_line_rate']:.2f}"
                                  " bound alone)" for x in xs) + " (aim ≤ 1.15)",
                        f"2(N−1)/N·S·8/rate at {r['line_rate_gbps']['fabric']:g} Gbit/s",
                        DATAPLANE))
        xs = [x for x in pick("fabric", coll, "optical") if "x_ideal" in x]
        if xs:
            aim = "1.05" if coll == "ring" else "1.10"
            out.append((f"{coll}, emulated fabric: optical / ideal, slot overruns",
                        ", ".join(f"{_mb(x)} ×{x['x_ideal']:.2f} ({x['overruns']})" for x in xs)
                        + f" (aim ≤ {aim} and 0 overruns at ≥ 16 MB)",
                        "ideal network, same run", DATAPLANE))
        xs = [x for x in pick("fabric", coll, "optical") if "control_overhead_ms" in x]
        if xs:
            out.append((f"{coll}, emulated fabric: control overhead per collective (first slot "
                        "− the last node's call), median",
                        ", ".join(f"{_mb(x)} {x['control_overhead_ms']:.1f} ms" for x in xs)
                        + " (aim ≤ 3 ms; the ideal network has none)",
                        "ideal network: starts at the call", DATAPLANE))
    for mode, g in r["gate_error"].items():
        if g["samples"]:
            f = r["spin_floor_loaded"][mode]
            out.append((f"slot-gate error, emulated fabric ({r['gate_scheduling'][mode] or 'normal scheduling'})",
                        f"p50 {g['p50_us']:.1f} µs, p99 {g['p99_us']:.0f} µs; p99 / floor "
                        f"×{r['gate_p99_over_loaded_floor'][mode]:.2f} (aim ≤ 2)",
                        f"bare sleep-then-spin loop during the runs: p99 {f['p99_us']:.0f} µs "
                        f"(quiet: {r['spin_floor_quiet']['p99_us']:.0f} µs)", DATAPLANE))
    out.append(("bucket bytes through the local API socket / through shared memory",
                " / ".join(f"{m}: {r['local_api_socket_bytes'][m]} B / "
                           f"{r['shared_memory_bytes'][m] / 2**30:.1f} GiB"
                           for m in r["local_api_socket_bytes"]), "", DATAPLANE))
    return out


def _params(row: dict[str, Any]) -> str:
    params = row.get("params") or {}
    return "(" + ",".join(f"{k}={v}" for k, v in params.items()) + ")" if params else ""


SECTIONS: list[tuple[str, Callable[[dict[str, Any]], list[Row]]]] = [
    ("scheduler", _scheduler),
    ("plans", _plans),
    ("drivers", _drivers),
    ("dataplane", _dataplane_rows),
    ("demo", _demo),
    ("allreduce", _allreduce("ring")),
    ("allreduce-hd", _allreduce("halving-doubling")),
    ("collectives", _collectives),
    ("demo-optinc", _demo_optinc),
    ("optinc-testbed", _optinc_testbed),
    ("simulator", _simulator),
    ("optinc", _optinc),
    ("torch-backend", _torch_backend),
    ("torch-collectives", _torch_collectives),
    ("topoopt", _topoopt),
]
"""Each benchmark's name in latest.json and its rows, in the table's order."""


def rows(results: dict[str, Any]) -> list[Row]:
    """(what, result, baseline in the same run, command) for every benchmark that ran."""
    out: list[Row] = []
    for name, section in SECTIONS:
        if (r := _get(results, name)) is not None:
            out += section(r)
    return out


def main() -> int:
    data = json.loads(LATEST.read_text(encoding="utf-8"))
    print(f"<!-- from {LATEST.name}, {data['time']}, {data['cpus']} CPUs -->")
    print("| what | result | baseline in the same run | command |")
    print("|---|---|---|---|")
    for what, result, base, cmd in rows(data["results"]):
        print(f"| {what} | {result} | {base} | {cmd} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
