"""The size rules of the house (docs/decisions/0011-the-house.md), checked on every `make test`.

A module of more than 400 lines or a function of more than 60 does several jobs; the failure
names each one so the fix is a split, not a search. Generated gRPC code is excepted. No import
cycle either, at any depth: the failure names each cycle's modules and the file:line of every
import in it.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
                   == ["oddl.drivers.emulators"])["source_modules"]
    real = {f"oddl.drivers.{p.stem}" for p in (ROOT / "drivers").glob("*.py")
            if p.stem != "__init__"}
    assert real - set(guarded) == set(), "add them to the contract in pyproject.toml"


def test_the_floors_name_every_room_of_the_root() -> None:
    """A new room (or module) directly under `oddl` must take its floor in the layers contract:
    import-linter leaves an unnamed one unchecked."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    floors = next(c for c in contracts["contracts"] if c["type"] == "layers")
    named = {part.strip().split(".")[0] for layer in floors["layers"]
             for part in layer.replace(":", "|").split("|")}
    rooms = {p.name if p.is_dir() else p.stem for p in (ROOT / "oddl").iterdir()
             if (p / "__init__.py").exists() or (p.suffix == ".py" and p.stem != "__init__")}
    assert rooms - {"__main__"} - named == set(), "give them a floor in pyproject.toml"


# --------------------------------------------------------------------------- import cycles

IMPORT_GRAPH = ("oddl", "lab")  # oddl's subpackages are linked in: oddl/agents -> ../agents


def _module_names(root: Path) -> dict[str, Path]:
    """Every project module of the import graph by dotted name (a package by its own name),
    found as the interpreter finds them: through oddl's links to the top-level folders."""
    modules = {}
    for folder in IMPORT_GRAPH:
        for dirpath, _dirs, files in os.walk(root / folder, followlinks=True):
            for name in sorted(files):
                path = Path(dirpath) / name
                if path.suffix != ".py" or name.endswith(("_pb2.py", "_pb2_grpc.py")):
                    continue
                parts = path.relative_to(root).with_suffix("").parts
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool,
              modules: dict[str, Path]) -> list[str]:
    """The project modules one import statement names: `from pkg import name` is pkg.name when
    that is a module, else pkg; a relative import is resolved against the importer's package."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] if node.level else [])
        base = ".".join(p for p in (base, node.module or "") if p)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    found = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != importer:
            found.append(name)
    return found


def _import_edges(root: Path) -> dict[str, dict[str, list[str]]]:
    """importer -> imported -> where ("file:line"), counting imports at every depth: module
    level, inside functions and under `if TYPE_CHECKING:`."""
    modules = _module_names(root)
    edges: dict[str, dict[str, list[str]]] = {name: {} for name in modules}
    for importer, path in modules.items():
        rel = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(node, importer, path.name == "__init__.py", modules):
                    where = edges[importer].setdefault(target, [])
                    if f"{rel}:{node.lineno}" not in where:
                        where.append(f"{rel}:{node.lineno}")
    return edges


def _strongly_connected(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm), each sorted by name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _import_cycles(root: Path) -> list[str]:
    """One paragraph per import cycle: its modules, then each edge inside it with file:line."""
    edges = _import_edges(root)
    found = []
    for component in _strongly_connected(edges):
        lines = [f"cycle: {', '.join(component)}"]
        lines += [f"  {importer} -> {target}: {', '.join(where)}"
                  for importer in component for target, where in sorted(edges[importer].items())
                  if target in component]
        found.append("\n".join(lines))
    return found


def test_no_import_cycle_anywhere() -> None:
    """No two project modules import each other, however indirectly, at any depth: a cycle
    hidden in a function or under TYPE_CHECKING is still two modules that need each other."""
    cycles = _import_cycles(ROOT)
    assert not cycles, "import cycles (move what both need to where it belongs):\n" + \
        "\n".join(cycles)


def test_the_cycle_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    package = tmp_path / "oddl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text("def f():\n    from oddl import second\n")
    (package / "second.py").write_text("def g():\n    from . import first\n")
    assert _import_cycles(tmp_path) == ["cycle: oddl.first, oddl.second\n"
                                        "  oddl.first -> oddl.second: oddl/first.py:2\n"
                                        "  oddl.second -> oddl.first: oddl/second.py:2"]
