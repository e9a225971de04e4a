"""One rank under torchrun's elastic agent (`--max-restarts 1`): the first attempt's rank 1
dies in the middle of the run; torchrun stops every rank and starts them all again, and the
new ranks must pair with the agents cleanly — every all-reduce of the second attempt exact,
none pairing a step of the dead attempt.

`python tests/workers/torch_elastic_worker.py OUT_DIR`: each attempt's rank writes one JSON
file (attempt, rank, the steps it checked, the error if any) into OUT_DIR.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import oddl.torch.backend  # noqa: F401  registers "oddl"

STEPS = 6
CRASH_AT = int(os.environ.get("ODDL_TEST_CRASH_AT", "3"))
"""The step at which rank 1 of the first attempt dies (0: it never does)."""


def main() -> int:
    out = Path(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("oddl")
    checked = []
    for step in range(1, STEPS + 1):
        if attempt == 0 and rank == 1 and step == CRASH_AT:
            os._exit(3)  # dies between calls, as a crashed training process does
        x = torch.full((1000,), float(100 * attempt + 10 * step + rank), dtype=torch.float64)
        dist.all_reduce(x)
        want = sum(100 * attempt + 10 * step + r for r in range(world))
        checked.append({"step": step, "exact": bool(torch.all(x == want))})
        (out / f"attempt{attempt}-rank{rank}.json").write_text(
            json.dumps({"attempt": attempt, "rank": rank, "checked": checked}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
