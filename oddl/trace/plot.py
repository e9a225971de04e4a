"""`oddl trace plot`: what the network did, per node — the measured twin of `oddl schedule plot`.

One row per node (from the agents' and the controller's events), time in ms from the first
event: the circuits the node's transmitter held (the controller's `circuit` spans, a thin band
at the top of the row, coloured by channel and labelled with the receiver and channel), the
slots as the gate opened them (the agents' `slot` events, in the circuit's colour), the data
actually moved (the `send` chunks, black ticks at the bottom of the row), the retunes shaded
(hatched grey, on the row of the node whose circuit the retune made: the circuit of the same
job, sequence, slot and channel; else a transmitter named `n0`, `itla-n0` or `n0-...`), the planned windows as dashed outlines (so the gate error shows), and
faults marked with red crosses.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from oddl.common.extras import require
from oddl.trace.summary import node_of, process_names

Span = tuple[float, float]


@dataclass
class _Row:
    circuits: list[tuple[float, float, int, str]] = field(default_factory=list)
    slots: list[tuple[float, float, str]] = field(default_factory=list)
    planned: list[Span] = field(default_factory=list)
    sends: list[Span] = field(default_factory=list)
    retunes: list[Span] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)


def async_spans(events: list[dict[str, Any]], cat: str) -> list[tuple[float, float, dict]]:
    """(start, end, args of the begin) of each `b`/`e` pair of `cat`, paired by id and name;
    a begin without an end lasts until the last event of the trace."""
    open_: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    out = []
    last = max((e["ts"] + e.get("dur", 0.0) for e in events if "ts" in e), default=0.0)
    for e in sorted((e for e in events if e.get("cat") == cat), key=lambda e: e["ts"]):
        key = (e.get("id"), e.get("name"))
        if e.get("ph") == "b":
            open_[key].append(e)
        elif e.get("ph") == "e" and open_[key]:
            b = open_[key].pop()
            out.append((b["ts"], e["ts"], b.get("args", {})))
    out.extend((b["ts"], last, b.get("args", {})) for bs in open_.values() for b in bs)
    return out


def select(doc: dict[str, Any], job: str | None = None, seq: int | None = None
           ) -> dict[str, Any]:
    """The part of `doc` about one job and/or one collective sequence number: its events, the
    events of no job (device commands, light, power) within their time span, and the metadata.
    Nothing given: `doc` itself. Nothing matching: a ValueError naming what exists."""
    if job is None and seq is None:
        return doc
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict)]

    def chosen(e: dict[str, Any]) -> bool:
        a = e.get("args", {})
        return ((job is None or a.get("job") == job) and (seq is None or a.get("seq") == seq)
                and "job" in a)
    mine = [e for e in events if e.get("ph") != "M" and chosen(e)]
    if not mine:
        known = sorted({(str(e["args"]["job"]), e["args"].get("seq")) for e in events
                        if isinstance(e.get("args"), dict) and "job" in e["args"]
                        and e.get("ph") != "M"}, key=str)[:12]
        raise ValueError(f"no events of job {job or 'any'} seq {seq if seq is not None else 'any'}"
                         f"; the trace holds (job, seq) {known}")
    start = min(e["ts"] for e in mine)
    end = max(e["ts"] + e.get("dur", 0.0) for e in mine)
    rest = [e for e in events if e.get("ph") == "M" or (
        "job" not in e.get("args", {}) and start <= e.get("ts", -1.0) <= end)]
    return {**doc, "traceEvents": rest + mine}


def _circuit_key(args: dict[str, Any]) -> tuple[Any, ...]:
    return (args.get("job"), args.get("seq"), args.get("slot"), args.get("channel"))


def _row_of(transmitter: str, nodes: list[str]) -> str | None:
    for n in sorted(nodes, key=len, reverse=True):
        if transmitter == n or transmitter.endswith(f"-{n}") or transmitter.startswith(f"{n}-"):
            return n
    return None


def collect_rows(doc: dict[str, Any]) -> tuple[dict[str, _Row], float]:
    """Per node the spans to draw (µs on the trace's axis), and the axis' origin."""
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict)]
    names = process_names(events)
    timed = [e for e in events if e.get("ph") != "M" and "ts" in e]
    rows: dict[str, _Row] = defaultdict(_Row)
    made_by: dict[tuple[Any, ...], str] = {}  # (job, seq, slot, channel) → the circuit's src
    for start, end, args in async_spans(timed, "circuit"):
        rows[str(args.get("src"))].circuits.append((start, end, int(args.get("channel", -1)),
                                                    str(args.get("dst"))))
        made_by[_circuit_key(args)] = str(args.get("src"))
    for start, end, args in async_spans(timed, "plan"):
        rows[str(args.get("node"))].planned.append((start, end - start))
    for ev in timed:
        _add_event(rows, node_of(names.get(ev.get("pid"), "")), ev)
    nodes = list(rows)
    for ev in timed:
        if ev.get("cat") == "retune" and ev.get("ph") == "X":
            args = ev.get("args", {})
            row = made_by.get(_circuit_key(args)) or _row_of(str(args.get("transmitter")), nodes)
            if row is not None:
                rows[row].retunes.append((ev["ts"], ev.get("dur", 0.0)))
    t0 = min((s for r in rows.values() for s, *_ in (r.circuits + r.slots + r.sends)),
             default=min((e["ts"] for e in timed), default=0.0))
    return dict(rows), t0


def _add_event(rows: dict[str, _Row], node: str, ev: dict[str, Any]) -> None:
    cat, args = ev.get("cat"), ev.get("args", {})
    if cat == "slot" and ev.get("ph") == "X":
        rows[node].slots.append((ev["ts"], ev.get("dur", 0.0), str(args.get("peer"))))
    elif cat == "chunk" and ev.get("name") == "send":
        rows[node].sends.append((ev["ts"], ev.get("dur", 0.0)))
    elif cat == "fault":
        rows[node].faults.append((ev["ts"], str(ev.get("name"))))


def _channel_at(row: _Row, start: float, peer: str) -> int | None:
    for s, e, ch, dst in row.circuits:
        if dst == peer and s <= start < e:
            return ch
    return None


def _slot_colour(row: _Row, start: float, peer: str, colour: dict[int, Any]) -> Any:
    ch = _channel_at(row, start, peer)
    return "lightsteelblue" if ch is None else colour[ch]


def plot_timeline(doc: dict[str, Any], path: str, title: str = "") -> int:
    """Draw the timeline of `doc` into the PNG `path`; return the number of node rows."""
    require("matplotlib", "drawing a timeline")
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows, t0 = collect_rows(doc)
    nodes = sorted(rows)
    span = max((s + d for r in rows.values() for s, d, *_ in r.slots), default=t0 + 1.0) - t0
    channels = sorted({c[2] for r in rows.values() for c in r.circuits})
    cmap = colormaps["tab20"]
    colour = {ch: cmap(i % 20) for i, ch in enumerate(channels)}
    fig = Figure(figsize=(12, max(2.5, 0.6 * len(nodes) + 1.5)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for y, node in enumerate(nodes):
        _draw_row(ax, y, rows[node], t0, colour, label_from=0.03 * span)
    ax.set_ylim(len(nodes) - 0.5, -0.5)
    ax.set_yticks(range(len(nodes)), nodes, fontsize=8)
    ax.set_xlabel("time (ms) from the first circuit, slot or chunk")
    ax.set_ylabel("node")
    ax.set_title(title or "measured timeline: circuits, slots, data moved, retunes", fontsize=10)
    handles = [_patch(colour[ch], f"ch {ch}") for ch in channels]
    handles += [_patch("none", "planned window", edge="dimgrey"),
                _patch("none", "retune", hatch="////", edge="grey"),
                _patch("black", "data sent")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return len(nodes)


def _patch(colour: Any, label: str, hatch: str | None = None, edge: Any = None) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, label=label, hatch=hatch, edgecolor=edge,
                 linestyle="--" if edge == "dimgrey" else "-")


def _ms(span: Span, t0: float) -> Span:
    return ((span[0] - t0) / 1e3, max(span[1], 0.0) / 1e3)


def _draw_row(ax: Any, y: int, row: _Row, t0: float, colour: dict[int, Any],
              label_from: float) -> None:
    """One node's row; circuits at least `label_from` µs long are labelled."""
    if row.circuits:
        ax.broken_barh([_ms((s, e - s), t0) for s, e, _c, _d in row.circuits], (y - 0.45, 0.15),
                       facecolors=[colour[c] for _s, _e, c, _d in row.circuits])
        for s, e, ch, dst in row.circuits:
            if e - s >= label_from:
                ax.text((s - t0) / 1e3, y - 0.47, f"→{dst} ch {ch}", fontsize=6, va="bottom")
    if row.slots:
        ax.broken_barh([_ms((s, d), t0) for s, d, _p in row.slots], (y - 0.28, 0.5),
                       facecolors=[_slot_colour(row, s, p, colour) for s, _d, p in row.slots],
                       alpha=0.7, edgecolor="white")
    if row.planned:
        ax.broken_barh([_ms(s, t0) for s in row.planned], (y - 0.28, 0.5), facecolors="none",
                       edgecolor="dimgrey", linestyle="--", linewidth=0.8, zorder=2)
    if row.sends:
        ax.broken_barh([_ms(s, t0) for s in row.sends], (y + 0.25, 0.18), facecolors="black")
    if row.retunes:
        ax.broken_barh([_ms(s, t0) for s in row.retunes], (y - 0.45, 0.9), facecolors="none",
                       edgecolor="grey", hatch="////", zorder=3)
    for ts, _name in row.faults:
        ax.plot([(ts - t0) / 1e3], [y], marker="x", color="red", zorder=4)
