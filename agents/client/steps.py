"""The step numbers a client's collective calls used, per job (decision record 0016).

Every collective call carries a step number; by default the client's count of its calls on
the job, which the agent reads from the `last` numbers each request carries. A call that
reached the agent and was not refused unrun uses up its number (`note`). After a collective
failed on some ranks only, their counts differ: the ranks agree on the highest and go on from
it (`resume_at`, the torch backend's new group, decision record 0030).
"""

from __future__ import annotations


class StepCount:
    """One client's step numbers per job id."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        """Per job id, the step number of this client's last call on it."""
        self.last_job: str | None = None
        """The job of the last call that used up a number."""
        self.used = 0
        """Calls that used up a number: a failed call that left it unchanged moved no data."""

    def note(self, resolved: tuple[str, int] | None, job: str | None, step: int | None
             ) -> None:
        """A call went to the agent, which took it as `resolved` (job id, step), or None: a
        call lost in flight (the agent died) counts on the job it was for, `job` (or the last
        one) with `step` (or the next number)."""
        self.used += 1
        if resolved is not None:
            job_id, number = resolved
        else:
            lost_on = job or self.last_job
            if lost_on is None:
                return
            job_id = lost_on
            number = step if step is not None else self.last.get(job_id, 0) + 1
        self.last[job_id] = number
        self.last_job = job_id

    def resume_at(self, job_id: str, step: int) -> None:
        """Number the next call on `job_id` `step` + 1 (where the ranks agreed to go on)."""
        self.last[job_id] = step
