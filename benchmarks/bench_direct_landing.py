"""Chunks read straight into the bucket (decision record 0039), with and without, against gloo.

Runs `bench_zero_copy.py` (`dist.all_reduce`, adopted and copy paths) and
`bench_torch_collectives.py` (all_gather, reduce_scatter) with the agents' direct landing off
(``ODDL_DIRECT_LANDING=0``) and on, alternating for `--rounds` rounds, each run against gloo
in its own run, and prints every run's × gloo side by side: the machine's noise shows as the
spread between rounds of the same setting.

    python benchmarks/bench_direct_landing.py [--sizes-mb 16,64] [--repeats 7] [--rounds 2]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SETTINGS = (("without", "0"), ("with", "1"))


def _run(script: str, sizes: str, repeats: int, landing: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(HERE / script), "--sizes-mb", sizes,
                           "--repeats", str(repeats), "--json"], capture_output=True, text=True,
                          timeout=1800, cwd=HERE,
                          env={**os.environ, "ODDL_DIRECT_LANDING": landing})
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratios(zero_copy: dict[str, Any], collectives: dict[str, Any]) -> dict[str, float]:
    """Each measured row as one × gloo figure, keyed by what it measures."""
    out: dict[str, float] = {}
    for r in zero_copy["rows"]:
        out[f"all_reduce adopted {r['size_mb']:g} MB"] = r["adopted_x_gloo"]
        out[f"all_reduce copy {r['size_mb']:g} MB"] = r["copy_x_gloo"]
    for r in collectives["rows"]:
        out[f"{r['kind']} {r['size_mb']:g} MB"] = r["oddl_x_gloo"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="16,64")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in SETTINGS}
    for _ in range(args.rounds):
        for name, value in SETTINGS:
            runs[name].append(_ratios(
                _run("bench_zero_copy.py", args.sizes_mb, args.repeats, value),
                _run("bench_torch_collectives.py", args.sizes_mb, args.repeats, value)))
    load = os.getloadavg()
    summary = {"bench": "direct_landing", "repeats": args.repeats, "rounds": args.rounds,
               "load": [round(x, 2) for x in load], "x_gloo": runs}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"× gloo, 4 ranks, ring on direct links, median of {args.repeats}, rounds alternating "
          f"without / with direct landing (load at the end {load[0]:.2f})")
    for key in runs["without"][0]:
        cells = "  ".join(f"{name} " + " ".join(f"{run[key]:.2f}" for run in runs[name])
                          for name, _ in SETTINGS)
        print(f"  {key:<28} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
