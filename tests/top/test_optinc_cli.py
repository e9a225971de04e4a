"""`oddl optinc train|eval` and `oddl plan optinc` end to end on small configurations."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from oddl.cli import optinc as optinc_cli
from oddl.cli import plan as plan_cli
from oddl.offline.optinc import model as om


def test_register_adds_train_and_eval_with_func():
    parser = argparse.ArgumentParser(prog="oddl")
    optinc_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["optinc", "eval"])
    assert args.func is optinc_cli.cmd_eval and args.phases is None
    assert (args.nodes, args.bits) == (4, 8)
    args = parser.parse_args(["optinc", "train", "--nodes", "4", "--bits", "4", "--out", "p"])
    assert args.func is optinc_cli.cmd_train
    assert (args.start, args.phase_bits, args.noise_rad) == ("designed", 16, 0.0005)


def test_train_then_eval(tmp_path, capsys):
    out = tmp_path / "phases.json"
    rc = optinc_cli.main(["train", "--nodes", "4", "--bits", "4", "--phase-bits", "8",
                          "--noise-rad", "0", "--steps", "600", "--seed", "1", "--out",
                          str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "M=2 transceivers (2 bit/symbol), 15 U·Σ blocks of 3×3 per layer: 90 MZIs" in \
        captured.out
    before, after = re.search(r"exact: ([\d.]+) % before \(designed phases\) → ([\d.]+) % after",
                              captured.out).groups()
    assert float(before) < 98.0 and float(after) > 99.9
    assert "train: step 600/600" in captured.err
    net = om.load_phases(out, 4, 4)
    assert net.metadata["training"]["steps"] == 600 and net.phase_bits == 8

    rc = optinc_cli.main(["eval", "--phases", str(out), "--noise-rad", "0.005"])
    text = capsys.readouterr().out
    assert rc == 0
    assert re.search(r"exact: \d+\.\d{3} % of uniform random elements \(whole training set, "
                     r"weighted\) at 0\.005 rad noise, 8-bit phases \(2 noise realisations\)",
                     text)
    assert re.search(r"untrained, random phases: \d\.\d{3} %; designed phases before", text)
    assert "error (output − exact, levels) over 16384 random elements:" in text
    assert "  bits          0   0.0005    0.002     0.02" in text
    assert text.rstrip().splitlines()[-1].lstrip().startswith("full")


def test_eval_works_on_a_first_run_from_the_shipped_file(capsys):
    rc = optinc_cli.main(["eval", "--json", "--no-sweep", "--samples", "2000",
                          "--noise-rad", "0"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["source"] == "shipped optinc-n4-b8.json"
    assert (report["n_inputs"], report["bits"], report["transceivers"]) == (4, 8, 4)
    assert report["eval"]["exact_fraction"] == 1.0
    assert report["baselines"]["random_phases"] < 0.01
    assert report["eval"]["error_histogram"] == {"0": 2000}


def test_eval_without_a_shipped_file_trains_now(capsys):
    rc = optinc_cli.main(["eval", "--nodes", "3", "--bits", "2", "--json", "--no-sweep"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["source"] == "trained now"
    assert report["training"]["start"] == "designed"
    assert report["eval"]["exact_fraction"] > 0.9


def test_eval_refuses_missing_and_foreign_files(tmp_path, capsys):
    assert optinc_cli.main(["eval", "--phases", str(tmp_path / "none.json")]) == 1
    assert "cannot read phase file" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other"}')
    assert optinc_cli.main(["eval", "--phases", str(bad)]) == 1
    assert "not an OptINC phase file" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["train", "--nodes", "4", "--bits", "4"],  # no --out
    ["train", "--nodes", "4", "--bits", "4", "--out", "x", "--noise-rad", "-1"],
    ["train", "--nodes", "4", "--bits", "4", "--out", "x", "--phase-bits", "abc"],
    ["train", "--nodes", "1", "--bits", "4", "--out", "x"],
    ["train", "--nodes", "4", "--bits", "17", "--out", "x"],
    ["train", "--nodes", "4", "--bits", "4", "--out", "x", "--start", "warm"],
])
def test_usage_errors_exit_2(argv, capsys):
    assert optinc_cli.main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_train_refuses_transceivers_that_do_not_divide_the_bits(tmp_path, capsys):
    rc = optinc_cli.main(["train", "--nodes", "4", "--bits", "4", "--transceivers", "3",
                          "--out", str(tmp_path / "p.json")])
    assert rc == 1 and "must divide the level bits (4)" in capsys.readouterr().err


# ---- oddl plan optinc -----------------------------------------------------------------------


def test_plan_optinc_one_device(capsys):
    assert plan_cli.main(["plan", "optinc", "--nodes", "4", "--bytes", "4MB"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == ("optinc all-reduce on 4 nodes: one 4-input device (1 device), "
                                    "8-bit levels on 4 transceivers per server")
    assert "each server sends 1.00 MB of levels once" in text
    assert "0     upload        REDUCE           4  servers -> device" in text
    assert "1     broadcast     COPY             4  device -> servers" in text


def test_plan_optinc_two_level_cascade_for_n_squared_servers(capsys):
    rc = plan_cli.main(["plan", "optinc", "--nodes", "16", "--param", "inputs=4", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["levels"] == [4, 4] and d["devices"] == 5 and d["plan_ranks"] == 21
    assert [(s["phase"], s["transfers"], s["from"], s["to"]) for s in d["steps"]] == [
        ("upload", 16, "servers", "level-1 devices"),
        ("cascade up", 4, "level-1 devices", "level-2 device"),
        ("cascade down", 4, "level-2 device", "level-1 devices"),
        ("broadcast", 16, "level-1 devices", "servers")]
    per = d["device_optics"][0]["mzi_count"]
    assert d["mzi_total"] == 5 * per
    assert plan_cli.main(["plan", "optinc", "--nodes", "1024", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["levels"] == [32, 32]


@pytest.mark.parametrize("argv, needle", [
    (["--nodes", "7919"], "do not split into two levels"),
    (["--nodes", "12", "--param", "inputs=5"], "serves 5 nodes"),
    (["--nodes", "4", "--param", "colour=red"], "not ['colour']"),
    (["--nodes", "4", "--param", "bits=8", "--param", "transceivers=3"], "multiple of"),
])
def test_plan_optinc_refusals_name_the_fix(argv, needle, capsys):
    assert plan_cli.main(["plan", "optinc", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_schedule_plot_refuses_optinc_with_the_command_to_use(tmp_path, capsys):
    rc = plan_cli.main(["schedule", "plot", "--collective", "optinc", "--nodes", "4",
                        "--out", str(tmp_path / "x.png")])
    assert rc == 2 and "`oddl plan optinc --nodes N` lays it out" in capsys.readouterr().err


def test_optinc_is_a_registered_collective_whose_plan_sums_on_every_rank():
    import numpy as np

    from oddl.controller.admission import known_collectives
    from oddl.controller.scheduling import COLLECTIVES, execute_plan, make_plan, validate_plan

    assert "optinc" in COLLECTIVES and known_collectives().count("optinc") == 1
    for nodes, inputs, ranks in ((4, 0, 5), (16, 4, 21), (12, 4, 16)):
        plan = make_plan("optinc", nodes, 7, inputs=inputs)
        validate_plan(plan)
        assert plan.n_ranks == ranks
        rng = np.random.default_rng(nodes)
        bufs = [rng.standard_normal(7) if r < nodes else np.zeros(7) for r in range(ranks)]
        total = np.sum(bufs[:nodes], axis=0)
        for out in execute_plan(plan, bufs):
            np.testing.assert_allclose(out, total)
        sent = plan.bytes_sent(1)
        assert list(sent[:nodes]) == [7] * nodes  # every server sends its buffer once
