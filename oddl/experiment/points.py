"""An experiment's points (pure): the matrix expanded in a fixed order, grouped by testbed
variant (the points that share one modified copy of the testbed file, so that it starts once),
each variant's testbed text, the line-rate bound and the estimate of the time left."""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from oddl.common.config import TestbedConfig
from oddl.common.errors import ConfigError
from oddl.experiment.spec import JOB_FACTORS, TESTBED_KNOBS, Experiment


@dataclass(frozen=True)
class Point:
    """One measurement: point `index` (its place in the expansion) at `repeat` (from 0)."""

    index: int
    repeat: int
    variant: str
    """The testbed variant it runs on (``v0``, ``v1``, …)."""
    factors: dict[str, Any]

    @property
    def key(self) -> tuple[int, int]:
        """What identifies it in a run: (index, repeat)."""
        return (self.index, self.repeat)

    @property
    def job_key(self) -> tuple[Any, ...]:
        """Points with the same job key run on one job (collective, network, hosts)."""
        return tuple(self.factors[k] for k in JOB_FACTORS)

    def label(self) -> str:
        """The point for people: its factors, shortest form."""
        return " ".join(f"{k}={v}" for k, v in self.factors.items())


@dataclass(frozen=True)
class Variant:
    """A testbed variant: the knobs it sets, by name."""

    name: str
    knobs: dict[str, float]

    def label(self) -> str:
        """``laser_tune_ms=0.5`` …, or ``as the file is``."""
        return " ".join(f"{k}={v:g}" for k, v in self.knobs.items()) or "as the file is"


def variants(exp: Experiment) -> list[Variant]:
    """Every combination of the testbed knobs' levels, in file order (one with no knobs)."""
    knobs = exp.knobs
    combos = itertools.product(*(exp.factors[k] for k in knobs))
    return [Variant(f"v{i}", dict(zip(knobs, combo, strict=True)))
            for i, combo in enumerate(combos)]


def expand(exp: Experiment) -> list[Point]:
    """Every point of the matrix times its repeats: grouped by variant (one testbed start
    each); inside a variant, repeat by repeat, each going through every point in job order
    (a job serves consecutive points). Repeats are outside the points so that a machine
    whose load drifts during the run spreads the drift over every point's repeats instead of
    biasing the points measured last. The order is fixed by the file alone, so a resumed run
    finds each point under the same index."""
    others = [k for k in exp.factors if k not in TESTBED_KNOBS]
    combos = list(itertools.product(*(exp.factors[k] for k in others)))
    points: list[Point] = []
    for v, variant in enumerate(variants(exp)):
        for r in range(exp.repeats):
            for c, combo in enumerate(combos):
                factors = {**dict(zip(others, combo, strict=True)), **variant.knobs}
                points.append(Point(v * len(combos) + c, r, variant.name, factors))
    return points


def variant_text(base_text: str, variant: Variant, path: str = "<testbed>") -> str:
    """The testbed file's text with the variant's knobs set (a knob's section is created when
    the file has none); ConfigError naming the file when it is no TOML."""
    import tomli_w

    if not variant.knobs:
        return base_text
    try:
        doc: dict[str, Any] = tomllib.loads(base_text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the testbed file") from exc
    for knob, value in variant.knobs.items():
        section = TESTBED_KNOBS[knob][0]
        doc.setdefault(section, {})[knob] = value
    header = (f"# {path} with {variant.label()} (written by `oddl experiment run`)\n")
    return header + tomli_w.dumps(doc)


def resolve_hosts(exp: Experiment, cfg: TestbedConfig) -> Experiment:
    """The experiment with hosts 0 as the testbed's node count; ConfigError naming the key
    and the fix when a level does not fit the testbed."""
    n = len(cfg.nodes)
    levels = [h or n for h in exp.factors["hosts"]]
    for hosts in levels:
        if hosts > n:
            raise ConfigError(f"{exp.path}: factors.hosts: {hosts} hosts, but {cfg.name} has "
                              f"{n} nodes; use at most {n} (0: all of them) or a larger testbed")
    if len(set(levels)) != len(levels):
        raise ConfigError(f"{exp.path}: factors.hosts: 0 means all {n} nodes of {cfg.name}, "
                          f"which is listed too; list {n} once")
    return replace(exp, factors={**exp.factors, "hosts": levels})


def line_rate_bound_s(hosts: int, size_bytes: int, line_rate_gbps: float) -> float:
    """The fastest any all-reduce of `size_bytes` can be on `hosts` nodes whose transceivers
    carry `line_rate_gbps`: 2(N−1)/N · S · 8 / B."""
    return 2 * (hosts - 1) / hosts * size_bytes * 8 / (line_rate_gbps * 1e9)


def time_left_s(durations: Sequence[float], remaining: int, starts_left: int,
                start_costs: Sequence[float], default_start_s: float = 10.0) -> float | None:
    """The estimate of the time left: the mean point so far times the points left, plus the
    mean testbed start times the starts left; None before any point has run."""
    if not durations:
        return None
    start = sum(start_costs) / len(start_costs) if start_costs else default_start_s
    return sum(durations) / len(durations) * remaining + start * starts_left


def duration_text(seconds: float | None) -> str:
    """``1 min 05 s``, ``12 s``, or ``unknown``."""
    if seconds is None:
        return "unknown"
    s = int(round(seconds))
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"
