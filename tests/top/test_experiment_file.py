"""The experiment file and the pure core around it (oddl.experiment): validation whose errors
name the key and the fix, the matrix's expansion into testbed variants, the variant's testbed
text, the estimate of the time left, run references, repeats folded, figure choice."""

from __future__ import annotations

import tomllib

import pytest

from oddl.common.config import load_testbed, parse_testbed
from oddl.common.errors import ConfigError
from oddl.experiment.index import resolve_run
from oddl.experiment.plot import choose, series
from oddl.experiment.points import (
    duration_text,
    expand,
    line_rate_bound_s,
    resolve_hosts,
    time_left_s,
    variant_text,
    variants,
)
from oddl.experiment.runner import find_experiment, load_experiment, shipped_experiments
from oddl.experiment.spec import parse_experiment
from oddl.experiment.summary import compare, fold
from oddl.launch.testbed import DEFAULT_TESTBED

HEAD = '[experiment]\nname = "x"\ntestbed = "emulated-4node"\nkind = "allreduce"\n'


def _parse(body: str, head: str = HEAD) -> object:
    return parse_experiment(head + body, "x.toml")


@pytest.mark.parametrize(("body", "key", "fix"), [
    ("[factors]\nsize_bytes = [4096]\ncolective = ['ring']\n", "factors.colective",
     "did you mean 'collective'?"),
    ("[factors]\nsize_bytes = [4096]\nparams = [10]\n", "factors.params",
     'set kind = "train"'),
    ("[factors]\ncollective = ['ring']\n", "factors.size_bytes", "add size_bytes = ["),
    ("[factors]\nsize_bytes = [4097]\n", "factors.size_bytes", "use a multiple of 4, e.g. 4096"),
    ("[factors]\nsize_bytes = [4096]\ncollective = ['rign']\n", "factors.collective",
     "is not one of ring"),
    ("[factors]\nsize_bytes = [4096]\nnetwork = 'optic'\n", "factors.network",
     "use one of those"),
    ("[factors]\nsize_bytes = [4096]\nhosts = [1]\n", "factors.hosts", "use 2 or more"),
    ("[factors]\nsize_bytes = [4096, 4096]\n", "factors.size_bytes", "list each value once"),
    ("[factors]\nsize_bytes = []\n", "factors.size_bytes", "give at least one value"),
    ("[factors]\nsize_bytes = [4096]\nlaser_tune_ms = [-1]\n", "factors.laser_tune_ms",
     "outside [0.0, None]"),
    ("[factors]\nsize_bytes = [4096]\nline_rate_gbps = [0]\n", "factors.line_rate_gbps",
     "use a positive value"),
    ("repeats = 0\n[factors]\nsize_bytes = [4096]\n", "experiment.repeats",
     "use a value in that range"),
    ("[factor]\nsize_bytes = [4096]\n", "factor", "did you mean [factors]?"),
])
def test_a_bad_file_is_refused_naming_the_key_and_the_fix(body: str, key: str, fix: str
                                                          ) -> None:
    with pytest.raises(ConfigError) as err:
        _parse(body)
    assert str(err.value).startswith(f"x.toml: {key}: ")
    assert fix in str(err.value)


