"""The experiment file: what a validated experiment is, and its parsing (pure: text in,
dataclasses out; every error names the file, the key and the fix, as the testbed file's do).

    [experiment]
    name = "allreduce-sizes"          # the run folders' and the index's name
    testbed = "emulated-4node"        # a shipped testbed name, or a path (relative: to this file)
    kind = "allreduce"                # or "train" (the demo's numpy MLP through the agents)
    repeats = 3

    [factors]                         # each key: one value or a list of values
    collective = ["ring", "halving-doubling"]
    network = ["optical", "ideal"]
    size_bytes = [4096, 1048576]      # allreduce; train: params, iterations
    laser_tune_ms = [0.001, 2.0]      # a testbed knob: one modified copy of the file a value
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from oddl.common.config.reader import REQUIRED, TableReader
from oddl.common.config.schema import TimingConfig, as_table
from oddl.common.errors import ConfigError

KINDS = ("allreduce", "train")
COLLECTIVES = ("ring", "halving-doubling", "wrht", "totientperms", "parameter-server",
               "topoopt", "optinc")
"""The collectives a job may name (oddl.controller.admission.known_collectives)."""
NETWORKS = ("optical", "ideal", "circuit")

TESTBED_KNOBS: dict[str, tuple[str, float | None]] = {
    **{name: ("timing", 0.0) for name in as_table(TimingConfig())},
    "line_rate_gbps": ("fabric", None)}
"""Factors that change the testbed file: knob → (its section, the lowest value; None: > 0)."""

JOB_FACTORS = ("collective", "network", "hosts")
KIND_FACTORS = {"allreduce": ("size_bytes",), "train": ("params", "iterations")}
FACTOR_NAMES = (*JOB_FACTORS, "size_bytes", "params", "iterations", *TESTBED_KNOBS)
"""Every factor an experiment may sweep, in the order the index's columns take."""

DEFAULTS: dict[str, list[Any]] = {"collective": ["ring"], "network": ["optical"], "hosts": [0],
                                  "params": [100_000], "iterations": [10]}
"""A factor the file leaves out takes these levels (hosts 0: every node of the testbed)."""

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class Experiment:
    """A validated experiment file."""

    path: str
    name: str
    testbed: str
    kind: str
    factors: dict[str, list[Any]]
    """Every factor of the kind with its levels (a value the file gave, or DEFAULTS)."""
    repeats: int = 1
    calls: int = 5
    """allreduce: timed all-reduces per repeat (the repeat's value is their median)."""
    warmup: int = 1
    description: str = ""
    text: str = field(default="", repr=False)
    """The file's text, as it is stored in the run folder."""

    @property
    def varied(self) -> list[str]:
        """The factors with more than one level, in file order."""
        return [k for k, v in self.factors.items() if len(v) > 1]

    @property
    def knobs(self) -> list[str]:
        """The testbed knobs the experiment sets."""
        return [k for k in self.factors if k in TESTBED_KNOBS]


