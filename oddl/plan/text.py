"""`oddl plan`'s terminal text: `format_text` renders `oddl.plan.describe.describe`'s dict."""

from __future__ import annotations

from typing import Any


def mb(n: float) -> str:
    """Bytes as megabytes (10⁶ B), two decimals."""
    return f"{n / 1e6:.2f} MB"


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}{'' if k == 1 else 's'}"


def ms(s: float) -> str:
    """Seconds as milliseconds, three decimals."""
    return f"{s * 1e3:.3f} ms"


def format_text(d: dict[str, Any]) -> str:
    """Render `describe`'s dict for a terminal."""
    lines = _header(d)
    if "wavelength_plan" in d:
        lines += _wrht_lines(d["wavelength_plan"])
    if "topology" in d:
        t = d["topology"]
        lines.append(
            f"  TotientPerms degree {t['degree']}: jumps {t['jumps']}, diameter {t['diameter']}; "
            f"all-reduce rings {t['rings']}"
        )
    lines += _step_lines(d["step_list"]) if "step_list" in d else _phase_lines(d["phases"])
    return "\n".join(lines)


def _header(d: dict[str, Any]) -> list[str]:
    params = ", ".join(f"{k}={v}" for k, v in d["params"].items())
    return [
        f"{d['collective']}{'' if ' ' in d['collective'] else ' all-reduce'} on "
        f"{d['nodes']} nodes"
        f"{f' ({params})' if params else ''}: {d['steps']} steps, {d['slots']} slots, "
        f"{d['reconfigurations']} reconfigurations (transmitter retunes)",
        f"  buffer {mb(d['bytes'])} ({d['elements']:,} x {d['itemsize']} B) at "
        f"{d['line_rate_gbps']:g} Gbit/s; retune guard {d['retune_guard_s'] * 1e6:.2f} us",
        f"  makespan {ms(d['makespan_s'])}, guard total {d['guard_total_s'] * 1e6:.2f} us, "
        f"efficiency {d['efficiency']:.5f}",
        f"  bytes sent per node: min {mb(d['bytes_sent']['min'])}, max "
        f"{mb(d['bytes_sent']['max'])}, mean {mb(d['bytes_sent']['mean'])}",
    ]


def _wrht_lines(wp: dict[str, Any]) -> list[str]:
    ring = "bidirectional" if wp["bidirectional"] else "unidirectional"
    lines = [
        f"  WRHT ring: W={wp['wavelengths']}, group size m={wp['group_size']}, {ring}; "
        f"wavelengths needed {wp['wavelengths_needed']} (reused by every group)"
    ]
    for s in wp["steps"]:
        lines.append(
            f"    step {s['step']}: {s['phase']} level {s['level']}, "
            f"{_n(s['groups'], 'group')} of <= {s['largest_group']} nodes, "
            f"{_n(s['wavelengths'], 'wavelength')}, longest path "
            f"passes {s['max_hops']} nodes, loss {s['loss_db']:.2f} dB, slack "
            f"{s['slack_db']:.2f} dB"
        )
    return lines


def _step_lines(step_list: list[dict[str, Any]]) -> list[str]:
    lines = []
    for st in step_list:
        size = (
            mb(st["bytes_min"])
            if st["bytes_min"] == st["bytes_max"]
            else f"{st['bytes_min']:,}..{st['bytes_max']:,} B"
        )
        lines.append(
            f"step {st['step']}  {st['phase'] or st['op']}  {st['op'].upper()}  "
            f"{_n(st['transfers'], 'transfer')} of {size} -> {_n(len(st['slots']), 'slot')}"
        )
        for sl in st["slots"]:
            circuits = "  ".join(
                f"{c['src']}->{c['dst']} ch{c['channel']}{'*' if c['retune'] else ''}"
                for c in sl["circuits"]
            )
            retuned = f"  ({_n(sl['retunes'], 'retune')})" if sl["retunes"] else ""
            lines.append(f"  slot {sl['slot']:<3} t={ms(sl['start_s'])}  {circuits}{retuned}")
    lines.append("(* = the transmitter retunes at the start of the slot)")
    return lines


def _phase_lines(phases: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'phase':<22}{'steps':>7}{'slots':>8}{'transfers':>11}{'MB':>12}{'retunes':>9}"]
    for p in phases:
        lines.append(
            f"{p['phase']:<22}{p['steps']:>7}{p['slots']:>8}{p['transfers']:>11}"
            f"{p['bytes'] / 1e6:>12.2f}{p['retunes']:>9}"
        )
    return lines
