"""`oddl optinc train|eval` end to end on tiny configurations."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from oddl import optinc_cli
from oddl.drivers import optinc_model as om


def test_register_adds_train_and_eval_with_func():
    parser = argparse.ArgumentParser(prog="oddl")
    optinc_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["optinc", "eval", "--phases", "x.json"])
    assert args.func is optinc_cli.cmd_eval
    args = parser.parse_args(["optinc", "train", "--nodes", "4", "--bits", "4", "--out", "p"])
    assert args.func is optinc_cli.cmd_train
    assert (args.mode, args.phase_bits, args.noise_rad) == ("unitary+diagonal", 8, 0.02)


def test_train_then_eval(tmp_path, capsys):
    out = tmp_path / "phases.json"
    rc = optinc_cli.main(["train", "--nodes", "4", "--bits", "4", "--steps", "300",
                          "--restarts", "1", "--seed", "1", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "6 MZIs + 4 attenuators" in captured.out
    assert "exact: 100.00 % of 65536 elements without noise" in captured.out
    assert "train: step 300/300" in captured.err
    net = om.load_phases(out, 4, 4)
    assert net.metadata["training"]["steps"] == 300

    rc = optinc_cli.main(["eval", "--phases", str(out), "--realisations", "2"])
    text = capsys.readouterr().out
    assert rc == 0
    assert re.search(r"exact: \d+\.\d{3} % of all 65536 elements at 0\.02 rad noise, 8-bit "
                     r"phases \(2 noise realisations\)", text)
    assert "error (output − exact, levels):" in text
    assert "  bits          0     0.01     0.02     0.05" in text
    assert text.rstrip().splitlines()[-1].lstrip().startswith("full")


def test_train_and_eval_json_svd(tmp_path, capsys):
    out = tmp_path / "svd.json"
    rc = optinc_cli.main(["train", "--nodes", "2", "--bits", "3", "--mode", "svd",
                          "--steps", "200", "--restarts", "1", "--noise-rad", "0",
                          "--phase-bits", "full", "--json", "-q", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0 and captured.err == ""
    summary = json.loads(captured.out)
    assert summary["mzi_count"] == 2 and summary["phase_bits"] is None
    assert summary["training"]["exact_fraction"] == 1.0

    rc = optinc_cli.main(["eval", "--phases", str(out), "--json", "--noise-rad", "0.3",
                          "--phase-bits", "4", "--samples", "50"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0
    ev = report["eval"]
    assert ev["elements"] == 50 and not ev["whole_input_space"]
    assert ev["noise_rad"] == 0.3 and ev["phase_bits"] == 4
    assert sum(ev["error_histogram"].values()) == 50 * ev["realisations"]
    assert [row["phase_bits"] for row in report["sweep"]["rows"]] == [4, 6, 8, 10, 12, None]
    assert report["training"]["steps"] == 200


def test_eval_golden_output_for_designed_phases(tmp_path, capsys):
    path = tmp_path / "d.json"
    om.save_phases(path, om.OptincNetwork.designed(4, 4), {})
    assert optinc_cli.main(["eval", "--phases", str(path), "--noise-rad", "0"]) == 0
    text = capsys.readouterr().out.replace(str(path), "PHASES")
    row = "  100.00%" * 4
    assert text == (
        "PHASES: N=4, 4-bit, unitary+diagonal, P=dft-mean, intensity detection\n"
        "hardware: 6 MZIs + 4 attenuators (20 phase shifters), depth 5, splitter T 6.0 dB\n"
        "exact: 100.000 % of all 65536 elements at 0 rad noise, 8-bit phases "
        "(1 noise realisation)\n"
        "error (output − exact, levels):\n"
        "    +0       65536   100.000 %\n"
        "exact fraction by phase resolution (rows) and phase noise in rad (columns):\n"
        "  bits          0     0.01     0.02     0.05\n"
        + "".join(f"  {b:>4}  {row}\n" for b in ("4", "6", "8", "10", "12", "full")))


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
    ["eval"],
])
def test_usage_errors_exit_2(argv, capsys):
    assert optinc_cli.main(argv) == 2
    assert "error" in capsys.readouterr().err
