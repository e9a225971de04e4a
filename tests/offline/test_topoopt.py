"""TopoOpt co-optimisation: job models, topology from traffic, routing, the search and
``oddl topoopt`` (the ``topoopt`` collective on the testbed: test_topoopt_collective.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from oddl.cli import topoopt as topoopt_cli
from oddl.controller.scheduling import select_permutations
from oddl.offline.simulator.core import SimConfig
from oddl.offline.simulator.engine import simulate
from oddl.offline.topoopt.evaluation import FatTree, NetParams, evaluate
from oddl.offline.topoopt.job_model import (
    JobModel,
    LayerGroup,
    Memory,
    TopoOptError,
    Traffic,
    data_parallel,
    describe,
    parse_strategy,
    traffic,
)
from oddl.offline.topoopt.model_files import ModelFileError, load_model_file
from oddl.offline.topoopt.model_zoo import DLRM_TABLES, MODELS
from oddl.offline.topoopt.our_construction import allocate_rings, degree_split, mp_matchings
from oddl.offline.topoopt.routing import ecmp_loads
from oddl.offline.topoopt.search import co_optimise, evaluate_strategy
from oddl.offline.topoopt.search_config import SearchConfig
from oddl.offline.topoopt.topology import build_topology, dp_ring_jumps
from oddl.offline.workloads import MODELS as SIM_MODELS

TOY = JobModel("toy", (
    LayerGroup("emb", 1_000_000, 4, 64, 0.1, kind="embedding"),
    LayerGroup("fc1", 4_000_000, 64, 1024, 1.0),
    LayerGroup("fc2", 1_000_000, 1024, 10, 0.5, exchanges=2),
), batch=32)


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize("name", ["vgg19", "resnet50"])
def test_cnn_profiles_match_torchvision_and_the_simulator(name: str) -> None:
    m, ref = MODELS[name], SIM_MODELS[name]
    assert m.params == ref.params  # torchvision's num_params
    assert m.compute_s == pytest.approx(ref.compute_s(m.batch), rel=1e-3)


def test_transformer_and_dlrm_profiles() -> None:
    bert = MODELS["bert-large"]
    assert bert.params == 336_226_108  # BertForPreTraining-large, MLM decoder tied
    assert [g.name for g in bert.groups][:2] == ["embeddings", "encoder1"]
    dlrm = MODELS["dlrm"]
    emb = sum(g.params for g in dlrm.groups if g.kind == "embedding")
    assert emb == sum(DLRM_TABLES) * 64
    assert emb / dlrm.params > 0.99  # "large embedding tables"


def test_traffic_of_data_parallel_and_of_sharding() -> None:
    dp = traffic(TOY, data_parallel(TOY), 8)
    assert dp.allreduce == ((1, 6_000_000 * 4.0),) and dp.mp == ()
    tr = traffic(TOY, (8, 2, 1), 8)
    assert dict(tr.allreduce) == {1: 1_000_000 * 4.0, 2: 2_000_000 * 4.0}  # emb fully sharded
    # per ordered pair: 2 · exchanges · batch · itemsize · (in_share + out/m)
    assert tr.mp == ((8, 2 * 32 * 4 * (4 / 8 + 64 / 8), 1), (2, 2 * 32 * 4 * (64 + 1024 / 2), 1))


def test_strategies_parse_and_refuse_what_n_cannot_split() -> None:
    assert parse_strategy(TOY, "fc1=4, emb=2", 8) == (2, 4, 1)
    assert parse_strategy(TOY, "dp", 8) == (1, 1, 1)
    assert describe(TOY, (2, 4, 1)) == "emb=2,fc1=4"
    with pytest.raises(TopoOptError, match=r"12 nodes cannot be split into blocks of 8 .*"
                       r"use one of 1, 2, 3, 4, 6, 12"):
        parse_strategy(TOY, "fc1=8", 12)
    with pytest.raises(TopoOptError, match="no layer group 'fc9'; its groups are emb, fc1, fc2"):
        parse_strategy(TOY, "fc9=2", 8)


def test_model_files_load_and_name_missing_fields(tmp_path: Path) -> None:
    ok = tmp_path / "m.toml"
    ok.write_text('name = "mlp"\nbatch = 16\n[[groups]]\nname = "a"\nparams = 100\n'
                  'in_elems = 10\nout_elems = 10\ngmacs = 0.001\n'
                  '[[groups]]\nname = "b"\nparams = 50\nin_elems = 10\nout_elems = 5\n'
                  'compute_ms = 0.5\nkind = "embedding"\n')
    m = load_model_file(ok)
    assert (m.name, m.batch, m.params, m.groups[1].kind) == ("mlp", 16, 150, "embedding")
    assert m.groups[0].compute_ms == pytest.approx(16 * 6 * 1e6 / 63.8e12 * 1e3)
    js = tmp_path / "m.json"
    js.write_text(json.dumps(m.as_dict()))
    assert load_model_file(js) == m
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nbatch = 4\n[[groups]]\nname = "a"\nin_elems = 1\n')
    with pytest.raises(ModelFileError, match=r"groups\[0\] \(a\): missing field\(s\) params, "
                       r"out_elems"):
        load_model_file(bad)
    bad.write_text('name = "x"\nbatch = 4\n[[groups]]\nname = "a"\nparams = 1\nin_elems = 1\n'
                   'out_elems = 1\n')
    with pytest.raises(ModelFileError, match="missing field compute_ms .* or gmacs"):
        load_model_file(bad)
    bad.write_text('name = "x"\n[[groups]]\n')
    with pytest.raises(ModelFileError, match=r"missing field\(s\) batch"):
        load_model_file(bad)
    bad.write_text('name = "x"\nbatch = 4\nbatchsize = 3\ngroups = []\n')
    with pytest.raises(ModelFileError, match="unknown field"):
        load_model_file(bad)


# --------------------------------------------------------------------------- topology


def test_data_parallel_topology_is_select_permutations() -> None:
    tr = traffic(MODELS["vgg19"], data_parallel(MODELS["vgg19"]), 128)
    assert degree_split(tr, 8) == (8, 0)
    topo = build_topology(tr, 8, 100.0)
    assert topo.jumps == select_permutations(128, 8) == (1, 5, 13, 39, 89, 115, 123, 127)
    assert topo.matchings == () and topo.diameter == 5  # docs/sources.md §3.2
    assert dp_ring_jumps(128, 8) == (1, 5, 13, 39)


def test_ring_allocation_gives_groups_their_own_totient_jumps() -> None:
    tr = Traffic(((1, 100.0), (4, 300.0)), (), 16)
    own, jumps = allocate_rings(tr, 6)
    assert set(own[4]) <= {4, 12} and set(own[1]) <= {1, 3, 5, 7, 9, 11, 13, 15}
    assert len(jumps) == 6 and set(jumps) == set(own[1]) | set(own[4])
    # a group with no jump of its own goes multi-hop over the kept ring (coin change)
    topo = build_topology(Traffic(((1, 1.0),), ((4, 5.0, 1),), 16), 2, 100.0)
    coeff, hops = topo.ring_route(4)
    assert hops == 4 and coeff == {1: pytest.approx(0.75 * 4), 15: pytest.approx(0.75 * 4)}


def test_degree_split_is_proportional_and_keeps_a_ring() -> None:
    tr = Traffic(((1, 1.0),), ((8, 100.0, 1),), 16)
    assert degree_split(tr, 8) == (2, 6)  # mostly model-parallel, a ring is kept
    assert degree_split(tr, 8, "all-dp") == (8, 0)
    tr = Traffic(((1, 700.0),), ((2, 300.0, 1),), 16)
    assert degree_split(tr, 4) == (4, 0) and degree_split(tr, 8) == (6, 2)


def _matching_weight(w: np.ndarray, pairs: tuple[tuple[int, int], ...]) -> float:
    return float(sum(w[a, b] for a, b in pairs))


@pytest.mark.parametrize(("size", "rounds"), [(6, 3), (8, 9), (7, 4)])
def test_round_robin_rounds_are_maximum_weight_under_the_discount(size: int,
                                                                 rounds: int) -> None:
    result = mp_matchings(size, [(size, 1.0)], rounds)
    w = np.full((size, size), 2.0)
    conn = np.zeros((size, size))
    for pairs in result:
        g = nx.Graph()
        g.add_weighted_edges_from((a, b, w[a, b]) for a in range(size)
                                  for b in range(a + 1, size))
        best = nx.max_weight_matching(g)
        assert _matching_weight(w, pairs) == pytest.approx(
            _matching_weight(w, tuple(best)))
        nodes = [x for p in pairs for x in p]
        assert len(nodes) == len(set(nodes))
        for a, b in pairs:
            conn[a, b] += 1
            w[a, b] = w[b, a] = w[a, b] * conn[a, b] / (conn[a, b] + 1)


def test_mixed_demand_matchings_repeat_per_component_and_stay_in_blocks() -> None:
    rounds = mp_matchings(32, [(8, 10.0), (2, 50.0)], 3)
    assert len(rounds) == 3
    assert set(rounds[0]) == {(i, i + 1) for i in range(0, 32, 2)}  # heaviest pairs first
    for pairs in rounds:
        assert all(a // 8 == b // 8 for a, b in pairs)
        shifted = {((a + 8) % 32, (b + 8) % 32) for a, b in pairs}
        assert {tuple(sorted(p)) for p in shifted} == set(pairs)


@pytest.mark.parametrize(("n", "strategy"), [(16, (16, 4, 2)), (24, (12, 8, 1)),
                                             (32, (8, 4, 1)), (32, (4, 1, 1))])
def test_block_routing_by_symmetry_equals_routing_every_destination(
        n: int, strategy: tuple[int, ...]) -> None:
    topo = build_topology(traffic(TOY, strategy, n), 4, 100.0, routing="ours")
    src, dst = topo.edges
    dist = topo.hops_from(n)
    idx = np.arange(n)
    for m in {2, *[s for s in strategy if s > 1]}:
        demand = (idx[:, None] // m == idx[None, :] // m).astype(float)
        np.fill_diagonal(demand, 0.0)
        loads = ecmp_loads(n, src, dst, demand, dist, idx)
        # conservation: every byte crosses as many links as its path has hops
        assert loads.sum() == pytest.approx((demand * dist.T).sum())
        assert topo.block_route(m)[0] == pytest.approx(loads.max())


def test_data_parallel_matches_the_simulator() -> None:
    """DP on the TopoOpt fabric and on a fat-tree agrees with `oddl simulate`'s systems."""
    model = MODELS["vgg19"]
    n, d, b = 16, 4, 25.0
    sim = simulate(SimConfig(model="vgg19", nodes=n, gbps=d * b, topoopt_degree=d),
                   ["topoopt", "fat-tree"])
    dp = data_parallel(model)
    ours = evaluate(model, dp, build_topology(traffic(model, dp, n), d, b))
    assert ours.allreduce_s + ours.reduce_s == pytest.approx(sim.result("topoopt").comm_s,
                                                            rel=1e-3)
    ft = FatTree(n, d * b).evaluate(model, dp)
    assert ft.allreduce_s + ft.reduce_s == pytest.approx(sim.result("fat-tree").comm_s,
                                                        rel=1e-3)
    assert ours.compute_s == pytest.approx(sim.result("topoopt").compute_s, rel=1e-3)


