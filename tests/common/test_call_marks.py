"""The call marks of issue 36 (`oddl.common.call_marks`): off, nothing is noted; on, a record
per call, flushed as one JSON line when it is a collective's."""

from __future__ import annotations

import json
from pathlib import Path

from oddl.common.call_marks import CallMarks


def test_off_notes_nothing(tmp_path: Path) -> None:
    marks = CallMarks(None)
    marks.begin()
    marks.mark("a")
    marks.add("s0.send", 5)
    marks.note(step=1)
    marks.flush("agent-n0")
    assert marks.take() == {} and list(tmp_path.iterdir()) == []


def test_a_record_per_call_in_order_and_summed(tmp_path: Path) -> None:
    marks = CallMarks(str(tmp_path / "marks"))
    marks.begin()
    marks.mark("agent_in")
    marks.mark("agent_in")  # the first time wins
    marks.mark_last("s0.in")
    marks.mark_last("s0.in")  # the last time wins
    marks.add("s0.send", 5)
    marks.add("s0.send", 7)
    marks.note(node="n0", step=3)
    marks.flush("agent-n0")
    marks.begin()
    marks.mark("agent_in")
    marks.flush("agent-n0")  # no step: a world question, not a collective
    lines = (tmp_path / "marks" / "agent-n0.jsonl").read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["node"] == "n0" and rec["step"] == 3 and rec["s0.send"] == 12
    assert rec["agent_in"] <= rec["s0.in"] and rec["minflt"] >= 0
