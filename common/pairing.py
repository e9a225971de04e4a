"""Which call is this? Step numbers that pair the ranks' calls into one collective.

Every rank's training process numbers its all-reduce calls on a job (`AgentClient` counts
them, or the caller passes its own number, e.g. the training iteration). The agents and the
controller pair calls into one collective by the agents' sequence number; before any data
moves they compare the callers' step numbers, and a collective whose ranks handed in
different numbers is refused on every rank: running it would reduce different training
steps together. Step 0 means the caller gave none (an older client); it pairs with anything.
"""

from __future__ import annotations

from collections.abc import Mapping


def step_mismatch(job_id: str, seq: int, steps: Mapping[str, int]) -> str:
    """Why collective `seq` of `job_id` cannot run with these callers' steps ("" if it can)."""
    given = {node: step for node, step in steps.items() if step > 0}
    if len(set(given.values())) <= 1:
        return ""
    detail = ", ".join(f"{node} at step {step}" for node, step in sorted(given.items()))
    return (f"collective {seq} of job {job_id} refused: the ranks handed in different calls "
            f"({detail}); pairing them would reduce different training steps together, so "
            "nothing was reduced. A rank skipped or repeated calls (a loop that went on past "
            "a failed call, or one rank's training process restarted alone). Restart every "
            "rank's training process together (torchrun restarts all workers), or number the "
            "calls yourself (`allreduce(a, step=iteration)`) and retry a failed step with its "
            "own number")
