"""TopoOpt as the authors' code builds, routes and searches; their experiments' profiles; sweeps."""

from __future__ import annotations

import json
import math

import networkx as nx
import numpy as np
import pytest

from oddl.cli import topoopt as topoopt_cli
from oddl.common.errors import OddlError
from oddl.controller.scheduling.totient import totient_picks
from oddl.offline.topoopt.annealing import anneal_authors
from oddl.offline.topoopt.authors import (
    authors_rings,
    authors_split,
    coin_path,
    perfect_matchings,
    single_path_loads,
)
from oddl.offline.topoopt.job_model import JobModel, LayerGroup, Traffic, traffic
from oddl.offline.topoopt.model_zoo import MODELS
from oddl.offline.topoopt.our_construction import mp_matchings
from oddl.offline.topoopt.profiles import DLRM_MS, VGG_MS
from oddl.offline.topoopt.search import co_optimise
from oddl.offline.topoopt.search_config import SearchConfig
from oddl.offline.topoopt.sweep import parse_rates
from oddl.offline.topoopt.topology import _ring_route, build_topology

# --------------------------------------------------------------------------- construction


def test_split_is_all_rings_in_the_authors_active_code_and_proportional_beside_it() -> None:
    tr = Traffic(((1, 1000.0),), ((4, 10.0, 1),), 16)
    assert authors_split(tr, 4, "all-dp") == (4, 0)
    # T_dp = 1·1000·(2·16−1) = 31000; T_mp = 4 blocks · 4·3 pairs · 10 = 480: lround(3.94) = 4
    assert authors_split(tr, 4, "proportional") == (4, 0)
    heavy_mp = Traffic(((1, 10.0),), ((4, 1000.0, 1),), 16)
    # T_dp = 310, T_mp = 48000: dp rounds to 0, made 2 (a ring is always kept)
    assert authors_split(heavy_mp, 4, "proportional") == (2, 2)


def test_heaviest_group_takes_every_ring_link_but_two_for_the_full_ring() -> None:
    n = 128
    # groups of 32 (stride 4) carry the most bytes: they get 4 − 2 links, the full ring 2
    tr = Traffic(((1, 1e6), (4, 1e8)), (), n)
    rings = authors_rings(tr, 4)
    assert rings == {4: (4, 124), 1: (1, 127)}
    # data parallel only: one group of N takes them all, exactly TotientPerms' picks
    dp = authors_rings(Traffic(((1, 1e6),), (), n), 8)
    picks = totient_picks(n, 8)
    assert dp == {1: tuple(sorted(picks + tuple(n - p for p in picks)))}
    # nothing to all-reduce (ours: their code indexes an empty list): the full ring
    assert authors_rings(Traffic((), ((n, 1.0, 1),), n), 4) == {1: (1, 13, 115, 127)}


def test_a_group_without_rings_takes_the_candidate_jump_with_the_shortest_coin_path() -> None:
    # groups of 8 with stride 2 on 16 nodes, jumps ±1 and ±6: J(8) = 2, 6, 10, 14, and 6 is
    # one hop where 2 needs two; ours routes stride 2 in two hops each way
    jumps = (1, 6, 10, 15)
    assert coin_path(16, 2, jumps) == [6]
    theirs, hops = _ring_route(16, 2, (), jumps, "authors")
    assert hops == 1 and theirs == {6: pytest.approx(7 / 8), 10: pytest.approx(7 / 8)}
    ours, hops = _ring_route(16, 2, (), jumps, "ours")
    assert hops == 2 and set(ours) == {1, 15}