def test_multi_hop_latency_and_forwarding_load() -> None:
    p = NetParams(latency_us=1.0, forward_us=2.0)
    tr = Traffic(((1, 1.0),), ((4, 5.0, 1),), 16)
    topo = build_topology(tr, 2, 100.0)
    model = JobModel("m", (LayerGroup("a", 1, 1, 1, 0.0),), 1)
    t4 = evaluate(model, (4,), topo, p)
    load, hops = topo.block_route(4)
    assert hops == 3
    expected_mp = traffic(model, (4,), 16).mp[0][1] * load * 8 / 100e9 + 2 * (1e-6 + 2 * 2e-6)
    assert t4.mp_s == pytest.approx(expected_mp)


# --------------------------------------------------------------------------- search


def test_search_is_reproducible_and_reports_progress() -> None:
    cfg = SearchConfig(nodes=16, degree=4, gbps=100.0, budget=120, seed=7)
    seen = []
    a = co_optimise(MODELS["dlrm"], cfg, seen.append)
    b = co_optimise(MODELS["dlrm"], cfg)
    assert a.topoopt.strategy == b.topoopt.strategy
    assert a.topoopt.topology.jumps == b.topoopt.topology.jumps
    assert a.topoopt.topology.matchings == b.topoopt.topology.matchings
    assert a.topoopt.iteration_s == b.topoopt.iteration_s
    mine = [p for p in seen if p.network == "topoopt"]
    assert mine[-1].iteration == 120 and mine[-1].best_s == pytest.approx(a.topoopt.iteration_s)
    assert seen[-1].network.startswith("fat-tree") and seen[-1].iteration == 120
    # the embeddings get sharded, and no result is worse than where the search started
    assert a.topoopt.strategy[0] > 1
    assert a.topoopt.iteration_s <= a.dp_rings.iteration_s
    assert a.speedup_vs_dp_rings > 10


