"""The index's points as people read them (pure): repeats folded into one row a point with
the median, mean, standard deviation and range of each metric; two runs side by side; text
tables; CSV rows."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from oddl.experiment.index import METRICS
from oddl.experiment.spec import FACTOR_NAMES

MAIN_METRIC = {"allreduce": "time_ms", "train": "iteration_ms"}
"""The metric each kind's tables and figures lead with."""


def varied_factors(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The factors whose value differs between rows, in FACTOR_NAMES order."""
    return [f for f in FACTOR_NAMES if len({r.get(f) for r in rows}) > 1]


def fold(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row a (run, point): its factors, `n` repeats that ran, `failed` ones with their
    first error, and per metric ``<m>`` (median), ``<m>_mean``, ``<m>_std`` (0 for one
    repeat), ``<m>_min``, ``<m>_max`` over the repeats that succeeded (None: none did)."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((str(r["run_id"]), int(r["point"])), []).append(r)
    out = []
    for (run_id, point), reps in groups.items():
        ok = [r for r in reps if r["status"] == "ok"]
        row: dict[str, Any] = {"run_id": run_id, "point": point, "variant": reps[0]["variant"],
                               **{f: reps[0].get(f) for f in FACTOR_NAMES},
                               "n": len(ok), "failed": len(reps) - len(ok),
                               "error": next((r["error"] for r in reps if r["error"]), None)}
        for m in METRICS:
            values = [float(r[m]) for r in ok if r.get(m) is not None]
            row.update(_stats(m, values))
        out.append(row)
    return out


def _stats(m: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {m: None, f"{m}_mean": None, f"{m}_std": None, f"{m}_min": None,
                f"{m}_max": None}
    return {m: statistics.median(values), f"{m}_mean": statistics.fmean(values),
            f"{m}_std": statistics.stdev(values) if len(values) > 1 else 0.0,
            f"{m}_min": min(values), f"{m}_max": max(values)}


def compare(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], metric: str
            ) -> list[dict[str, Any]]:
    """Folded rows of two runs matched on every factor: `metric` of each and b / a; a point
    of one run only has None for the other."""
    def key(r: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(r.get(f) for f in FACTOR_NAMES)

    in_b = {key(r): r for r in b}
    out = []
    seen = set()
    for r in a:
        other = in_b.get(key(r))
        seen.add(key(r))
        va, vb = r.get(metric), other.get(metric) if other else None
        out.append({**{f: r.get(f) for f in FACTOR_NAMES}, "a": va, "b": vb,
                    "b_over_a": vb / va if va and vb is not None else None})
    for k, r in in_b.items():
        if k not in seen:
            out.append({**{f: r.get(f) for f in FACTOR_NAMES}, "a": None, "b": r.get(metric),
                        "b_over_a": None})
    return out


def cell(v: Any) -> str:
    """A value in a text table: floats to 4 significant digits, None as -."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned text table of `columns`."""
    cells = [[c for c in columns]] + [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    last = len(columns) - 1  # the last column (often text) is left-aligned
    return "\n".join("  ".join(v.ljust(w) if i == last else v.rjust(w)
                               for i, (v, w) in enumerate(zip(line, widths, strict=True))).rstrip()
                      for line in cells)
