"""`oddl schedule plot`'s picture: per node the slots it transmits in, coloured by channel."""

from __future__ import annotations

from typing import Any

from oddl.common.extras import require


def plot_schedule(sched: Any, path: str, title: str = "") -> None:
    """Draw per node (rows) the slots it transmits in over time, coloured by channel.

    Each bar is the slot's window after its guard, labelled with the destination; guards are
    grey before the window (hatched where the node's laser retunes). Guards of microseconds
    next to holds of milliseconds are drawn at least 0.4 % of the time axis wide.
    """
    require("matplotlib", "drawing a schedule")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = sched.plan.n_ranks
    span = max(sched.makespan_s, 1e-12)
    fig = Figure(figsize=(12, max(2.5, 0.35 * n + 1.5)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    _draw_rows(ax, sched, _Rows.of(ax, sched, span))
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n), [sched.nodes[r] for r in range(n)], fontsize=8 if n <= 32 else 5)
    ax.set_xlim(-0.01 * span * 1e3, 1.01 * span * 1e3)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("transmitting node")
    ax.set_title(title or f"{sched.plan.collective} on {n} nodes", fontsize=10)
    _legend(ax, sched)
    ax.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")


class _Rows:
    """Per node: its data bars and their colours, its skew-only guards and its retunes (ms)."""

    def __init__(self, n: int) -> None:
        self.data: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self.colours: list[list[Any]] = [[] for _ in range(n)]
        self.guards: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self.retunes: list[list[tuple[float, float]]] = [[] for _ in range(n)]

    @classmethod
    def of(cls, ax: Any, sched: Any, span: float) -> _Rows:
        """Collect the bars of every slot; label wide bars with their destination."""
        n = sched.plan.n_ranks
        channels = sched.topology.grid.channels
        t0 = sched.start_s
        min_guard = 0.004 * span
        cmap = _colormap(channels)
        rows = cls(n)
        label_rows = n <= 32
        for slot in sched.slots:
            movers = set(slot.src_rank[slot.retune_flows].tolist())
            width = slot.end_s - slot.data_start_s
            g = ((slot.start_s - t0) * 1e3, max(slot.guard_s, min_guard) * 1e3)
            for s, d, ch in zip(
                slot.src_rank.tolist(), slot.dst_rank.tolist(), slot.channels().tolist(),
                strict=True
            ):
                rows.data[s].append(((slot.data_start_s - t0) * 1e3, width * 1e3))
                rows.colours[s].append(_colour(cmap, ch, channels))
                (rows.retunes if s in movers else rows.guards)[s].append(g)
                if label_rows and width >= 0.02 * span:
                    ax.text((slot.data_start_s - t0 + width / 2) * 1e3, s, f"→{d}",
                            ha="center", va="center", fontsize=7)
        return rows


def _draw_rows(ax: Any, sched: Any, rows: _Rows) -> None:
    for r in range(sched.plan.n_ranks):
        if rows.data[r]:
            ax.broken_barh(rows.data[r], (r - 0.4, 0.8), facecolors=rows.colours[r],
                           edgecolor="white", linewidth=0.3)
        if rows.guards[r]:
            ax.broken_barh(rows.guards[r], (r - 0.4, 0.8), facecolors="lightgrey", zorder=3)
        if rows.retunes[r]:
            ax.broken_barh(rows.retunes[r], (r - 0.4, 0.8), facecolors="grey", hatch="////",
                           edgecolor="black", linewidth=0.3, zorder=3)


def _legend(ax: Any, sched: Any) -> None:
    from matplotlib.patches import Patch

    channels = sched.topology.grid.channels
    cmap = _colormap(channels)
    used = sorted({int(c) for slot in sched.slots for c in slot.channels().tolist()})
    handles = [Patch(facecolor=_colour(cmap, c, channels), label=f"ch{c}") for c in used[:16]]
    handles += [
        Patch(facecolor="grey", hatch="////", edgecolor="black", label="guard, laser retunes"),
        Patch(facecolor="lightgrey", label="guard, skew only"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              title="channel (= receiver)", title_fontsize=7)


def _colormap(channels: int) -> Any:
    from matplotlib import colormaps

    return colormaps["tab20" if channels <= 20 else "viridis"]


def _colour(cmap: Any, channel: int, channels: int) -> Any:
    if channels <= 20:
        return cmap((channel - 1) % 20)
    return cmap((channel - 1) / max(1, channels - 1))