def test_lookahead_search_runs_and_json_shape() -> None:
    cfg = SearchConfig(nodes=8, degree=4, gbps=100.0, budget=60, seed=1, lookahead=True,
                       search="ours")
    r = co_optimise(TOY, cfg)
    d = json.loads(json.dumps(r.as_dict()))
    assert d["config"]["lookahead"] is True and d["paper_up_to"] == 3.4
    assert set(d["topoopt"]["topology"]) >= {"jumps", "matchings", "ring_jumps", "diameter"}
    assert d["speedup_vs_fat_tree"] == pytest.approx(
        d["fat_tree"]["iteration_ms"] / d["topoopt"]["iteration_ms"])


def test_memory_forces_sharding_or_refuses() -> None:
    big = JobModel("big", (LayerGroup("t", 10_000_000_000, 1, 64, 0.0, kind="embedding"),
                           LayerGroup("fc", 1000, 64, 1, 0.0)), 8)
    cfg = SearchConfig(nodes=8, budget=20, memory=Memory(gb=40.0))
    r = co_optimise(big, cfg)
    assert r.topoopt.strategy[0] >= 2 and r.dp_rings.strategy[0] >= 2  # 120 GB does not fit
    with pytest.raises(TopoOptError, match="does not fit on 2 nodes .* use more nodes"):
        co_optimise(big, SearchConfig(nodes=2, degree=2, budget=5))
    with pytest.raises(TopoOptError, match="needs 120.0 GB per node"):
        evaluate_strategy(big, cfg, (1, 1))


