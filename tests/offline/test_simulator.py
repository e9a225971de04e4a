"""The cluster simulator: cost-model agreement, ODDL through the scheduler, refusals, output."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from oddl.cli import simulate as simulate_cli
from oddl.controller.scheduling import make_plan
from oddl.offline.simulator import core, optical
from oddl.offline.simulator import engine as sim
from oddl.offline.simulator.core import SimConfig, SimulationError
from oddl.offline.simulator.engine import simulate, sweep
from oddl.offline.workloads import MODELS

FAST = {"reduce_gbytes_s": 1e9, "latency_us": 0.0, "ring_hop_latency_us": 0.0}  # negligible


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = simulate_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- cost model


def test_model_profiles_match_the_research_notes():
    vgg, resnet = MODELS["vgg19"], MODELS["resnet50"]
    assert vgg.params == 143_667_240 and vgg.gradient_bytes() == 574_668_960
    assert resnet.params == 25_557_032
    assert resnet.compute_s(64) == pytest.approx(64 / 2600, rel=0.01)  # the ResNet50 anchor


@pytest.mark.parametrize("system", ["ideal", "oddl", "topoopt", "fat-tree"])
def test_ring_time_is_the_bandwidth_term_at_the_limit(system):
    cfg = SimConfig(model="vgg19", nodes=1024, gbps=100.0, skew_us=0.0, ft_hop_latency_us=0.0,
                    **FAST)
    r = simulate(cfg, [system]).result(system)
    s = MODELS["vgg19"].gradient_bytes()
    formula = 2 * 1023 / 1024 * 8 * s / 100e9
    assert formula == pytest.approx(0.0919, abs=5e-5)  # docs/sources.md §7: 91.9 ms at P = 1024
    assert r.comm_s == pytest.approx(formula, rel=1e-4)
    assert r.comm_s == pytest.approx(sim.ring_formula_s(cfg), rel=1e-4)


def test_ring_latency_term_counts_every_step():
    cfg = SimConfig(nodes=64, latency_us=10.0, reduce_gbytes_s=1e9)
    r = simulate(cfg, ["ideal"]).result("ideal")
    assert r.comm_s == pytest.approx(sim.ring_formula_s(cfg), rel=1e-4)
    assert sim.ring_formula_s(cfg) - sim.ring_formula_s(cfg.with_values(latency_us=0)) == \
        pytest.approx(2 * 63 * 10e-6)


def test_compute_zero_means_communication_only():
    r = simulate(SimConfig(nodes=16, compute_ms=0.0), ["oddl"]).result("oddl")
    assert r.compute_s == 0.0 and r.iteration_s == r.comm_s


def test_iteration_is_compute_plus_exposed_communication():
    cfg = SimConfig(model="resnet50", nodes=16, compute_ms=30.0)
    r = simulate(cfg, ["ideal"]).result("ideal")
    assert r.compute_s == pytest.approx(0.030)
    assert r.iteration_s == pytest.approx(r.compute_s + r.comm_s)
    hidden = simulate(cfg.with_values(overlap=1.0), ["ideal"]).result("ideal")
    assert hidden.iteration_s == pytest.approx(0.030 + max(0.0, r.comm_s - 0.020))


def test_reduction_cost_is_received_bytes_over_the_rate():
    cfg = SimConfig(model="vgg19", nodes=8, reduce_gbytes_s=100.0)
    r = simulate(cfg, ["ideal"]).result("ideal")
    # ring reduce-scatter: 7 steps, each the busiest receiver gets one 1/8 chunk
    expect = 7 * math.ceil(MODELS["vgg19"].params / 8) * 4 / 100e9
    assert r.reduce_s == pytest.approx(expect, rel=1e-5)


# --------------------------------------------------------------------------- ODDL


def test_oddl_runs_the_controllers_scheduler(monkeypatch):
    calls = []
    real = sim.schedule_plan

    def spy(plan, *args, **kwargs):
        sched = real(plan, *args, **kwargs)
        calls.append(sched)
        return sched

    monkeypatch.setattr(sim, "schedule_plan", spy)
    cfg = SimConfig(model="resnet50", nodes=16, collective="halving-doubling", tune_us=500.0)
    r = simulate(cfg, ["oddl"]).result("oddl")
    assert len(calls) == 2  # the first iteration, then the steady state
    steady = calls[-1]
    assert steady.initial_channels == calls[0].final_channels
    assert r.comm_s == pytest.approx(steady.makespan_s + r.reduce_s)
    guard = cfg.timing().guard_s
    retuned = sum(1 for s in steady.slots if s.retuned)
    assert retuned == 6  # 8 steps, 4 partners; the first slot keeps the last partner
    assert r.reconfig_s == pytest.approx(retuned * guard)
    assert r.detail["scheduler"] == "oddl.controller.scheduling.schedule_plan"
    assert r.setup_s == pytest.approx(cfg.wss_ms / 1e3)


def test_oddl_tuning_time_matters_only_when_partners_change():
    ring = [simulate(SimConfig(nodes=64, tune_us=t), ["oddl"]).result("oddl").comm_s
            for t in (1.0, 50_000.0)]
    assert ring[0] == pytest.approx(ring[1])  # the ring keeps its circuits
    hd = [simulate(SimConfig(nodes=64, collective="halving-doubling", tune_us=t),
                   ["oddl"]).result("oddl").comm_s for t in (1.0, 50_000.0)]
    assert hd[1] - hd[0] == pytest.approx(10 * (50_000.0 - 1.0) * 1e-6, rel=1e-6)


def test_setup_is_amortised_only_on_request():
    cfg = SimConfig(nodes=16, wss_ms=200.0)
    base = simulate(cfg, ["oddl"]).result("oddl")
    shared = simulate(cfg.with_values(amortise_iterations=100), ["oddl"]).result("oddl")
    assert shared.iteration_s - base.iteration_s == pytest.approx(0.002)


# --------------------------------------------------------------------------- baselines


def test_sip_ring_runs_four_deltas_in_five():
    cfg = SimConfig(nodes=64, sip_delta_us=50.0, **FAST)
    res = simulate(cfg, ["ideal", "sip-ring"])
    ideal, sip = res.result("ideal"), res.result("sip-ring")
    assert sip.comm_s == pytest.approx(ideal.comm_s * 5 / 4, rel=0.01)
    assert sip.reconfig_s == pytest.approx(sip.comm_s - ideal.comm_s, rel=1e-6)
    assert sip.detail["configurations"] == 1  # the ring keeps one configuration


def test_sip_ring_circuit_gets_the_wavelengths_of_its_segment():
    # ring i -> i+1: every segment carries one circuit, which gets all W wavelengths; with
    # one bandwidth per node (default) that is gbps, with gbps per wavelength W x gbps
    base = dict(nodes=64, compute_ms=0.0, **FAST)
    node = simulate(SimConfig(**base), ["ideal", "sip-ring"])
    lam = simulate(SimConfig(bandwidth_norm="lambda", **base), ["ideal", "sip-ring"])
    assert node.result("sip-ring").detail["wavelength_gbps"] == pytest.approx(100 / 64)
    assert lam.result("sip-ring").detail["wavelength_gbps"] == pytest.approx(100)
    ideal = node.result("ideal").comm_s
    assert node.result("sip-ring").comm_s == pytest.approx(ideal * 5 / 4, rel=0.01)
    assert lam.result("sip-ring").comm_s == pytest.approx(ideal * 5 / 4 / 64, rel=0.05)


def test_sip_ring_long_circuits_share_their_segments():
    # halving-doubling sends half the circuits almost all the way round the unidirectional
    # ring, so they share segments; the ring all-reduce never does
    ring = simulate(SimConfig(nodes=64, compute_ms=0.0, **FAST), ["sip-ring"]).result("sip-ring")
    hd = simulate(SimConfig(nodes=64, collective="halving-doubling", compute_ms=0.0, **FAST),
                  ["sip-ring"]).result("sip-ring")
    assert hd.detail["longest_circuit_segments"] == 63
    assert hd.detail["configurations"] > 2 * 6  # steps wait for circuits the LP left out
    assert hd.comm_s > 10 * ring.comm_s


def test_sip_ring_reference_segment_arithmetic_halves_the_ring():
    base = dict(nodes=64, compute_ms=0.0, **FAST)
    ring = simulate(SimConfig(**base), ["sip-ring"]).result("sip-ring")
    ffsim = simulate(SimConfig(sip_segment_rule="ffsim", **base), ["sip-ring"]).result("sip-ring")
    assert ffsim.comm_s == pytest.approx(2 * ring.comm_s, rel=0.01)


def test_advance_skips_the_dark_part_of_each_cycle():
    d, live = 1.0, 4.0
    assert optical._advance(0.0, 1.0, d, live) == pytest.approx(2.0)
    assert optical._advance(4.5, 1.0, d, live) == pytest.approx(6.5)  # 0.5 live, dark, 0.5 live
    assert optical._advance(1.0, 8.0, d, live) == pytest.approx(10.0)  # two whole windows


def test_fat_tree_oversubscription_needs_traffic_across_racks():
    packed = [simulate(SimConfig(nodes=256, ft_oversub=o, **FAST), ["fat-tree"])
              .result("fat-tree").comm_s for o in (1.0, 4.0)]
    assert packed[1] == pytest.approx(packed[0], rel=1e-3)  # ring neighbours share racks
    spread = [simulate(SimConfig(nodes=256, ft_oversub=o, ft_placement="random", **FAST),
                       ["fat-tree"]).result("fat-tree").comm_s for o in (1.0, 4.0)]
    assert spread[1] == pytest.approx(4 * spread[0], rel=0.05)


def test_wrht_takes_two_log_m_steps():
    lam = simulate(SimConfig(nodes=1024, wrht_wavelengths=64, bandwidth_norm="lambda", **FAST),
                   ["wrht"]).result("wrht")
    # m <= 2W+1 = 129: 1024 nodes in 8 balanced groups of 128, then one group of 8 roots
    assert lam.detail["steps"] == 4 and lam.detail["largest_group"] == 128
    s = MODELS["vgg19"].gradient_bytes()
    # per wavelength: a root takes its 127 streams at once, each step is one buffer time
    assert lam.comm_s - lam.reconfig_s == pytest.approx(4 * 8 * s / 100e9, rel=1e-3)
    # per node: a root takes 127 buffers (then 7) at gbps in total, and sends them back
    node = simulate(SimConfig(nodes=1024, wrht_wavelengths=64, **FAST), ["wrht"]).result("wrht")
    assert node.comm_s - node.reconfig_s == pytest.approx(2 * (127 + 7) * 8 * s / 100e9,
                                                          rel=1e-3)


def test_topoopt_splits_the_bandwidth_over_its_rings():
    cfg = SimConfig(nodes=128, topoopt_degree=8, **FAST)
    r = simulate(cfg, ["topoopt", "ideal"])
    assert r.result("topoopt").detail["rings"] == 8
    assert r.result("topoopt").comm_s == pytest.approx(r.result("ideal").comm_s, rel=1e-3)


def test_optinc_is_one_pass_of_the_levels_plus_latency():
    cfg = SimConfig(nodes=1024, latency_us=1.0, optinc_latency_us=0.5)
    r = simulate(cfg, ["optinc", "ideal"])
    opt = r.result("optinc")
    elems = MODELS["vgg19"].params
    one_pass = elems * 8 / 100e9
    # scale round (α + 2 levels of device latency) + the pass (α + one pass + 2 latencies)
    assert opt.comm_s == pytest.approx(2e-6 + 2e-6 + one_pass)
    assert opt.reduce_s == 0.0 and opt.reconfig_s == 0.0
    assert opt.collective == "optinc(32x32)" and opt.detail["devices"] == 33
    assert opt.detail["mzis_unitary_diagonal"] == 33 * 32 * 31 // 2
    # 8-bit levels once against fp32 twice (2(N-1)/N): about 8× less time on the wire
    ring = r.result("ideal").comm_s - r.result("ideal").reduce_s
    assert ring / opt.comm_s == pytest.approx(4 * 2 * 1023 / 1024, rel=0.05)
    bits16 = simulate(cfg.with_values(optinc_bits=16), ["optinc"]).result("optinc")
    assert bits16.comm_s - 4e-6 == pytest.approx(2 * one_pass)


@pytest.mark.parametrize(("nodes", "inputs", "levels"), [
    (4, 0, (4,)), (64, 0, (64,)), (256, 0, (16, 16)), (1024, 0, (32, 32)), (1000, 0, (40, 25)),
    (4096, 0, (64, 64)), (1024, 32, (32, 32)), (512, 32, (32, 16)), (32, 32, (32,)),
])
def test_optinc_cascade_splits_the_nodes_into_equal_groups(nodes, inputs, levels):
    assert optical.optinc_levels(nodes, inputs) == levels


@pytest.mark.parametrize(("nodes", "inputs", "needle"), [
    (1031, 0, "do not split into two levels"), (8192, 0, "do not split"),
    (100, 32, "neither"), (2048, 32, "neither"),
])
def test_optinc_refuses_node_counts_it_cannot_cascade(nodes, inputs, needle):
    with pytest.raises(SimulationError, match=needle):
        optical.optinc_levels(nodes, inputs)
    sw = sweep(SimConfig(optinc_inputs=inputs), "nodes", [nodes, 64 if inputs != 32 else 32],
               ["optinc", "ideal"])
    assert "optinc" in sw.points[0].errors and sw.series("optinc")[1] is not None


def test_vgg19_at_1024_nodes_is_fast_and_complete():
    res = simulate(SimConfig())
    assert [r.system for r in res.results] == list(core.SYSTEMS)
    assert res.elapsed_s < 5.0
    ratios = res.ratios()
    assert ratios["oddl"] == 1.0 and all(v > 0 for v in ratios.values())


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "vgg20"], "known models: alexnet, resnet101"),
        (["--nodes", "1000", "--collective", "halving-doubling"], "use 512 or 1024"),
        (["--gbps", "0"], "gbps must be a positive"),
        (["--gbps", "-10"], "gbps must be a positive"),
        (["--nodes", "1"], "nodes must be >= 2"),
        (["--collective", "tree"], "known: halving-doubling"),
        (["--systems", "oddl,infiniband"], "known: oddl, fat-tree"),
        (["--nodes", "67"], "--systems oddl,fat-tree"),  # OptINC cannot split 67 nodes
        (["--sweep", "colour=1,2"], "PARAM one of"),
        (["--sweep", "gbps=100,0"], "gbps must be a positive"),
        (["--sweep", "nodes=8,x"], "'x' is not a int"),
        (["--ft-placement", "scattered"], "packed, random"),
        (["--overlap", "2"], "overlap must be in [0, 1]"),
        (["--compute-ms", "-5"], "compute_ms must be >= 0, or -1"),
    ],
)
def test_bad_input_is_refused_with_exit_2(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert needle in err and out == ""


def test_argparse_errors_also_exit_2(capsys):
    code, _, err = _run(capsys, "--nodes", "many")
    assert code == 2 and "invalid int value" in err


def test_sweep_leaves_out_a_system_that_refuses_a_point():
    sw = sweep(SimConfig(), "nodes", [67, 16])
    assert "optinc" in sw.points[0].errors and not sw.points[1].errors
    assert sw.series("optinc")[0] is None and sw.series("optinc")[1] is not None


def test_unknown_parameter_is_refused():
    with pytest.raises(SimulationError, match="unknown parameter"):
        SimConfig().with_values(colour="blue")


# --------------------------------------------------------------------------- output


def test_table_names_every_system_and_the_paper(capsys):
    code, out, _ = _run(capsys, "--model", "vgg19", "--nodes", "1024", "--gbps", "100")
    assert code == 0
    for label in core.LABELS.values():
        assert label in out
    assert "paper (VGG19, 1024 nodes, 100 Gbit/s)" in out and "docs/explanation/simulator.md" in out


def test_json_is_one_object_with_every_result(capsys):
    code, out, _ = _run(capsys, "--model", "resnet50", "--nodes", "64", "--json")
    assert code == 0
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["model"]["params"] == 25_557_032
    assert {r["system"] for r in doc["results"]} == set(core.SYSTEMS)
    oddl = next(r for r in doc["results"] if r["system"] == "oddl")
    assert oddl["iteration_ms"] == pytest.approx(oddl["compute_ms"] + oddl["comm_ms"])
    assert doc["iteration_ratio_vs_oddl"]["oddl"] == 1.0


def test_sweep_json_and_plot(capsys, tmp_path):
    png = tmp_path / "sweep.png"
    code, out, _ = _run(capsys, "--sweep", "gbps=25,100,400", "--nodes", "64", "--json",
                        "--plot", str(png))
    assert code == 0
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["sweep"] == {"param": "gbps", "values": [25.0, 100.0, 400.0]}
    times = [next(r for r in p["results"] if r["system"] == "oddl")["comm_ms"]
             for p in doc["points"]]
    assert times[0] > times[1] > times[2]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_table_and_aliases(capsys):
    code, out, _ = _run(capsys, "--sweep", "tuning=1,1000", "--nodes", "16",
                        "--collective", "halving-doubling", "--systems", "oddl,ideal")
    assert code == 0
    assert "sweep of tune_us" in out and out.count("\n") >= 4


def test_single_point_plot(capsys, tmp_path):
    png = tmp_path / "bars.png"
    code, _, _ = _run(capsys, "--nodes", "32", "--plot", str(png))
    assert code == 0 and png.stat().st_size > 1000


def test_unwritable_plot_exits_1(capsys, tmp_path):
    code, _, err = _run(capsys, "--nodes", "16", "--plot", str(tmp_path / "no" / "x.png"))
    assert code == 1 and "cannot write the plot" in err


def test_list_models(capsys):
    code, out, _ = _run(capsys, "--list-models", "--json")
    assert code == 0
    assert {m["name"] for m in json.loads(out)["models"]} == set(MODELS)


def test_register_adds_the_command():
    parser = argparse.ArgumentParser(prog="oddl")
    sub = parser.add_subparsers(dest="command", required=True)
    simulate_cli.register(sub)
    args = parser.parse_args(["simulate", "--nodes", "8", "--json", "--systems", "oddl"])
    assert args.func is simulate_cli.cmd_simulate and args.nodes == 8


def test_plans_come_from_the_registry():
    cfg = SimConfig(nodes=16)
    cache: dict = {}
    plan = core._plan(cfg, "wrht", cache)
    ref = make_plan("wrht", 16, cfg.profile.params, wavelengths=cfg.wrht_wavelengths)
    assert plan.n_steps == ref.n_steps
    assert all(np.array_equal(a.dst, b.dst) for a, b in zip(plan.steps, ref.steps, strict=True))
