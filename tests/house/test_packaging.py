"""What a lab installs: the wheel carries the files the commands read at run time (the testbed
files, the OptINC phases, the proto), and an installed copy finds them (decision record 0014)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from oddl.cli.main import main
from oddl.common.errors import ConfigError
from oddl.launch.shipped import read_shipped_testbed, shipped_testbed, shipped_testbed_names
from oddl.launch.testbed import DEFAULT_TESTBED

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ["emulated-4node", "emulated-8node", "lab-4node", "lab-8node", "lab-topoopt-12node",
           "topoopt-12node"]
RUNTIME_FILES = ("oddl/testbeds/emulated-4node.toml", "oddl/testbeds/lab-4node.toml",
                 "oddl/offline/optinc/data/optinc-n4-b8.json", "oddl/protos/oddl.proto",
                 "oddl/experiments/allreduce-sizes.toml")
_SKIP = shutil.ignore_patterns(".git", ".venv", "runs", "build", "dist", "*.egg-info",
                               "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
                               ".hypothesis", "benchmarks", "fuzz", "tests")


def test_the_source_tree_has_one_copy_reached_from_deploy() -> None:
    link = ROOT / "deploy" / "testbeds"
    assert link.is_symlink() and link.resolve() == (ROOT / "oddl" / "testbeds").resolve()
    assert DEFAULT_TESTBED == ROOT / "oddl" / "testbeds" / "emulated-4node.toml"
    assert (link / "lab-4node.toml").read_bytes() == shipped_testbed("lab-4node").read_bytes()
    assert shipped_testbed_names() == SHIPPED


def test_config_example_prints_a_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "example", "lab-4node"]) == 0
    assert capsys.readouterr().out == read_shipped_testbed("lab-4node")
    assert main(["config", "example"]) == 0
    assert capsys.readouterr().out.split() == SHIPPED
    assert main(["config", "example", "lab-9node"]) == 2
    assert "shipped: " + ", ".join(SHIPPED) in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no shipped testbed file"):
        read_shipped_testbed("nope")


_FROM_THE_INSTALL = """
import json, sys
import oddl, oddl.launch.testbed
from oddl.common.config import load_testbed
from oddl.offline.optinc.model import shipped_path
from oddl.launch.shipped import shipped_testbed
print(json.dumps({"oddl": oddl.__file__, "default": str(oddl.launch.testbed.DEFAULT_TESTBED),
                  "nodes": [n.id for n in load_testbed(oddl.launch.testbed.DEFAULT_TESTBED).nodes],
                  "lab": load_testbed(shipped_testbed("lab-4node")).name,
                  "phases": shipped_path(4, 8)}))
"""


def test_the_wheel_carries_the_runtime_files_and_an_install_finds_them(
        tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=_SKIP)
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("oddl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in RUNTIME_FILES:
        assert rel in names, f"{rel} is not in {wheel.name}"
    roots = {n.split("/")[0] for n in names}
    assert roots == {"oddl", wheel.name.split("-py")[0] + ".dist-info"}, roots  # one import root

    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
         "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run([sys.executable, "-c", _FROM_THE_INSTALL], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["oddl"].startswith(str(site))          # the installed copy, not the tree
    assert found["default"] == str(site / "oddl" / "testbeds" / "emulated-4node.toml")
    assert found["nodes"] == ["n0", "n1", "n2", "n3"] and found["lab"]
    assert found["phases"] == str(site / "oddl" / "offline" / "optinc" / "data" / "optinc-n4-b8.json")
    check = subprocess.run([sys.executable, "-m", "oddl", "config", "check",
                            found["default"]], capture_output=True, text=True, timeout=120,
                           cwd=tmp_path, env=env)
    assert check.returncode == 0 and ": ok" in check.stdout, check.stderr


@pytest.mark.parametrize("folder", ["common", "protos", "controller", "agents", "drivers",
                                    "offline"])
def test_a_top_level_folder_imports_only_under_oddl(folder: str) -> None:
    """From a source checkout the folders sit on the path under their own names too; importing
    one that way fails and names the one name, so no module is ever loaded twice."""
    run = subprocess.run([sys.executable, "-c", f"import {folder}"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 1
    assert f"import it as oddl.{folder}" in run.stderr
    ok = subprocess.run([sys.executable, "-c", f"import oddl.{folder}"], capture_output=True,
                        text=True, timeout=120, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
