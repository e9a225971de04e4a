"""The size rules of the house (docs/decisions/0011-the-house.md), checked on every `make test`.

A module of more than 400 lines or a function of more than 60 does several jobs; the failure
names each one so the fix is a split, not a search. Generated gRPC code is excepted.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("oddl", "common", "controller", "agents", "drivers", "protos", "offline",
           "benchmarks", "fuzz", "tests", "lab")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    files = []
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) or rel.parts[:2] == ("tests", "clients"):
                continue
            files.append(path)
    return files


def _oversized(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    found = []
    lines = text.count("\n")
    if lines > MAX_MODULE_LINES:
        found.append(f"{rel}: {lines} lines (at most {MAX_MODULE_LINES}: split it by job)")
    for node in ast.walk(ast.parse(text, filename=str(rel))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{rel}:{node.lineno} {node.name}: {length} lines "
                             f"(at most {MAX_FUNCTION_LINES})")
    return found


def test_the_rules_see_every_package() -> None:
    names = {p.relative_to(ROOT).parts[0] for p in _sources()}
    assert set(CHECKED) <= names


def test_no_module_or_function_over_the_limits() -> None:
    found = [line for path in _sources() for line in _oversized(path)]
    assert not found, "over the house's size limits:\n" + "\n".join(found)


def test_the_rule_catches_a_long_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    module = tmp_path / "long.py"
    module.write_text(f"def too_long():\n{body}\n")
    assert _oversized(module) == [f"long.py:1 too_long: {MAX_FUNCTION_LINES + 1} lines "
                                  f"(at most {MAX_FUNCTION_LINES})"]


def test_the_drivers_contract_names_every_real_driver_module() -> None:
    """A new module in drivers/ must join the contract that keeps the emulators out of it."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    guarded = next(c for c in contracts["contracts"] if c.get("forbidden_modules")
                   == ["drivers.emulators"])["source_modules"]
    real = {f"drivers.{p.stem}" for p in (ROOT / "drivers").glob("*.py") if p.stem != "__init__"}
    assert real - set(guarded) == set(), "add them to the contract in pyproject.toml"
