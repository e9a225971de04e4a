"""`oddl experiment plot`: the standard figures from the index (matplotlib, the ``plots`` or
``experiments`` extra). Each point is the median of its repeats with a bar from the fastest
to the slowest repeat; each figure names the runs it came from in its caption, in the PNG's
metadata and in a JSON file beside it (with the folded rows it drew).

- ``sizes``: all-reduce time against message size, a line a collective and network, with the
  line-rate bound 2(N−1)/N·S/B dashed;
- ``networks``: the main metric (iteration time for train) optical against ideal, side by side;
- ``sweep``: the main metric against one factor (a testbed knob such as laser_tune_ms)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oddl.common.errors import ConfigError
from oddl.experiment.export import require_extra
from oddl.experiment.spec import FACTOR_NAMES, TESTBED_KNOBS
from oddl.experiment.summary import MAIN_METRIC, fold, varied_factors

FIGURES = ("sizes", "networks", "sweep")
Row = Mapping[str, Any]


def choose(kind: str, varied: Sequence[str], figure: str, factor: str | None
           ) -> list[tuple[str, str | None]]:
    """Which figures to draw (pure): (figure, its factor for a sweep)."""
    if figure != "auto":
        if figure == "sweep":
            factor = factor or next((f for f in varied if f in TESTBED_KNOBS), None)
            if factor is None:
                raise ConfigError("--figure sweep: the runs vary no testbed knob; name the "
                                  "factor with --factor (one of: " + ", ".join(varied) + ")")
        return [(figure, factor)]
    chosen: list[tuple[str, str | None]] = []
    if kind == "allreduce" and "size_bytes" in varied:
        chosen.append(("sizes", None))
    chosen += [("sweep", f) for f in varied if f in TESTBED_KNOBS]
    if "network" in varied or not chosen:
        chosen.append(("networks", None))
    return chosen


def series(rows: Sequence[Row], x: str, metric: str) -> dict[str, list[Row]]:
    """Folded rows as lines (pure): one a combination of the varied factors other than `x`
    (labelled ``ring optical``, ``hosts=3`` …), each sorted by `x`, points that ran only."""
    others = [f for f in varied_factors(rows) if f != x]
    lines: dict[str, list[Row]] = {}
    for r in rows:
        if r.get(metric) is None:
            continue
        label = " ".join(str(r[f]) if f in ("collective", "network") else f"{f}={r[f]}"
                         for f in others) or metric
        lines.setdefault(label, []).append(r)
    return {k: sorted(v, key=lambda r: r[x]) for k, v in lines.items()}


def caption(run_ids: Sequence[str], metric: str) -> str:
    """The figure's caption: its runs and how a point is made."""
    return (f"runs: {', '.join(run_ids)} · {metric}: median of the repeats, bars from the "
            "fastest to the slowest · oddl experiment plot")


def _errorbars(ax: Any, rows: Sequence[Row], x: str, metric: str, label: str,
               **style: Any) -> None:
    xs = [r[x] for r in rows]
    ys = [r[metric] for r in rows]
    lo = [r[metric] - r[f"{metric}_min"] for r in rows]
    hi = [r[f"{metric}_max"] - r[metric] for r in rows]
    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label, **style)


