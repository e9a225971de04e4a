"""The text form of `oddl trace summary` (the `--json` form is the dict itself)."""

from __future__ import annotations

from typing import Any

from oddl.trace.summary import GUARD_PARTS


def _us(v: Any) -> str:
    return "-" if v is None else f"{v:,.1f} µs"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def format_summary(s: dict[str, Any], source: str) -> str:
    """Collectives, slots, guards, faults and totals as aligned text."""
    t = s["totals"]
    lines = [f"{source}: testbed {s['testbed'] or '?'}; {t['collectives']} collectives, "
             f"{t['slots']} slots, {t['retunes']} retunes; "
             f"{s['dropped'] or 0} events dropped by the recorders"]
    if s["collectives"]:
        lines += ["", "collectives:",
                  f"  {'job':<10} {'seq':>4} {'collective':<22} {'bytes':>12} {'time':>14} "
                  f"{'slots':>5} {'max gate err':>13} {'util':>7} late lost overrun"]
        for c in s["collectives"]:
            lines.append(f"  {c['job']!s:<10} {c['seq']!s:>4} "
                         f"{(c['collective'] or '') + ' ' + (c['kind'] or ''):<22} "
                         f"{c['bytes'] or 0:>12,} {_us(c['duration_us']):>14} {c['slots']:>5} "
                         f"{_us(c['gate_error_max_us']):>13} {_pct(c['utilisation']):>7} "
                         f"{c['late_chunks']:>4} {c['lost_chunks']:>4} {c['overruns']:>7}")
    if s["slots"]:
        lines += ["", "slots (planned start → gate open, data / slot):",
                  f"  {'job':<10} {'seq':>4} {'node':<6} {'step':>4} {'peer':<6} "
                  f"{'gate error':>12} {'data':>14} {'slot':>14} {'util':>7}"]
        for sl in s["slots"]:
            lines.append(f"  {sl['job']!s:<10} {sl['seq']!s:>4} {sl['node']:<6} "
                         f"{sl['step']!s:>4} {sl['peer']!s:<6} {_us(sl['gate_error_us']):>12} "
                         f"{_us(sl['data_us']):>14} {_us(sl['slot_us']):>14} "
                         f"{_pct(sl['utilisation']):>7}")
    if s["guards"]:
        lines += ["", "guard time of retune slots (edge → grant) and what it went to:",
                  f"  {'job':<10} {'seq':>4} {'slot':>4} {'guard':>12} "
                  + " ".join(f"{p:>11}" for p in GUARD_PARTS)]
        for g in s["guards"]:
            lines.append(f"  {g['job']!s:<10} {g['seq']!s:>4} {g['slot']!s:>4} "
                         f"{_us(g['guard_us']):>12} "
                         + " ".join(f"{_us(g[p + '_us']):>11}" for p in GUARD_PARTS))
    if s["faults"]:
        lines += ["", "faults:"]
        lines += [f"  {f['fault']:<10} at {f['node']} job {f['job']} seq {f['seq']} step "
                  f"{f['step']} peer {f['peer']} by {_us(f['by_us'])}" for f in s["faults"]]
    lines += ["", "totals:",
              f"  gate error mean {_us(t['gate_error_mean_us'])}, max "
              f"{_us(t['gate_error_max_us'])}; utilisation {_pct(t['utilisation'])}; "
              f"{t['bytes_sent']:,} bytes sent",
              f"  guard {_us(t['guard_us'])}: "
              + ", ".join(f"{p} {_us(t[f'guard_{p}_us'])}" for p in GUARD_PARTS),
              f"  late chunks {t['late_chunks']} (late receptions {t['late_receptions']}), "
              f"lost chunks {t['lost_chunks']}, overruns {t['overruns']}"]
    return "\n".join(lines)