def parse_experiment(text: str, path: str = "<experiment>") -> Experiment:
    """Validate the text of an experiment file; ConfigError names the file, key and fix."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax at that line") from exc
    read = TableReader(path)
    for section in doc:
        if section not in ("experiment", "factors"):
            near = difflib.get_close_matches(section, ["experiment", "factors"], n=1)
            hint = f"did you mean [{near[0]}]?" if near else "sections: experiment, factors"
            raise read.fail(section, "unknown section", f"remove it ({hint})")
    head = read.table(doc.get("experiment"), "experiment", {
        "name": (_name(read), REQUIRED), "description": (read.text(), ""),
        "testbed": (read.text(), REQUIRED), "kind": (read.text(KINDS), REQUIRED),
        "repeats": (read.integer(1, 1000), 1), "calls": (read.integer(1, 10_000), 5),
        "warmup": (read.integer(0, 100), 1)})
    factors = _factors(read, doc.get("factors"), head["kind"])
    return Experiment(path, head["name"], head["testbed"], head["kind"], factors,
                      head["repeats"], head["calls"], head["warmup"], head["description"], text)


def _name(read: TableReader) -> Any:
    def conv(v: Any, key: str) -> str:
        name = read.text()(v, key)
        if not NAME.match(name):
            raise read.fail(key, f"{name!r} is not a plain name",
                            "use lower-case letters, digits, - and _ (it names folders)")
        return name
    return conv


def _factors(read: TableReader, raw: Any, kind: str) -> dict[str, list[Any]]:
    """The [factors] table: every key known for `kind`, each value a non-empty list of
    distinct valid levels."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise read.fail("factors", f"expected a table, got {type(raw).__name__}",
                        "write it as [factors] with name = [values] lines")
    allowed = [*JOB_FACTORS, *KIND_FACTORS[kind], *TESTBED_KNOBS]
    for name in raw:
        if name not in allowed:
            other = next((k for k, v in KIND_FACTORS.items() if name in v), None)
            if other is not None:
                fix = f"remove it, or set kind = \"{other}\" (it is a factor of {other} only)"
            else:
                near = difflib.get_close_matches(name, allowed, n=1)
                fix = (f"remove it (did you mean {near[0]!r}?)" if near
                       else f"remove it (factors of {kind}: {', '.join(allowed)})")
            raise read.fail(f"factors.{name}", "unknown factor", fix)
    if kind == "allreduce" and "size_bytes" not in raw:
        raise read.fail("factors.size_bytes", "missing",
                        "add size_bytes = [4096, 1048576] (message sizes in bytes) to [factors]")
    out: dict[str, list[Any]] = {}
    for name in [*JOB_FACTORS, *KIND_FACTORS[kind]]:
        out[name] = _levels(read, raw.get(name, DEFAULTS.get(name)), f"factors.{name}")
    for name in raw:
        if name in TESTBED_KNOBS:
            out[name] = _levels(read, raw[name], f"factors.{name}")
    return out


def _levels(read: TableReader, raw: Any, key: str) -> list[Any]:
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise read.fail(key, "an empty list", "give at least one value, or leave the key out")
    check = _LEVEL_CHECKS.get(key.split(".", 1)[1], _knob)
    levels = [check(read, v, key) for v in values]
    if len(set(levels)) != len(levels):
        dup = next(v for v in levels if levels.count(v) > 1)
        raise read.fail(key, f"{dup!r} is listed twice", "list each value once (use repeats "
                        "to measure a point more than once)")
    return levels


def _collective(read: TableReader, v: Any, key: str) -> str:
    return read.text(COLLECTIVES)(v, key)


def _network(read: TableReader, v: Any, key: str) -> str:
    return read.text(NETWORKS)(v, key)


def _hosts(read: TableReader, v: Any, key: str) -> int:
    n = read.integer()(v, key)
    if n != 0 and n < 2:
        raise read.fail(key, f"{n} hosts", "use 2 or more (0: every node of the testbed)")
    return n


def _size(read: TableReader, v: Any, key: str) -> int:
    n = read.integer(4, 1 << 34)(v, key)
    if n % 4:
        raise read.fail(key, f"{n} bytes is not a whole number of int32 elements",
                        f"use a multiple of 4, e.g. {n - n % 4 or 4}")
    return n


def _positive_int(read: TableReader, v: Any, key: str) -> int:
    return read.integer(1)(v, key)


def _knob(read: TableReader, v: Any, key: str) -> float:
    lowest = TESTBED_KNOBS[key.split(".", 1)[1]][1]
    if lowest is None:
        return read.num(positive=True)(v, key)
    return read.num(lowest)(v, key)


_LEVEL_CHECKS = {"collective": _collective, "network": _network, "hosts": _hosts,
                 "size_bytes": _size, "params": _positive_int, "iterations": _positive_int}