def _sizes(ax: Any, rows: Sequence[Row]) -> str:
    for label, line in series(rows, "size_bytes", "time_ms").items():
        _errorbars(ax, line, "size_bytes", "time_ms", label)
    bounds: dict[tuple[Any, Any], list[Row]] = {}
    for r in rows:
        if r.get("bound_ms") is not None:
            bounds.setdefault((r["hosts"], r["line_rate_gbps"]), []).append(r)
    for (hosts, rate), line in sorted(bounds.items()):
        line = sorted(line, key=lambda r: r["size_bytes"])
        ax.plot([r["size_bytes"] for r in line], [r["bound_ms"] for r in line], "k--", lw=1,
                label=f"line-rate bound 2(N−1)/N·S/B, N={hosts}, B={rate:g} Gbit/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("all-reduce time (ms)")
    return "time_ms"


def _networks(ax: Any, rows: Sequence[Row], metric: str) -> str:
    others = [f for f in varied_factors(rows) if f != "network"]
    groups = sorted({tuple(r[f] for f in others) for r in rows}, key=str)
    networks = sorted({r["network"] for r in rows})
    width = 0.8 / max(1, len(networks))
    for j, net in enumerate(networks):
        picked = [next((r for r in rows if r["network"] == net
                        and tuple(r[f] for f in others) == g), None) for g in groups]
        xs = [i + j * width for i, r in enumerate(picked) if r and r.get(metric) is not None]
        ok = [r for r in picked if r and r.get(metric) is not None]
        ax.bar(xs, [r[metric] for r in ok], width, label=net,
               yerr=[[r[metric] - r[f"{metric}_min"] for r in ok],
                     [r[f"{metric}_max"] - r[metric] for r in ok]], capsize=3)
    ax.set_xticks([i + width * (len(networks) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels([" ".join(f"{f}={v}" for f, v in zip(others, g, strict=True)) or "all"
                        for g in groups], fontsize=7, rotation=15)
    ax.set_ylabel(metric.replace("_ms", " (ms)"))
    return metric


def _sweep(ax: Any, rows: Sequence[Row], factor: str, metric: str) -> str:
    for label, line in series(rows, factor, metric).items():
        _errorbars(ax, line, factor, metric, label)
    xs = [r[factor] for r in rows if r.get(factor) is not None]
    if xs and min(xs) > 0 and max(xs) / min(xs) > 100:
        ax.set_xscale("log")
    ax.set_xlabel(factor)
    ax.set_ylabel(metric.replace("_ms", " (ms)"))
    return metric


def draw(runs: Sequence[Row], points: Sequence[Row], out: Path, figure: str = "auto",
         factor: str | None = None) -> list[Path]:
    """Draw the figures of these runs into `out`; the PNG files written (each with a JSON
    file of the same name naming its runs and rows)."""
    require_extra("matplotlib", "oddl experiment plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = {r["kind"] for r in runs}
    if len(kinds) != 1:
        raise ConfigError(f"the runs are of kinds {', '.join(sorted(kinds))}; plot runs of "
                          "one kind together")
    kind = kinds.pop()
    rows = fold(points)
    if factor is not None and factor not in FACTOR_NAMES:
        raise ConfigError(f"--factor {factor}: no such factor; use one of "
                          + ", ".join(FACTOR_NAMES))
    run_ids = [str(r["run_id"]) for r in runs]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fac in choose(kind, varied_factors(rows), figure, factor):
        # train: the all-reduce time beside the iteration time (what the network changes)
        metrics = [MAIN_METRIC[kind]] + (["allreduce_ms"] if kind == "train" else [])
        fig, axes = plt.subplots(1, len(metrics), figsize=(7.5 * len(metrics), 4.8),
                                 squeeze=False)
        for ax, m in zip(axes[0], metrics, strict=True):
            if name == "sizes":
                metric = _sizes(ax, rows)
            elif name == "networks":
                metric = _networks(ax, rows, m)
            else:
                assert fac is not None
                metric = _sweep(ax, rows, fac, m)
            ax.set_title(f"{runs[0]['name']}: {name}" + (f" ({fac})" if fac else "")
                         + (f", {m}" if len(metrics) > 1 else ""), fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        metric = ", ".join(metrics) if name != "sizes" else metric
        text = caption(run_ids, metric)
        fig.text(0.01, 0.005, text, fontsize=6, color="0.3")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        stem = f"{run_ids[0]}-{name}" + (f"-{fac}" if fac else "")
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=120, metadata={"Title": stem, "Description": text,
                                             "Software": "oddl experiment plot"})
        plt.close(fig)
        (out / f"{stem}.json").write_text(json.dumps(
            {"figure": name, "factor": fac, "metric": metric, "runs": run_ids,
             "caption": text, "rows": rows}, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written