def test_the_head_is_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"x.toml: experiment.kind: 'bench' is not one of"):
        _parse("", HEAD.replace('"allreduce"', '"bench"'))
    with pytest.raises(ConfigError, match=r"experiment.name: 'My Run' is not a plain name; "
                                          r"use lower-case"):
        _parse("[factors]\nsize_bytes = 4\n", HEAD.replace('"x"', '"My Run"'))
    with pytest.raises(ConfigError, match=r"experiment.testbed: missing; add testbed"):
        _parse("", '[experiment]\nname = "x"\nkind = "train"\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        _parse("[factors\n")


def test_defaults_fill_the_factors_a_kind_has() -> None:
    exp = parse_experiment('[experiment]\nname = "t"\ntestbed = "emulated-4node"\n'
                           'kind = "train"\n[factors]\nnetwork = ["optical", "ideal"]\n')
    assert exp.factors == {"collective": ["ring"], "network": ["optical", "ideal"],
                           "hosts": [0], "params": [100_000], "iterations": [10]}
    assert exp.varied == ["network"] and exp.knobs == []


def test_points_are_grouped_by_testbed_variant_with_repeats_outside_the_points() -> None:
    exp = _parse("repeats = 2\n[factors]\ncollective = ['ring', 'halving-doubling']\n"
                 "size_bytes = [4096, 8192]\nlaser_tune_ms = [0.5, 2.0]\n")
    vs = variants(exp)
    assert [(v.name, v.knobs) for v in vs] == [("v0", {"laser_tune_ms": 0.5}),
                                                ("v1", {"laser_tune_ms": 2.0})]
    points = expand(exp)
    assert len(points) == 2 * 2 * 2 * 2
    assert [p.variant for p in points] == ["v0"] * 8 + ["v1"] * 8
    assert [p.key for p in points[:8]] == [(0, 0), (1, 0), (2, 0), (3, 0),
                                           (0, 1), (1, 1), (2, 1), (3, 1)]
    assert [p.key for p in points[8:10]] == [(4, 0), (5, 0)]
    assert points[0].factors == {"collective": "ring", "network": "optical", "hosts": 0,
                                 "size_bytes": 4096, "laser_tune_ms": 0.5}
    assert points[0].job_key == points[1].job_key != points[2].job_key
    assert [p.key for p in expand(exp)] == [p.key for p in points]  # fixed by the file


def test_a_variant_is_the_testbed_file_with_its_knobs_set() -> None:
    exp = _parse("[factors]\nsize_bytes = [4096]\nlaser_tune_ms = [0.001]\n"
                 "line_rate_gbps = [1.5]\n")
    (variant,) = variants(exp)
    base = DEFAULT_TESTBED.read_text(encoding="utf-8")
    text = variant_text(base, variant, str(DEFAULT_TESTBED))
    cfg = parse_testbed(text)
    assert cfg.timing.laser_tune_ms == 0.001 and cfg.fabric.line_rate_gbps == 1.5
    assert cfg.timing.wss_settle_ms == load_testbed(DEFAULT_TESTBED).timing.wss_settle_ms
    assert tomllib.loads(text)["testbed"]["name"] == "emulated-4node"
    plain = _parse("[factors]\nsize_bytes = [4096]\n")
    assert variant_text(base, variants(plain)[0]) == base


def test_hosts_are_checked_against_the_testbed() -> None:
    cfg = load_testbed(DEFAULT_TESTBED)
    exp = resolve_hosts(_parse("[factors]\nsize_bytes = 4\nhosts = [0, 2]\n"), cfg)
    assert exp.factors["hosts"] == [4, 2]
    with pytest.raises(ConfigError, match=r"factors.hosts: 8 hosts, but emulated-4node has 4 "
                                          r"nodes; use at most 4"):
        resolve_hosts(_parse("[factors]\nsize_bytes = 4\nhosts = 8\n"), cfg)
    with pytest.raises(ConfigError, match="list 4 once"):
        resolve_hosts(_parse("[factors]\nsize_bytes = 4\nhosts = [0, 4]\n"), cfg)


def test_the_bound_and_the_time_left() -> None:
    assert line_rate_bound_s(4, 3_000_000, 3.0) == pytest.approx(2 * 3 / 4 * 8e-3)
    assert time_left_s([], 5, 1, []) is None
    assert time_left_s([1.0, 3.0], 5, 2, [10.0, 20.0]) == pytest.approx(2.0 * 5 + 15.0 * 2)
    assert time_left_s([1.0], 0, 1, []) == pytest.approx(10.0)  # the default start cost
    assert duration_text(None) == "unknown" and duration_text(65.2) == "1 min 05 s"
    assert duration_text(12) == "12 s"


def test_a_run_is_named_by_id_prefix_name_or_latest() -> None:
    runs = [{"run_id": "a-20260101-000000", "name": "a"},
            {"run_id": "b-20260102-000000", "name": "b"},
            {"run_id": "a-20260103-000000", "name": "a"}]
    assert resolve_run(runs, "latest") == "a-20260103-000000"
    assert resolve_run(runs, "a") == "a-20260103-000000"
    assert resolve_run(runs, "b-2026") == "b-20260102-000000"
    with pytest.raises(ConfigError, match="ambiguous"):
        resolve_run(runs, "a-2026")
    with pytest.raises(ConfigError, match="`oddl experiment list` shows the runs"):
        resolve_run(runs, "zzz")
    with pytest.raises(ConfigError, match="holds no runs yet"):
        resolve_run([], "latest")


def _row(point: int, repeat: int, t: float | None, network: str = "optical",
         run: str = "r1") -> dict[str, object]:
    return {"run_id": run, "point": point, "repeat": repeat, "variant": "v0",
            "status": "ok" if t is not None else "failed",
            "error": None if t is not None else "LostData: x", "collective": "ring",
            "network": network, "hosts": 4, "size_bytes": 4096 * (point + 1), "time_ms": t}


def test_repeats_fold_into_median_spread_and_failures() -> None:
    folded = fold([_row(0, 0, 1.0), _row(0, 1, 3.0), _row(0, 2, 2.0),
                   _row(1, 0, None), _row(1, 1, 5.0)])
    first, second = folded
    assert (first["n"], first["failed"], first["time_ms"]) == (3, 0, 2.0)
    assert (first["time_ms_min"], first["time_ms_max"], first["time_ms_std"]) == (1.0, 3.0, 1.0)
    assert (second["n"], second["failed"], second["error"]) == (1, 1, "LostData: x")
    assert second["time_ms_std"] == 0.0
    pairs = compare(folded, fold([_row(0, 0, 4.0, run="r2")]), "time_ms")
    assert pairs[0]["b_over_a"] == 2.0 and pairs[1]["b"] is None


def test_figures_follow_what_the_runs_vary() -> None:
    assert choose("allreduce", ["collective", "size_bytes"], "auto", None) == [("sizes", None)]
    assert choose("allreduce", ["size_bytes", "laser_tune_ms"], "auto", None) == [
        ("sizes", None), ("sweep", "laser_tune_ms")]
    assert choose("train", ["network"], "auto", None) == [("networks", None)]
    with pytest.raises(ConfigError, match="vary no testbed knob; name the factor"):
        choose("train", ["network"], "sweep", None)
    rows = fold([_row(0, 0, 1.0), _row(1, 0, 2.0), _row(2, 0, 3.0, network="ideal")])
    lines = series(rows, "size_bytes", "time_ms")
    assert list(lines) == ["optical", "ideal"] and len(lines["optical"]) == 2


def test_the_shipped_experiments_are_valid() -> None:
    assert shipped_experiments() == ["allreduce-sizes", "guard-time", "train-optical-vs-ideal"]
    for name in shipped_experiments():
        exp = load_experiment(find_experiment(name))
        assert exp.name == name and expand(exp)
    with pytest.raises(ConfigError, match="no shipped experiment of that name"):
        find_experiment("nope")
