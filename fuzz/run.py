"""`make fuzz`: coverage-guided fuzzing of every parser (atheris + libFuzzer).

    python fuzz/run.py                         # every target, 10^5 inputs each (or 300 s)
    python fuzz/run.py --targets local-api,testbed-file --runs 1000000 --max-time 600
    python fuzz/run.py --list

Each target runs in a process of its own (atheris instruments the loaded Python code and
libFuzzer steers the inputs towards new branches); the corpus is kept under
fuzz/corpus/<target> so later runs start where earlier ones stopped, and a crashing input is
written to fuzz/crashes/. The report gives, per target, the inputs run, the seconds, the
crashes and the coverage libFuzzer reached (edges and features of the instrumented code).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _one(name: str, runs: int, max_time: int, corpus: Path, crashes: Path) -> int:
    """Fuzz one target in this process (called in a child)."""
    import atheris
    import fuzz_targets

    target = fuzz_targets.all_targets()[name]
    run = target.make()
    atheris.instrument_all()
    allowed = target.allowed

    def test_one(data: bytes) -> None:
        try:
            run(data)
        except allowed:
            pass

    corpus.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(target.seeds):
        (corpus / f"seed-{i}").write_bytes(seed)
    atheris.Setup([sys.argv[0], f"-runs={runs}", f"-max_total_time={max_time}",
                   "-print_final_stats=1", "-timeout=60", "-rss_limit_mb=6144",
                   f"-artifact_prefix={crashes}/{name}-", str(corpus)], test_one)
    try:
        atheris.Fuzz()
    finally:
        target.close()
    return 0


_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_STAT = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)")
_UNITS = re.compile(r"stat::number_of_executed_units: (\d+)")


def _run_target(name: str, runs: int, max_time: int) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "--one", name, "--runs", str(runs),
                           "--max-time", str(max_time)], capture_output=True, text=True,
                          timeout=max_time + 600, env={**os.environ, "PYTHONHASHSEED": "0"})
    out = proc.stdout + proc.stderr
    stats = _STAT.findall(out)
    units = _UNITS.findall(out)
    done = _DONE.search(out)
    crashed = proc.returncode != 0 and not done
    result = {"target": name, "inputs": int(units[-1]) if units else
              (int(done.group(1)) if done else 0),
              "seconds": round(time.monotonic() - t0, 1),
              "crashes": 1 if crashed or "Uncaught Python exception" in out else 0,
              "coverage_edges": int(stats[-1][1]) if stats else 0,
              "features": int(stats[-1][2]) if stats else 0}
    if result["crashes"]:
        tail = out[out.find("=== Uncaught Python exception"):][:3000] if \
            "Uncaught Python exception" in out else out[-3000:]
        result["crash_report"] = tail
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the fuzz targets named on the command line; print the results."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="all", help="comma-separated names, or all")
    parser.add_argument("--runs", type=int, default=100_000, help="inputs per target")
    parser.add_argument("--max-time", type=int, default=300, help="seconds per target at most")
    parser.add_argument("--json", help="write the report here too")
    parser.add_argument("--list", action="store_true", help="list the targets")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        return _one(args.one, args.runs, args.max_time, HERE / "corpus" / args.one,
                    HERE / "crashes")
    import fuzz_targets

    names = list(fuzz_targets.all_targets())
    if args.list:
        print("\n".join(names))
        return 0
    chosen = names if args.targets == "all" else args.targets.split(",")
    unknown = [n for n in chosen if n not in names]
    if unknown:
        print(f"unknown targets {', '.join(unknown)}; --list shows them", file=sys.stderr)
        return 2
    results = []
    print(f"{'target':<28}{'inputs':>10}{'s':>7}{'crashes':>9}{'cov':>7}{'ft':>8}", flush=True)
    for name in chosen:
        r = _run_target(name, args.runs, args.max_time)
        results.append(r)
        print(f"{name:<28}{r['inputs']:>10}{r['seconds']:>7}{r['crashes']:>9}"
              f"{r['coverage_edges']:>7}{r['features']:>8}", flush=True)
        if r["crashes"]:
            print(r["crash_report"], flush=True)
    total = sum(r["inputs"] for r in results)
    crashes = sum(r["crashes"] for r in results)
    print(f"{len(results)} targets, {total} inputs, {crashes} crashes")
    if args.json:
        Path(args.json).write_text(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                               "runs": args.runs, "max_time": args.max_time,
                                               "results": results}, indent=2))
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