def test_degree_beyond_the_transceivers_is_refused() -> None:
    with pytest.raises(TopoOptError, match="degree 6 needs 6 transceivers per node, but the "
                       "nodes have 4; use --degree 4 or less"):
        SearchConfig(nodes=16, degree=6, transceivers=4).validate()


# --------------------------------------------------------------------------- CLI


def test_register_adds_the_command() -> None:
    parser = argparse.ArgumentParser(prog="oddl")
    topoopt_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["topoopt", "--model", "dlrm", "--nodes", "16", "--degree", "4",
                              "--gbps", "100"])
    assert args.func is topoopt_cli.cmd_topoopt
    assert (args.budget, args.seed, args.transceivers) == (4000, 1, 8)


def test_cli_text_and_progress(capsys: pytest.CaptureFixture[str]) -> None:
    rc = topoopt_cli.main(["--model", "dlrm", "--nodes", "16", "--degree", "4", "--gbps",
                           "100", "--budget", "100"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith("oddl topoopt — dlrm: 3,144,845,185 parameters in 4 groups, batch "
                          "2048 per node; 16 nodes, degree 4 × 100 Gbit/s\n")
    assert "\nstrategy: emb-big=16,emb-small=16" in out
    assert "ring jumps (i → i+p):" in out
    assert "fat-tree, similar cost (130.4 Gbit/s)" in out
    assert "(paper: up to 3.4×, 3× for DLRM, vs a similar-cost fat-tree" in out
    assert "topoopt: topoopt: iteration 100/100, best" in err


def test_cli_json_is_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    rc = topoopt_cli.main(["--model", "resnet50", "--nodes", "8", "--degree", "2",
                           "--budget", "30", "--json", "-q"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    d = json.loads(out.strip().splitlines()[-1])
    assert d["config"]["nodes"] == 8 and d["topoopt"]["topology"]["jumps"] == [1, 7]
    assert d["speedup_vs_dp_rings"] >= 1.0


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "vgg19", "--nodes", "16", "--degree", "10"],
     "degree 10 needs 10 transceivers per node, but the nodes have 8"),
    (["--model", "vgg19", "--nodes", "12", "--strategy", "fc6=8"],
     "12 nodes cannot be split into blocks of 8"),
    (["--model", "gpt5", "--nodes", "8"], "unknown model 'gpt5'; shipped models: vgg19"),
    (["--nodes", "8"], "give --model NAME"),
])
def test_cli_bad_input_exits_2(argv: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert topoopt_cli.main([*argv, "-q"]) == 2
    assert message in capsys.readouterr().err


def test_cli_model_file_with_missing_fields_exits_2(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"name": "x", "batch": 2, "groups": [{"name": "a", "params": 3}]}))
    assert topoopt_cli.main(["--model-file", str(f), "--nodes", "4", "-q"]) == 2
    assert "groups[0] (a): missing field(s) in_elems, out_elems" in capsys.readouterr().err
