"""The reliability runs as markdown for docs/results.md: the lab rehearsal (lab.json, from
`make lab` measured by bench_lab.py) and the soaks (soak*.json, from benchmarks/soak.py).
benchmarks/report.py puts them beside the last `make bench`."""

from __future__ import annotations

from typing import Any


def _seconds(value: float | None) -> str:
    return "nothing failed" if value is None else f"{value:.2f} s"


def lab_tables(data: dict[str, Any]) -> list[str]:
    """The lab rehearsal (`make lab`, measured by bench_lab.py): checks, faults, all-reduce."""
    checks = data["checks"]
    passed = sum(1 for check in checks if check["ok"])
    lines = ["### The lab rehearsal (lab.json)", "",
             f"Run {data['time']}: `make lab`, measured by `python benchmarks/bench_lab.py`; "
             f"{passed} of {len(checks)} checks passed.", "",
             "| fault | first failure after | exact again after the repair | all agents alive "
             "after | calls exact / wrong / failed with a reason |", "|---|---|---|---|---|"]
    for name, fault in data["measurements"]["faults"].items():
        lines.append(f"| {name} | {_seconds(fault['detect_s'])} | {fault['recover_s']:.2f} s | "
                     f"{fault['all_alive_after_s']:.2f} s | {fault['exact']} / "
                     f"**{fault['wrong']}** / {fault['failed']} |")
    lines += ["", "| all-reduce on the rig | first call | median of the rest | line-rate "
              "bound 2(N−1)/N · S · 8 / 1 Gbit/s | rest / bound | rest / (TCP payload bound "
              "+ retune guards) | rest / gloo's |", "|---|---|---|---|---|---|---|"]
    for row in data["measurements"]["allreduce"]:
        guarded = (f"×{row['ratio_guarded']:.2f}" if "ratio_guarded" in row else "-")
        gloo = f"×{row['ratio_gloo']:.2f}" if "ratio_gloo" in row else "-"
        lines.append(f"| {row_label(row)}, {row['size_mb']} MB | {row['first_s'] * 1e3:.0f} ms"
                     f" | {row['rest_s'] * 1e3:.0f} ms | {row['bound_s'] * 1e3:.0f} ms | "
                     f"×{row['ratio']:.2f} | {guarded} | {gloo} |")
    return lines


def row_label(row: dict[str, Any]) -> str:
    """A measured row's name, saying which path a `dist.all_reduce` row ran on."""
    if "rank_path" not in row:
        return str(row["collective"])
    return f"{row['collective']} ({'rank path' if row['rank_path'] else 'agent path'})"


SOAK_FAULTS = {
    "agent-kill": "agent SIGKILL, restarted 1 s later",
    "agent-stall": "agent SIGSTOP 2 s",
    "agent-pause": "agent SIGSTOP 0.2 s",
    "stream-cut": "a node's TCP data streams destroyed (`ss -K`)",
    "controller-kill": "controller SIGKILL, restarted from its state file",
    "emulators-kill": "emulator host SIGKILL (every laser, switch and meter, the light), "
                      "restarted 1 s later in its power-on state",
}
"""What each fault kind of benchmarks/soak.py does, as its docstring says."""


def soak_tables(name: str, data: dict[str, Any]) -> list[str]:
    """One soak run: its command, what ran and failed, and each fault's detection and recovery."""
    lines = [f"### Soak ({name})", "", f"Command: `{data['command']}`; "
             f"{data['seconds'] / 60:.0f} minutes.", "", "| collectives | |", "|---|---|",
             f"| run / exact / failed with a reason | {data['collectives']:,} / "
             f"{data['completed']:,} / {data['failed_with_reason']:,} |",
             f"| wrong results | **{data['wrong_results']}** |",
             f"| failures without a reason | **{data['unclear_failures']}** |",
             f"| state lost over {data['controller_restarts']} controller restarts | "
             f"{', '.join(data['state_lost']) or '**none**'} |", "",
             "| fault | count | detected after (median / max) | back to exact results "
             "(median / max) | not recovered |", "|---|---|---|---|---|"]
    for fault, got in data["faults"].items():
        detected = ("nothing failed" if got["detect_s_median"] is None
                    else f"{got['detect_s_median']:.2f} / {got['detect_s_max']:.2f} s")
        lines.append(f"| {SOAK_FAULTS.get(fault, fault)} (`{fault}`) | {got['count']} | {detected} | {got['recover_s_median']:.2f} / "
                     f"{got['recover_s_max']:.2f} s | {got['not_recovered']} |")
    return lines

