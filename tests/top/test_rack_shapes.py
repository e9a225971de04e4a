"""`oddl config new --rack K` (decision record 0036): a generated file of ODDL's shape names
device hosts, K consecutive lasers a rack, that `oddl config check` accepts; its
``command_ms`` budgets one request per rack, below the budget without racks; a rack size the
shape cannot take is refused naming the flag and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oddl.cli.main import main
from oddl.common.config import load_testbed
from oddl.launch.racks import RACK_RETUNE_MEASURED_MS, measured_rack_retune_ms
from oddl.launch.shapes import MAX_WSS_HOSTS, Shape, oddl_wss


def _new(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["config", "new", *args]) == 0
    path = tmp_path / "racked.toml"
    path.write_text(capsys.readouterr().out, encoding="utf-8")
    return path


@pytest.mark.parametrize("hosts,rack", [(8, 4), (10, 4), (48, 16), (48, 8), (5, 5), (3, 1)])
@pytest.mark.parametrize("lab", [False, True])
def test_a_racked_file_passes_check_and_covers_every_laser_once_in_racks_of_k(
        hosts: int, rack: int, lab: bool, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--hosts", str(hosts), "--rack", str(rack)] + (["--lab"] if lab else [])
    path = _new(args, tmp_path, capsys)
    assert main(["config", "check", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    cfg = load_testbed(path)
    lasers = [n.transmitter for n in cfg.nodes]
    assert [h.id for h in cfg.device_hosts] == [f"rack{j}" for j in range(-(-hosts // rack))]
    assert [d for h in cfg.device_hosts for d in h.devices] == lasers, "each laser once, in order"
    assert all(len(h.devices) == rack for h in cfg.device_hosts[:-1])
    assert 1 <= len(cfg.device_hosts[-1].devices) <= rack
    if lab:
        assert all(h.address.endswith(":7100") and not h.address.startswith("127.")
                   for h in cfg.device_hosts)
        assert "--host rack0" in path.read_text(encoding="utf-8")
    else:
        assert all(h.address.startswith("127.0.0.1:") for h in cfg.device_hosts)


@pytest.mark.parametrize("lab", [False, True])
def test_racks_budget_less_than_the_controller_retuning_every_laser_at_48_hosts(
        lab: bool, tmp_path: Path) -> None:
    flat = tmp_path / "flat.toml"
    flat.write_text(oddl_wss(Shape(MAX_WSS_HOSTS, lab)), encoding="utf-8")
    for rack in (8, 16):
        racked = tmp_path / f"rack{rack}.toml"
        racked.write_text(oddl_wss(Shape(MAX_WSS_HOSTS, lab, rack=rack)), encoding="utf-8")
        assert (load_testbed(racked).timing.command_ms
                < load_testbed(flat).timing.command_ms), rack


def test_the_emulated_budget_is_twice_the_slowest_measured_racked_retune() -> None:
    for rack, points in RACK_RETUNE_MEASURED_MS.items():
        slowest = max(t for _, t in points)
        assert measured_rack_retune_ms(MAX_WSS_HOSTS, rack) == slowest
        cfg_text = oddl_wss(Shape(MAX_WSS_HOSTS, rack=rack))
        assert f"command_ms = {float(-(-2 * slowest // 1))} " in cfg_text
    # a rack size between the measured ones takes the larger of its neighbours'
    assert measured_rack_retune_ms(32, 12) == max(measured_rack_retune_ms(32, 8),
                                                  measured_rack_retune_ms(32, 16))
    # fewer lasers never budget more than more lasers
    times = [measured_rack_retune_ms(n, 16) for n in range(2, MAX_WSS_HOSTS + 1)]
    assert times == sorted(times)


@pytest.mark.parametrize("args,message", [
    (["--hosts", "8", "--rack", "0"], "--rack 0: a rack holds 1 to 8 lasers"),
    (["--hosts", "8", "--rack", "-2"], "--rack -2: a rack holds 1 to 8 lasers"),
    (["--hosts", "8", "--rack", "9"], "--rack 9: a rack holds 1 to 8 lasers"),
    (["--hosts", "8", "--ports", "2", "--rack", "4"], "has no tunable lasers"),
])
def test_a_rack_the_shape_cannot_take_is_refused_naming_the_flag_and_the_fix(
        args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "new", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert "--rack" in captured.err and ("give --rack" in captured.err
                                         or "drop --rack" in captured.err)


def test_the_generator_refuses_a_bad_rack_when_called_directly() -> None:
    with pytest.raises(ValueError, match="--rack 0"):
        oddl_wss(Shape(8, rack=0))
