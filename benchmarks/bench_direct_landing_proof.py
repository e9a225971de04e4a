"""The cost of the direct-landing proof (decision record 0037) per plan, and what it allows.

For each collective and rank count, builds the plan, runs
`oddl.agents.collective.direct_landing.direct_receives` for rank 0 and prints the time, the
number of rank 0's COPY receives and how many of them the proof lets land directly.

    python benchmarks/bench_direct_landing_proof.py [--ranks 4,16,64]
        [--collectives ring,halving-doubling]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from oddl.agents.collective.direct_landing import direct_receives
from oddl.controller.scheduling import Op, make_plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="4,16,64")
    ap.add_argument("--collectives", default="ring,halving-doubling")
    args = ap.parse_args()
    print(f"{'collective':18s} {'ranks':>5s} {'steps':>5s} {'copies':>6s} {'direct':>6s} "
          f"{'proof ms':>9s}")
    for name in args.collectives.split(","):
        for n in (int(x) for x in args.ranks.split(",")):
            plan = make_plan(name, n, n * 1024)
            copies = sum(int(np.count_nonzero(s.dst == 0)) for s in plan.steps
                         if s.op is Op.COPY)
            t0 = time.perf_counter()
            safe = direct_receives(plan.steps, n, 0)
            ms = (time.perf_counter() - t0) * 1e3
            print(f"{name:18s} {n:5d} {len(plan.steps):5d} {copies:6d} {len(safe):6d} "
                  f"{ms:9.1f}")


if __name__ == "__main__":
    main()
