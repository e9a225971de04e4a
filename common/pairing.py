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

from oddl.common.errors import CollectiveError, StepMismatch, StepPassed


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


def passed_by(node: str, steps: Mapping[str, int]) -> tuple[str, int] | None:
    """(the rank furthest ahead, its step) when a rank is past `node`'s step, else None.

    A rank's number only grows (a loop retries a failed step with its own number and goes on
    after it), so a rank at a later step will never make `node`'s call: `node` must go on."""
    mine = steps.get(node, 0)
    if mine <= 0:
        return None
    ahead = [(step, other) for other, step in steps.items() if other != node and step > mine]
    if not ahead:
        return None
    step, other = min(ahead, key=lambda a: (-a[0], a[1]))  # the furthest; by name on a tie
    return other, step


def step_passed(job_id: str, seq: int, node: str, steps: Mapping[str, int]) -> str:
    """Why `node`'s call for collective `seq` cannot pair ("" unless another rank is past it)."""
    ahead = passed_by(node, steps)
    if ahead is None:
        return ""
    other, step = ahead
    return (f"{node}: collective {seq} of job {job_id} refused: this rank's call is its step "
            f"{steps[node]}, and {other} is already at step {step}: it finished or gave up "
            f"step {steps[node]} and will not make that call again, so retrying it can never "
            "pair (nothing was reduced). Go on with the next step; this step's result is lost "
            "on this rank (its agent restarted during the collective, or its loop fell behind)")


def refusal(node: str, job_id: str, seq: int, steps: Mapping[str, int], error: str
            ) -> CollectiveError:
    """The typed error of the controller's refusal `error` of collective `seq` at `node`:
    StepPassed when another rank is past this node's step, StepMismatch when the steps
    otherwise differ, CollectiveError for any other reason."""
    passed = step_passed(job_id, seq, node, steps)
    if passed:
        return StepPassed(passed)
    return StepMismatch(error) if step_mismatch(job_id, seq, steps) else CollectiveError(error)
