"""A training user's process on one host: all-reduces through its agent's Unix socket, each
result checked exactly, one JSON line per call on stdout.

Call k of rank r sends a[j] = (k + 1) * (r + 1) + j (int64), so the exact sum over N ranks is
(k + 1) * N (N + 1) / 2 + N * j: a sum that pairs different steps on different ranks is wrong
in every element. The client is made as the example in docs/how-to/lab-bring-up.md makes it (and not closed). A
failed call is retried with its number, unless the other ranks are past it (`StepPassed`: the
rank's agent restarted after they finished the step): then the loop goes on with the next.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from oddl.agents.client.agent_client import AgentClient
from oddl.common.errors import StepPassed


def payload(step: int, rank: int, elements: int) -> np.ndarray:
    return (step + 1) * (rank + 1) + np.arange(elements, dtype=np.int64)


def expected(step: int, nodes: int, elements: int) -> np.ndarray:
    return (step + 1) * nodes * (nodes + 1) // 2 + nodes * np.arange(elements, dtype=np.int64)


def stop_step(path: str) -> float:
    """The step to stop before: the number in the stop file (every rank stops after the same
    collective), at once when the file is empty, never while it does not exist."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
    except FileNotFoundError:
        return float("inf")
    return int(text) if text.isdigit() else 0



def _failure(exc: BaseException) -> dict[str, object]:
    """A failed call's record fields: `error` for people ("Type: message"), and the exception's
    type and its own message apart (`reason`: what lab/jobs.py checks says something)."""
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__,
            "reason": str(exc), "end": time.time()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--api", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--job", default=None)
    p.add_argument("--elements", type=int, default=1000)
    p.add_argument("--count", type=int, default=0, help="calls to make (0: until --stop-file)")
    p.add_argument("--stop-file", default=None,
                   help="stop before the step this file names (empty: now)")
    p.add_argument("--timeout-s", type=float, default=30.0)
    args = p.parse_args()
    client = AgentClient(args.api, timeout_s=args.timeout_s)
    step = 0
    while True:
        if args.count and step >= args.count:
            break
        if args.stop_file and step >= stop_step(args.stop_file):
            break
        mine = payload(step, args.rank, args.elements)
        record: dict[str, object] = {"rank": args.rank, "step": step, "start": time.time()}
        try:
            # the loop retries a failed step: it numbers its calls, so a retry keeps its number
            got = client.allreduce(mine, job=args.job, step=step + 1)
            record["end"] = time.time()
            record["ok"] = bool(np.array_equal(got, expected(step, args.nodes, args.elements)))
            if not record["ok"]:
                record["wrong"] = f"first elements {got[:3].tolist()}"
            step += 1
        except StepPassed as exc:  # the others are past this step: its result is lost here
            record.update(_failure(exc))
            step += 1
        except Exception as exc:  # every other failure is recorded with its reason, retried
            record.update(_failure(exc))
            time.sleep(0.2)
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
