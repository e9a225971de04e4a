"""`oddl plan` and `oddl schedule plot`: golden-ish output, JSON, exit codes, a PNG file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from oddl.cli import plan as plan_cli
from oddl.cli.plan import main, parse_size


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ring_on_4_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "ring", "--nodes", "4")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "ring all-reduce on 4 nodes: 6 steps, 6 slots, 4 reconfigurations (transmitter retunes)"
    )
    assert lines[1] == ("  buffer 100.00 MB (25,000,000 x 4 B) at 100 Gbit/s; retune guard 2.10 us")
    assert "bytes sent per node: min 150.00 MB, max 150.00 MB, mean 150.00 MB" in out
    assert "step 0  reduce-scatter  REDUCE  4 transfers of 25.00 MB -> 1 slot" in out
    assert "node0->node1 ch2*  node1->node2 ch3*  node2->node3 ch4*  node3->node0 ch1*" in out
    assert "(4 retunes)" in out
    assert "step 5  all-gather  COPY" in out


def test_ring_on_8_nodes_keeps_its_circuits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "ring", "--nodes", "8", "--bytes", "8MB")
    assert code == 0
    assert "14 steps, 14 slots, 8 reconfigurations" in out
    assert out.count("(8 retunes)") == 1 and out.count("*") == 9  # first slot only (+ legend)


def test_wrht_on_4_and_8_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "wrht", "--nodes", "4")
    assert code == 0
    assert "wrht all-reduce on 4 nodes: 2 steps, 6 slots" in out
    assert "W=4, group size m=4, bidirectional; wavelengths needed 2" in out
    assert "slot 0   t=0.000 ms  node0->node2 ch3*" in out
    code, out, _ = run(capsys, "plan", "wrht", "--nodes", "8", "--wavelengths", "1")
    assert code == 0
    assert "wrht all-reduce on 8 nodes (wavelengths=1): 4 steps" in out
    assert "W=1, group size m=3" in out
    assert (
        "step 1: reduce level 1, 1 group of <= 3 nodes, 1 wavelength, longest path passes "
        "2 nodes" in out
    )
    assert "step 3  broadcast level 0  COPY  5 transfers of 100.00 MB -> 2 slots" in out


def test_totientperms_on_8_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "totientperms", "--nodes", "8", "--degree", "4")
    assert code == 0
    assert "totientperms all-reduce on 8 nodes (degree=4): 14 steps, 28 slots" in out
    assert "TotientPerms degree 4: jumps [1, 3, 5, 7], diameter 2; all-reduce rings [1, 3]" in out
    code, out, _ = run(capsys, "plan", "totientperms", "--nodes", "4")
    assert code == 0
    assert "jumps [1, 3], diameter 2; all-reduce rings [1]" in out


def test_json_is_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "wrht", "--nodes", "8", "--bytes", "1MB", "--json")
    assert code == 0
    d = json.loads(out)
    assert (d["collective"], d["nodes"], d["bytes"], d["steps"]) == ("wrht", 8, 1_000_000, 2)
    assert d["slots"] == sum(p["slots"] for p in d["phases"]) == 14
    assert d["reconfigurations"] == sum(p["retunes"] for p in d["phases"])
    assert d["bytes_sent"]["total"] == 14 * 1_000_000
    assert d["bytes_sent"]["max"] == 7 * 1_000_000  # the root sends to 7 members
    assert d["wavelength_plan"]["wavelengths_needed"] == 4
    circuits = [c for st in d["step_list"] for sl in st["slots"] for c in sl["circuits"]]
    assert len(circuits) == 14 and all(c["channel"] == int(c["dst"][4:]) + 1 for c in circuits)


def test_large_jobs_get_a_phase_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "ring", "--nodes", "64", "--bytes", "574.67MB")
    assert code == 0
    assert "step 0" not in out
    assert "reduce-scatter             63      63       4032" in out
    code, out, _ = run(capsys, "plan", "ring", "--nodes", "64", "--json")
    assert "step_list" not in json.loads(out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "rnig", "--nodes", "4"], "did you mean 'ring'"),
        (["plan", "ring", "--nodes", "0"], "at least 1 rank; got 0"),
        (["plan", "totientperms", "--nodes", "8", "--degree", "3"], "use 2 or 4"),
        (["plan", "wrht", "--nodes", "8", "--wavelengths", "0"], "got W=0"),
        (["plan", "ring", "--nodes", "4", "--wavelengths", "4"], "does not take parameters"),
        (["plan", "ring", "--nodes", "four"], "invalid int value"),
        (["plan", "ring", "--nodes", "4", "--bytes", "1XB"], "bad size '1XB'"),
        (["plan", "ring", "--nodes", "4", "--gbps", "0"], "--gbps must be positive"),
        (["schedule", "plot", "--nodes", "65", "--out", "x.png"], "at most 64 nodes"),
        (
            ["schedule", "plot", "--nodes", "4", "--collective", "x", "--out", "x.png"],
            "unknown collective",
        ),
    ],
)
def test_bad_input_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert out == ""


def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "wrht.png"
    code, out, _ = run(
        capsys,
        "schedule",
        "plot",
        "--nodes",
        "8",
        "--collective",
        "wrht",
        "--wavelengths",
        "1",
        "--bytes",
        "10MB",
        "--out",
        str(path),
    )
    assert code == 0
    assert out.startswith(f"wrote {path}: wrht on 8 nodes, 8 slots")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_register_plugs_into_a_command_tree() -> None:
    """The way oddl/cli/main.py wires it: register(subparsers), then args.func(args)."""
    parser = argparse.ArgumentParser(prog="oddl")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    plan_cli.register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["plan", "parameter-server", "--nodes", "3", "--json"])
    assert args.func(args) == 0
    args = parser.parse_args(["plan", "halving-doubling", "--nodes", "6"])
    assert args.func(args) == 2


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("100MB", 100_000_000),
        ("574.67 MB", 574_670_000),
        ("1GiB", 2**30),
        ("2kB", 2000),
        ("1e6", 1_000_000),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`oddl plan … | head -1`: exit 141 as a shell reports SIGPIPE, no traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "oddl", "plan", "ring", "--nodes", "512", "--bytes", "16MB",
         "--detail", "2000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away with the rest unread
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141, err
    assert first.startswith(b"ring all-reduce on 512 nodes") and "Traceback" not in err
