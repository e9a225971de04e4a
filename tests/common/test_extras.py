"""The core install is what the controller and the agents run; plots, the offline tools, the
live view and torch come with extras (common/extras.py), and a command that misses its extra
names the one to install."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import oddl.common.extras
from oddl.cli.main import main
from oddl.common.errors import MissingExtra
from oddl.common.extras import EXTRA_OF, require

ROOT = Path(__file__).resolve().parents[2]

_BLOCK_EXTRAS = f"""
import importlib.abc, sys
class _NoExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {sorted(EXTRA_OF)!r}:
            raise ImportError(f"{{name}} is not installed (blocked by the test)")
        return None
sys.meta_path.insert(0, _NoExtras())
"""


def _requirement_names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
            for r in requirements}


def test_the_core_leaves_every_extra_package_to_its_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _requirement_names(project["dependencies"])
    extras = project["optional-dependencies"]
    for package, extra in EXTRA_OF.items():
        assert package not in core, f"{package} is in the core install"
        assert package in _requirement_names(extras[extra]), f"{extra} does not bring {package}"
    assert _requirement_names(extras["dev"]) >= {"oddl"}  # make test runs every command


def test_a_command_missing_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(oddl.common.extras.importlib.util, "find_spec",
                        lambda name, *a: None if name == "rich" else real(name, *a))
    with pytest.raises(MissingExtra, match=r"pip install 'oddl\[watch\]'"):
        require("rich", "`oddl watch`")
    require("matplotlib", "drawing a schedule")  # installed here: no error
    assert main(["watch", "--controller", "127.0.0.1:1", "--once"]) == 2
    err = capsys.readouterr().err
    assert "`oddl watch` needs rich" in err and "oddl[watch]" in err


def test_the_demo_runs_on_the_core_install_alone(tmp_path: Path) -> None:
    """Every process of `oddl demo` (controller, agents, emulators, training workers) with the
    extras' packages made unimportable: a controller or agent host needs none of them."""
    (tmp_path / "sitecustomize.py").write_text(_BLOCK_EXTRAS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    blocked = subprocess.run([sys.executable, "-c", "import matplotlib"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert "blocked by the test" in blocked.stderr  # the block reaches child processes
    demo = subprocess.run([sys.executable, "-m", "oddl", "demo", "--run-dir", str(tmp_path / "run"),
                           "--iterations", "3"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "every all-reduce equal to the exact reduction: yes" in demo.stdout
