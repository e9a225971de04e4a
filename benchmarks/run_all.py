"""`make bench`: run every benchmark, print its table, and save the raw results.

Each benchmark is a script in this folder that prints a table, or one JSON object with
--json. This runner runs each with --json, prints the results and saves them, with the machine
and the time, in benchmarks/results/latest.json.

    python benchmarks/run_all.py [--only NAME ...] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# name → (script or argv, arguments, arguments for --quick)
BENCHMARKS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "scheduler": (["bench_scheduler.py"], [], ["--repeats", "3"]),
    "plans": (["bench_plans.py"], [], []),
    "drivers": (["bench_drivers.py"], [], ["--repeats", "100", "--reconfigurations", "5"]),
    "dataplane": (["bench_dataplane.py"], [], ["--sizes-mb", "0.00390625,1,16,64",
                                                "--repeats", "2"]),
    "allreduce": (["bench_allreduce.py"], [], ["--repeats", "3"]),
    "allreduce-hd": (["bench_allreduce.py"], ["--collective", "halving-doubling"],
                     ["--repeats", "3"]),
    "collectives": (["bench_allreduce.py"],
                    ["--collective", "ring,halving-doubling,wrht,totientperms,parameter-server",
                     "--sizes", "1000000,16000000,64000000,256000000", "--repeats", "2"],
                    ["--sizes", "1000000,16000000"]),
    "allreduce-8node": (["bench_allreduce.py"],
                        ["--config", str(HERE.parent / "oddl" / "testbeds" / "emulated-8node.toml"),
                         "--sizes", "1000000,16000000,64000000", "--repeats", "5"],
                        ["--sizes", "1000000,16000000", "--repeats", "2"]),
    "ocs": (["bench_ocs.py"], [], ["--repeats", "3"]),
    "circuit-12node": (["bench_circuit.py"], ["--sizes", "1048576,16777216,67108864"],
                       ["--sizes", "1048576,16777216", "--repeats", "2"]),
    "demo": (["-m", "oddl", "demo"], ["--iterations", "20"], ["--iterations", "6"]),
    "optinc": (["bench_optinc.py"], [], []),
    "simulator": (["bench_simulator.py"], [], ["--repeats", "1"]),
    "optinc-testbed": (["bench_optinc_testbed.py"], [], ["--sizes-mb", "1,4", "--repeats", "1"]),
    "demo-optinc": (["-m", "oddl", "demo"], ["--collective", "optinc", "--iterations", "20"],
                    ["--iterations", "6"]),
    "topoopt": (["bench_topoopt.py"], [], []),
    "native-collectives": (["bench_collectives.py"], [], ["--sizes", "16MB", "--repeats", "3"]),
    "torch-backend": (["bench_torch_backend.py"], [], ["--repeats", "3"]),
    "torch-collectives": (["bench_torch_collectives.py"], [], ["--sizes-mb", "16",
                                                               "--repeats", "3"]),
    "trace": (["bench_trace.py"], ["--rounds", "8"], ["--rounds", "3"]),
    "p2p": (["bench_p2p.py"], [], ["--sizes-mb", "0.004,16", "--repeats", "3"]),
    "broadcast": (["bench_broadcast.py"], [], ["--sizes-mb", "16", "--repeats", "3"]),
    "direct-landing": (["bench_direct_landing.py"], [], ["--sizes-mb", "16", "--repeats", "3",
                                                         "--rounds", "1"]),
    "in-rank": (["bench_in_rank.py"], [], ["--sizes-mb", "0.004096,16", "--repeats", "3"]),
    "call-breakdown": (["bench_call_breakdown.py"], [], ["--sizes-mb", "0.004096,16",
                                                         "--repeats", "3"]),
    "small-calls": (["bench_small_calls.py"], [], ["--calls", "300"]),
    "control-plane": (["bench_control_plane.py"], ["--sizes", "4,16,64,256,1024"],
                      ["--sizes", "4,64", "--steady-s", "3"]),
}


def now() -> str:
    """The local time as the results carry it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def run_one(name: str, quick: bool) -> dict | None:
    """Run one benchmark with --json; None when its script does not exist."""
    target, args, quick_args = BENCHMARKS[name]
    if target[0].endswith(".py"):
        script = HERE / target[0]
        if not script.exists():
            return None
        argv = [sys.executable, str(script)]
    else:
        argv = [sys.executable, *target]
    argv += args + (quick_args if quick else []) + ["--json"]
    ran = now()
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"[bench] {name} FAILED (exit {proc.returncode}):\n{proc.stderr[-2000:]}",
              file=sys.stderr)
        return {"ok": False, "ran": ran, "exit": proc.returncode,
                "stderr": proc.stderr[-2000:]}
    out = proc.stdout.strip()
    try:
        result = json.loads(out)
    except ValueError:
        result = json.loads(out.splitlines()[-1])  # progress lines, then one JSON line
    return {"ok": True, "ran": ran, "seconds": elapsed, "command": " ".join(argv[1:]),
            "result": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    out: dict = {"time": now(), "machine": platform.node(),
                 "python": platform.python_version(), "cpus": os.cpu_count(), "results": {}}
    failed = False
    for name in names:
        print(f"[bench] {name} …", flush=True)
        res = run_one(name, args.quick)
        if res is None:
            print(f"[bench] {name}: no script, skipped", flush=True)
            continue
        out["results"][name] = res
        failed |= not res["ok"]
        if res["ok"]:
            print(json.dumps(res["result"], indent=1)[:4000], flush=True)
    RESULTS.mkdir(exist_ok=True)
    latest = RESULTS / "latest.json"
    if args.only and latest.exists():
        # a partial run updates its benchmarks and keeps the others' last results, and the
        # date of the full run they came from: each result carries the time it ran
        previous = json.loads(latest.read_text(encoding="utf-8"))
        out["results"] = {**previous.get("results", {}), **out["results"]}
        out["time"] = previous.get("time", out["time"])
    latest.write_text(json.dumps(out, indent=1), encoding="utf-8")
    print(f"[bench] results in {RESULTS / 'latest.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
