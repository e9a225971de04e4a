"""The client's step numbers (agents/client/steps.py): what a call uses up, and going on from
the ranks' highest after a collective failed on some of them (decision records 0016, 0030)."""

from __future__ import annotations

from oddl.agents.client.steps import StepCount


def test_a_call_the_agent_took_uses_up_the_number_it_was_taken_as() -> None:
    steps = StepCount()
    steps.note(("job-1", 1), None, None)
    steps.note(("job-1", 7), None, None)  # the caller's own number
    assert steps.last == {"job-1": 7} and steps.last_job == "job-1" and steps.used == 2


def test_a_call_lost_in_flight_counts_on_its_job() -> None:
    steps = StepCount()
    steps.note(None, None, None)  # nothing known yet: counted, no job to put it on
    assert steps.used == 1 and steps.last == {}
    steps.note(("job-1", 3), None, None)
    steps.note(None, None, None)  # the last job, its next number
    steps.note(None, "job-2", 5)  # the job and number it was for
    assert steps.last == {"job-1": 4, "job-2": 5} and steps.used == 4


def test_the_ranks_go_on_from_the_highest_step() -> None:
    behind = StepCount()
    behind.note(("job-1", 4), None, None)
    behind.resume_at("job-1", 5)  # a peer used step 5 in a call that failed
    assert behind.last["job-1"] == 5  # the next call is numbered 6, as the peer's is
