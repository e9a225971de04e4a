"""The lab rig's measurements (issue 23, item 4): `python benchmarks/bench_lab.py` as root.

Runs the whole rehearsal (`python -m lab --bench`, docs/how-to/lab-bring-up.md) and prints ring and
halving-doubling all-reduce at 1, 16 and 64 MB against the line-rate bound of the rig's
1 Gbit/s tbf links, 2(N-1)/N * S * 8 / rate, the bound for TCP payload at the MTU (and that
plus the retune guards of the job's schedule), and torch's gloo backend on the same hosts and
links (a new torchrun per size), the first call of a new size against the rest,
and the time to detect and to recover from each fault. Writes benchmarks/results/lab.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab.rehearse import main as rehearse  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from report_reliability import row_label  # noqa: E402


def _s(value: Any) -> str:
    return "-" if value is None else f"{value:.2f} s"


def table(report: dict[str, Any]) -> str:
    m = report.get("measurements", {})
    lines = ["| all-reduce | size | time (median of 4 after the first) | × line-rate bound "
             "| × TCP payload bound at the MTU | × (TCP bound + retune guards) | × gloo "
             "| first call | first − rest (gloo's) |", "|---|---|---|---|---|---|---|---|---|"]
    for row in m.get("allreduce", []):
        tcp = (f"×{row['ratio_tcp']:.2f} (MTU {row['mtu']}, {row['tcp_bound_s'] * 1e3:.0f} ms)"
               if "ratio_tcp" in row else "-")
        guarded = (f"×{row['ratio_guarded']:.2f} (guards {row['guard_s'] * 1e3:.0f} ms)"
                   if "ratio_guarded" in row else "-")
        gloo = f"×{row['ratio_gloo']:.2f}" if "ratio_gloo" in row else "-"
        gloo_first = (f" ({row['gloo_first_over_rest_s'] * 1e3:+.0f} ms)"
                      if "gloo_first_over_rest_s" in row else "")
        lines.append(f"| {row_label(row)} | {row['size_mb']} MB | {row['rest_s'] * 1e3:.0f} ms "
                     f"| ×{row['ratio']:.2f} (bound {row['bound_s'] * 1e3:.0f} ms) | {tcp} "
                     f"| {guarded} | {gloo} | {row['first_s'] * 1e3:.0f} ms "
                     f"| {row['first_over_rest_s'] * 1e3:+.0f} ms{gloo_first} |")
    lines += ["", "| fault | first failure after | exact again after the repair | all agents "
              "alive after | calls exact / wrong / failed |", "|---|---|---|---|---|"]
    for name, f in m.get("faults", {}).items():
        lines.append(f"| {name} | {_s(f.get('detect_s'))} | {_s(f.get('recover_s'))} | "
                     f"{_s(f.get('all_alive_after_s'))} | {f['exact']} / {f['wrong']} / "
                     f"{f['failed']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "lab.json"))
    p.add_argument("--mtu", type=int, default=1500, help="the rig's links' MTU")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.json"
        code = rehearse(["--bench", "--json", str(path), "--mtu", str(args.mtu)])
        if code == 2 or not path.exists():
            return code
        report = json.loads(path.read_text(encoding="utf-8"))
    report["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(table(report))
    print(f"written to {args.json}")
    return code


if __name__ == "__main__":
    sys.exit(main())
