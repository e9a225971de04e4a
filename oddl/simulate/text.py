"""`oddl simulate`'s tables: one simulation (`format_table`) or a sweep (`format_sweep`)."""

from __future__ import annotations

from typing import Any


def format_table(sim: Any) -> str:
    """The simulation as a table for people."""
    from oddl.offline.simulator.core import LABELS, PAPER

    cfg = sim.config
    prof = cfg.profile
    ratios = sim.ratios()
    comm_ratios = sim.ratios(what="comm_s")
    lines = [
        f"oddl simulate — {prof.name}: {prof.params:,} parameters, "
        f"{prof.gradient_bytes(cfg.itemsize) / 1e6:.2f} MB gradient ({cfg.itemsize} B/element); "
        f"{cfg.nodes} nodes at {cfg.gbps:g} Gbit/s",
        f"compute {cfg.compute_s * 1e3:.1f} ms per iteration"
        + (" (given)" if cfg.compute_ms >= 0 else
           f" (batch {cfg.batch}, {cfg.sustained_tflops:g} TFLOP/s sustained)")
        + (f"; {cfg.overlap:.0%} of backward overlaps communication" if cfg.overlap else ""),
        "",
        f"{'system':26}{'collective':19}{'compute ms':>11}{'comm ms':>10}{'reconfig ms':>13}"
        f"{'iteration ms':>13}{'× ODDL':>8}",
    ]
    for r in sim.results:
        ratio = f"{ratios[r.system]:.2f}" if r.system in ratios else "-"
        lines.append(f"{LABELS[r.system]:26}{r.collective:19}{r.compute_s * 1e3:>11.1f}"
                     f"{r.comm_s * 1e3:>10.2f}{r.reconfig_s * 1e3:>13.3f}"
                     f"{r.iteration_s * 1e3:>13.2f}{ratio:>8}")
    setup = [f"{LABELS[r.system]} {_duration(r.setup_s)}" for r in sim.results if r.setup_s]
    if setup:
        how = (f"amortised over {cfg.amortise_iterations} iterations" if cfg.amortise_iterations
               else "not in the iteration")
        lines += ["", f"one-off per job ({how}): " + "; ".join(setup)]
    if (prof.name == PAPER["model"] and cfg.nodes == PAPER["nodes"]
            and cfg.gbps == PAPER["gbps"] and "oddl" in ratios):
        got = [f"{s} {ratios[s]:.2f}× (communication alone {comm_ratios[s]:.2f}×)"
               for s in ("fat-tree", "sip-ring") if s in ratios]
        if got:
            lines += ["", f"paper (VGG19, 1024 nodes, 100 Gbit/s): fat-tree {PAPER['fat-tree']}×, "
                      f"SiP-Ring {PAPER['sip-ring']}× slower than ODDL; this model: "
                      + ", ".join(got)]
    if "wrht" in comm_ratios and "oddl" in comm_ratios:
        lo, hi = PAPER["wrht"]
        lines += ["", f"WRHT's communication is {comm_ratios['wrht']:.2f}× ODDL's "
                  f"{cfg.collective} ({cfg.bandwidth_norm} bandwidth normalisation); WRHT paper: "
                  f"{1 - hi:.2f}–{1 - lo:.2f}× (−{lo:.2%} to −{hi:.2%}) against an "
                  "optical-system all-reduce"]
    lines.append("assumptions: docs/explanation/simulator.md")
    return "\n".join(lines)


def format_sweep(sw: Any) -> str:
    """The sweep as a table: iteration time per system (ratio to ODDL)."""
    from oddl.offline.simulator.core import LABELS

    head = sw.points[0].simulation.config
    lines = [f"oddl simulate — sweep of {sw.param}: {head.model}, iteration time in ms "
             f"(× ODDL); other parameters as in the single-point table", ""]
    width = 22
    first = max(12, len(sw.param))
    lines.append(f"{sw.param:>{first}}" + "".join(f"{s:>{width}}" for s in sw.systems))
    for p in sw.points:
        ratios = p.simulation.ratios() if p.simulation else {}
        cells = []
        for s in sw.systems:
            r = next((x for x in p.simulation.results if x.system == s), None) \
                if p.simulation else None
            if r is None:
                cells.append(f"{'n/a':>{width}}")
            else:
                ratio = f" ({ratios[s]:.2f})" if s in ratios else ""
                cells.append(f"{r.iteration_s * 1e3:.2f}{ratio}".rjust(width))
        lines.append(f"{p.value!s:>{first}}" + "".join(cells))
    notes = [f"{sw.param}={p.value}: {LABELS[s]} not simulated: {e}"
             for p in sw.points for s, e in p.errors.items()]
    if notes:
        lines += ["", *notes]
    lines.append(f"({len(sw.points)} points in {sw.elapsed_s:.2f} s; assumptions: "
                 "docs/explanation/simulator.md)")
    return "\n".join(lines)


def _duration(s: float) -> str:
    return f"{s:g} s" if s >= 1 else f"{s * 1e3:g} ms"
