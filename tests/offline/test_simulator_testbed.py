"""The simulator at testbed scale: one all-reduce on a testbed file's timing, its calibration
and ``oddl simulate --testbed`` (moved from test_simulator.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oddl.cli import simulate as simulate_cli
from oddl.common.config import load_testbed
from oddl.offline.simulator.testbed import TestbedOverheads, calibrate, predict_testbed_allreduce

EMULATED = Path(__file__).resolve().parents[2] / "deploy" / "testbeds" / "emulated-4node.toml"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = simulate_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_testbed_prediction_uses_the_files_timing_and_the_same_schedule():
    cfg = load_testbed(EMULATED)
    n = 4 * 65_536
    p = predict_testbed_allreduce(cfg, n, collective="ring", network="optical")
    t = cfg.timing
    hold = 8 * (n // 4) * 4 / (cfg.fabric.line_rate_gbps * 1e9)
    slot = t.clock_skew_us * 1e-6 + hold + t.slot_margin_us * 1e-6
    assert p.slots == 6 and p.retunes == 0
    assert p.schedule_s == pytest.approx(6 * slot - t.slot_margin_us * 1e-6)
    assert p.launch_s == pytest.approx(t.launch_margin_ms / 1e3)
    hd = predict_testbed_allreduce(cfg, n, collective="halving-doubling")
    assert hd.retunes == 8  # two partner changes of four transmitters
    guard = (t.command_ms + t.laser_tune_ms) / 1e3 + (t.clock_skew_us + t.cdr_lock_us) / 1e6
    holds = 8 * 4 * (n / 2 + n / 4 + n / 4 + n / 2) / (cfg.fabric.line_rate_gbps * 1e9)
    assert hd.schedule_s == pytest.approx(
        holds + 2 * guard + 2 * t.clock_skew_us * 1e-6 + 3 * t.slot_margin_us * 1e-6)


def test_testbed_ideal_prediction_and_calibration():
    cfg = load_testbed(EMULATED)
    tiny = predict_testbed_allreduce(cfg, 64, network="ideal")
    over = calibrate(0.010, tiny)
    assert over.fixed_s == pytest.approx(0.010 - tiny.copy_s - tiny.schedule_s)
    big = predict_testbed_allreduce(cfg, 1 << 20, network="ideal", overheads=over)
    assert big.launch_s == 0.0 and big.fixed_s == over.fixed_s
    assert big.schedule_s == pytest.approx(6 * 8 * 4 * (1 << 18)
                                           / (cfg.fabric.line_rate_gbps * 1e9))
    assert predict_testbed_allreduce(cfg, 64, network="ideal",
                                     overheads=TestbedOverheads(fixed_s=0.0)).fixed_s == 0.0


def test_testbed_cli(capsys):
    code, out, _ = _run(capsys, "--testbed", str(EMULATED), "--bytes", "256KiB", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["testbed"] == "emulated-4node" and doc["bytes"] == 262_144
    code, _, err = _run(capsys, "--testbed", str(EMULATED), "--network", "ideal",
                        "--collective", "halving-doubling", "--bytes", "3")
    assert code == 2 and "at least one element" in err