def test_odd_blocks_are_matched_perfectly_with_zero_demand_pairs() -> None:
    n = 12
    rounds = perfect_matchings(n, [(3, 5.0)], 2)
    for pairs in rounds:
        assert sorted(x for p in pairs for x in p) == list(range(n))  # every node matched
        assert any(a // 3 != b // 3 for a, b in pairs)  # across blocks: zero demand
        assert sum(a // 3 == b // 3 for a, b in pairs) == 4  # one pair inside each block
    assert len({p for pairs in rounds for p in pairs}) == 12  # the second round adds new pairs
    ours = mp_matchings(n, [(3, 5.0)], 1)[0]
    assert len(ours) == 4  # ours leaves a node of every block unmatched
    # odd blocks on more nodes take the two-block shortcut; still perfect and optimal
    for pairs in perfect_matchings(30, [(5, 1.0)], 4):
        assert sorted(x for p in pairs for x in p) == list(range(30))
        assert sum(a // 5 == b // 5 for a, b in pairs) == 12


def test_mixed_demand_matching_is_a_minimum_cost_perfect_matching() -> None:
    n = 16
    demand = [(8, 10.0), (2, 50.0)]
    w = np.zeros((n, n))
    idx = np.arange(n)
    for m, v in demand:
        w += v * (idx[:, None] // m == idx[None, :] // m)
    np.fill_diagonal(w, 0)
    first = perfect_matchings(n, demand, 3)[0]
    assert len(first) == n // 2
    g = nx.Graph()
    top = w.max()
    g.add_weighted_edges_from((i, j, top - w[i, j]) for i in range(n) for j in range(i + 1, n))
    best = nx.min_weight_matching(g)
    assert sum(w[a, b] for a, b in first) == pytest.approx(sum(w[a, b] for a, b in best))


def test_single_path_routing_puts_each_pair_on_one_shortest_path() -> None:
    topo = build_topology(traffic(MODELS["dlrm"], (8, 8, 1, 1), 32), 4, 100.0)
    src, dst = topo.edges
    dist = topo.hops_from(32)
    for target in (5, 17):
        demand = np.zeros((32, 1))
        demand[0, 0] = 1.0
        loads = single_path_loads(32, src, dst, demand, dist[[target]], np.array([target]))
        assert set(np.unique(loads)) <= {0.0, 1.0}
        assert loads.sum() == dist[target, 0]
    idx = np.arange(32)
    block = (idx[:, None] // 8 == idx[None, :] // 8).astype(float)
    np.fill_diagonal(block, 0)
    loads = single_path_loads(32, src, dst, block, dist, idx)
    assert loads.sum() == pytest.approx((block * dist.T).sum())


# --------------------------------------------------------------------------- the search


def test_authors_search_rebuilds_for_rejected_moves_and_keeps_the_best_topology() -> None:
    model = JobModel("m", tuple(LayerGroup(f"g{i}", 1000, 10, 10, 1.0) for i in range(3)), 8)
    rebuilt: list[tuple[int, ...]] = []

    def rebuild(s: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
        rebuilt.append(s)
        return ("topology for", s)

    def evaluate_on(s: tuple[int, ...], ctx: tuple[str, tuple[int, ...]]) -> float:
        # data parallel is best; a topology built for the strategy helps it a little
        return 1e-3 * (sum(s) - (0.5 if ctx[1] == s else 0.0))

    # strategy moves are never accepted when worse (huge α); the topology optimiser's own
    # rule accepts almost anything (tiny α): it rebuilds for rejected moves (look-ahead)
    cfg = SearchConfig(nodes=8, budget=200, seed=3, alpha=1e9, topo_alpha=1e-9)
    best, ctx, t, stats = anneal_authors(model, cfg, evaluate_on, rebuild, None, "t")
    assert best == (1, 1, 1) and stats.accepted == 0
    assert any(s != (1, 1, 1) for s in rebuilt)
    assert evaluate_on(best, ctx) == t  # the topology the best was measured on


def test_search_is_reproducible_and_reports_rebuilds() -> None:
    cfg = SearchConfig(nodes=16, degree=4, budget=300, seed=2)
    a = co_optimise(MODELS["dlrm"], cfg)
    b = co_optimise(MODELS["dlrm"], cfg)
    assert a.topoopt.strategy == b.topoopt.strategy
    assert a.topoopt.iteration_s == b.topoopt.iteration_s
    assert a.stats.rebuilds > 0
    with pytest.raises(OddlError, match="lookahead belongs to our search"):
        SearchConfig(nodes=16, lookahead=True).validate()


# --------------------------------------------------------------------------- profiles


def test_profiles_follow_the_authors_scripts_and_measurements() -> None:
    dlrm = MODELS["dlrm-topoopt"]
    assert dlrm.batch == 128 * 4
    tables = dlrm.groups[0]
    assert tables.params == 64 * 10_000_000 * 128 and tables.out_elems == 64 * 128
    assert tables.compute_ms == pytest.approx(DLRM_MS["embed"])
    top = dlrm.groups[2]
    assert top.params == 10240 * 4096 + 4096 + 14 * (4096 * 4096 + 4096) + 4097
    vgg = MODELS["vgg16-topoopt"]
    assert [g.name for g in vgg.groups][-3:] == ["fc6", "fc7", "fc8"]
    assert vgg.groups[-3].in_elems == 61952  # 512·11·11 from 229×229 with padding 2
    assert vgg.groups[0].compute_ms == pytest.approx(2 * VGG_MS[64] + VGG_MS["pool"])
    bert = MODELS["bert-topoopt"]
    assert bert.batch == 64 and sum(g.params for g in bert.groups) == 12 * (
        3 * 4 * 1024 * 1024 + 4 * (1024 * 1024 + 1024)) + 1025


def test_dlrm_of_the_authors_beats_the_similar_cost_fat_tree_but_not_equal_bandwidth() -> None:
    r = co_optimise(MODELS["dlrm-topoopt"], SearchConfig(nodes=128, degree=4, budget=300))
    assert 2.0 < r.speedup_vs_fat_tree < 3.4
    assert r.fat_tree_equal_bw.iteration_s < r.topoopt.iteration_s
    assert r.topoopt.strategy[0] == 128  # the tables are sharded over every server


# --------------------------------------------------------------------------- the CLI


def test_sweep_bandwidth_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = topoopt_cli.main(["--model", "dlrm-topoopt", "--nodes", "32", "--budget", "50",
                             "--sweep-bandwidth", "10,100", "--json", "-q"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["sweep"]
    assert [r["gbps"] for r in rows] == [10.0, 100.0]
    for r in rows:
        assert r["speedup_vs_fat_tree"] == pytest.approx(r["fat_tree_ms"] / r["topoopt_ms"])
    assert rows[1]["topoopt_ms"] < rows[0]["topoopt_ms"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--sweep-bandwidth", "10,fast"], "item 'fast' is not a rate"),
    (["--sweep-bandwidth", "0"], "must be > 0"),
    (["--lookahead"], "add --search ours"),
])
def test_cli_refusals(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code = topoopt_cli.main(["--model", "dlrm", "--nodes", "16", "-q", *argv])
    assert code == 2
    assert message in capsys.readouterr().err


def test_paper_rates() -> None:
    assert parse_rates("paper") == (10.0, 25.0, 40.0, 100.0, 200.0)
    assert math.isclose(sum(parse_rates("12.5, 25")), 37.5)
