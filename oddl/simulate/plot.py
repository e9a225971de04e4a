"""`oddl simulate --plot`: a sweep's curves (and ratios to ODDL) or one simulation's bars."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oddl.common.extras import require


def _log_if_wide(ax: Any) -> None:
    """Log y axis when the plotted values span more than a factor of 100."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]
    if ys and max(ys) / min(ys) > 100:
        ax.set_yscale("log")


def _paper_marks(ax: Any, systems: Sequence[str]) -> None:
    """The papers' figures on the ratio axis: ODDL's 1.6× (fat-tree) and 1.7× (SiP-Ring);
    WRHT's 0.19–0.24× (communication against an optical-system all-reduce)."""
    from oddl.offline.simulator.core import PAPER

    for s, colour in (("fat-tree", "tab:red"), ("sip-ring", "tab:purple")):
        if s in systems:
            ax.axhline(PAPER[s], color=colour, lw=0.8, ls=":",
                       label=f"ODDL paper: {s} {PAPER[s]}×")
    if "wrht" in systems:
        lo, hi = PAPER["wrht"]
        ax.axhspan(1 - hi, 1 - lo, color="tab:green", alpha=0.15,
                   label="WRHT paper: −75.6…−80.8 % (communication)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def plot(result: Any, path: str) -> None:
    """Draw a sweep (iteration time and ratio to ODDL) or one simulation (stacked bars)."""
    require("matplotlib", "drawing a simulation")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from oddl.offline.simulator.engine import Sweep

    fig = _plot_sweep(plt, result) if isinstance(result, Sweep) else _plot_bars(plt, result)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_sweep(plt: Any, result: Any) -> Any:
    """Iteration time per system over the swept values, and its ratio to ODDL below."""
    from oddl.offline.simulator.core import LABELS

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    numeric = all(isinstance(v, int | float) for v in result.values)
    xs: list[Any] = list(result.values) if numeric else list(range(len(result.values)))
    base = result.series("oddl") if "oddl" in result.systems else None
    for i, s in enumerate(result.systems):
        style = {"marker": "os^vDx"[i % 6], "linestyle": ("-", "--", ":", "-.")[i % 4]}
        ys = result.series(s)
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], label=LABELS[s], **style)
        if base is not None:
            rs = [(x, y / b) for x, y, b in zip(xs, ys, base, strict=True)
                  if y is not None and b]
            if rs:
                ax2.plot([p[0] for p in rs], [p[1] for p in rs], label=LABELS[s], **style)
    if numeric and min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    _log_if_wide(ax)
    _log_if_wide(ax2)
    _paper_marks(ax2, result.systems)
    if not numeric:
        ax2.set_xticks(xs, [str(v) for v in result.values])
    ax.set_ylabel("iteration time (ms)")
    head = next(p.simulation for p in result.points if p.simulation is not None).config
    what = f"{head.message_mb:g} MB" if head.message_mb > 0 else head.model
    ax.set_title(f"{what}, {head.nodes} nodes: sweep of {result.param}"
                 + (" (communication only)" if head.compute_ms == 0 else ""))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax2.set_ylabel("× ODDL")
    ax2.set_xlabel(result.param)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.grid(alpha=0.3)
    return fig


def _plot_bars(plt: Any, result: Any) -> Any:
    """One simulation: per system a bar of compute, communication and reconfiguration."""
    from oddl.offline.simulator.core import LABELS

    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [LABELS[r.system] for r in result.results]
    comp = [r.compute_s * 1e3 for r in result.results]
    reconf = [r.reconfig_s * 1e3 for r in result.results]
    rest = [(r.iteration_s - r.compute_s - r.reconfig_s) * 1e3 for r in result.results]
    ax.barh(names, comp, label="compute")
    ax.barh(names, rest, left=comp, label="communication")
    ax.barh(names, reconf, left=[a + b for a, b in zip(comp, rest, strict=True)],
            label="reconfiguration")
    cfg = result.config
    ax.set_xlabel("iteration time (ms)")
    ax.set_title(f"{cfg.model}, {cfg.nodes} nodes, {cfg.gbps:g} Gbit/s")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    return fig
