"""The cost of the direct-landing proof (decision records 0037, 0039) per plan, and what it
allows.

For each collective, rank count and size (float32, the agents' chunk size), builds the plan,
runs `oddl.agents.collective.direct_landing.direct_chunks` for rank 0 (a fresh proof, not
the cache) and prints its time, rank 0's receive chunks, how many of them are COPY chunks and
how many the proof lets land directly, and whether a run would prove it at all (ranks × its
chunks within `plan_run.PROOF_EVENTS`).

    python benchmarks/bench_direct_landing_proof.py [--ranks 4,16,64] [--sizes-mb 16,64]
        [--collectives ring,halving-doubling]
"""

from __future__ import annotations

import argparse
import time

from oddl.agents.collective.chunks import chunk_plan
from oddl.agents.collective.direct_landing import direct_chunks
from oddl.agents.collective.plan_run import PROOF_EVENTS
from oddl.agents.links.stream_wire import CHUNK_BYTES
from oddl.controller.scheduling import make_plan
from oddl.protos.schedule_wire import StepSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="4,16,64")
    ap.add_argument("--sizes-mb", default="16,64")
    ap.add_argument("--collectives", default="ring,halving-doubling")
    args = ap.parse_args()
    chunk = CHUNK_BYTES // 4
    print(f"{'collective':18s} {'ranks':>5s} {'MB':>4s} {'chunks':>6s} {'copies':>6s} "
          f"{'direct':>6s} {'proved':>6s} {'proof ms':>9s}")
    for name in args.collectives.split(","):
        for n in (int(x) for x in args.ranks.split(",")):
            for mb in (int(x) for x in args.sizes_mb.split(",")):
                plan = make_plan(name, n, mb * (1 << 20) // 4)
                steps = tuple(StepSpec(str(s.op), tuple(s.src.tolist()), tuple(s.dst.tolist()),
                                       tuple(s.offset.tolist()), tuple(s.length.tolist()))
                              for s in plan.steps)
                mine = chunk_plan(steps, 0, chunk)
                copies = sum(1 for op in mine.recvs if steps[op.step].op == "copy")
                proved = n * (len(mine.sends) + len(mine.recvs)) <= PROOF_EVENTS
                direct_chunks.cache_clear()
                t0 = time.perf_counter()
                safe = direct_chunks(steps, n, 0, chunk)
                ms = (time.perf_counter() - t0) * 1e3
                print(f"{name:18s} {n:5d} {mb:4d} {len(mine.recvs):6d} {copies:6d} "
                      f"{len(safe):6d} {'yes' if proved else 'no':>6s} {ms:9.1f}")


if __name__ == "__main__":
    main()
