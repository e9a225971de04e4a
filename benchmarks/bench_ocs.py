"""A verified 48-connection reconfiguration of the OCS through the real driver.

``PolatisOcs.apply_verified`` of a full 48-connection table on an emulated 48x48 switch over
``socket://`` on loopback: read the table, ``CONNect:ONLY``, ``*OPC?``, error queue, read it
back. Each run moves every connection (the table alternates between two permutations). Run
with the emulator's switching time at 0 ms (the driver's and the wire's own cost) and at
25 ms a connection (the emulator's default: 48 x 25 ms = 1.2 s of switching).

    python benchmarks/bench_ocs.py [--repeats 20] [--json]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from bench_common import emit, run_meta

from oddl.drivers.emulators.ocs import OcsEmulator
from oddl.drivers.emulators.ocs_serve import ocs_connection_handler
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.ocs import PolatisOcs

SIZE = 48


def _tables() -> tuple[dict[int, int], dict[int, int]]:
    """Two full tables that share no connection."""
    first = {i: SIZE + i for i in range(1, SIZE + 1)}
    second = {i: SIZE + (i % SIZE) + 1 for i in range(1, SIZE + 1)}
    return first, second


def measure(switch_ms: float, repeats: int) -> dict[str, float]:
    """apply_verified times in ms (p50, min, max) at `switch_ms` per connection."""
    emu = OcsEmulator(SIZE, switch_s=switch_ms / 1e3)
    tables = _tables()
    samples: list[float] = []
    with TcpEmulatorServer(ocs_connection_handler(emu), name="ocs-bench") as server:
        with PolatisOcs.open("{}:{}".format(*server.address), name="ocs-bench",
                             timeout=5.0) as ocs:
            ocs.apply(tables[1])
            for k in range(repeats):
                t0 = time.perf_counter()
                ocs.apply_verified(tables[k % 2])
                samples.append((time.perf_counter() - t0) * 1e3)
    a = np.array(samples)
    return {"switch_ms": switch_ms, "p50_ms": float(np.percentile(a, 50)),
            "min_ms": float(a.min()), "max_ms": float(a.max()), "runs": len(samples),
            "switching_ms": switch_ms * SIZE}


def _table(summary: dict[str, Any]) -> list[str]:
    lines = [f"apply_verified of {SIZE} connections on a {SIZE}x{SIZE} emulated OCS:"]
    for r in summary["results"]:
        lines.append(f"  switching {r['switch_ms']:>4.0f} ms/connection: p50 {r['p50_ms']:8.1f} ms"
                     f" (min {r['min_ms']:.1f}, max {r['max_ms']:.1f}; of which switching "
                     f"{r['switching_ms']:.0f} ms), {r['runs']} runs")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args(argv)
    results = [measure(0.0, args.repeats), measure(25.0, max(2, args.repeats // 4))]
    return emit({**run_meta("ocs"), "results": results}, args.json, _table)


if __name__ == "__main__":
    raise SystemExit(main())
