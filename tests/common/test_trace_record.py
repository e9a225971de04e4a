"""Recording the timeline (issue 25): the recorder, the format check, and traced collectives.

A traced ring and a traced halving-doubling all-reduce on the emulated testbed (real
processes) leave one file per process holding every slot of the schedule, every retune the
controller counted and every chunk of the chunk plan, in a file that passes the format check;
an agent made late on purpose shows overruns and late chunks; tracing off writes nothing; a
full buffer counts its drops.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gated_ring import gated_ring
from helpers import EMULATED, wait_until

from oddl.agents.client.every_rank import allreduce_all
from oddl.agents.links.stream_wire import CHUNK_BYTES
from oddl.common.errors import OperationRefused
from oddl.common.tracing import TRACE, Recorder, Track
from oddl.common.tracing.chrome import to_chrome
from oddl.common.tracing.schema import TraceFormatError, check, problems
from oddl.launch.testbed import RunningTestbed

ELEMS = 4 << 20  # 16 MB of float32: chunked (1 MiB) and pipelined


def _events(doc: dict[str, Any], cat: str, ph: str | None = None) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == cat and (ph is None or e["ph"] == ph)]


def _load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    check(doc, str(path))
    return doc


# ---- the recorder and the format, pure ------------------------------------------------------


def test_a_full_buffer_counts_what_it_dropped(tmp_path: Path):
    rec = Recorder()
    rec.start(tmp_path, "controller", capacity=5)
    t = rec.now_ns()
    for i in range(12):
        rec.instant(Track("controller", "control"), "grant", "control", t + i, {"job": "j", "seq": i})
    doc = _load(rec.stop() or tmp_path / "missing")
    assert doc["oddl"]["recorded"] == 5 and doc["oddl"]["dropped"] == 7
    assert [e["args"]["seq"] for e in _events(doc, "control")] == [0, 1, 2, 3, 4]


def test_a_recorder_that_never_started_writes_nothing(tmp_path: Path):
    rec = Recorder()
    assert not rec.on and rec.stop() is None
    assert list(tmp_path.iterdir()) == []


def test_the_file_is_on_the_base_time_in_microseconds_with_named_tracks(tmp_path: Path):
    rec = Recorder()
    rec.start(tmp_path, "agent-n0", clock=lambda: 1_000_000_000, offset_ns=lambda: 500)
    rec.complete(Track("agent n0", "send"), "send", "chunk", rec.now_ns() + 2000,
                 rec.now_ns() + 5000, {"job": "j", "seq": 1, "step": 0, "peer": "n1",
                                       "offset": 0, "bytes": 8})
    doc = _load(rec.stop() or tmp_path)
    assert doc["baseTimeNanoseconds"] == 1_000_000_500
    (send,) = _events(doc, "chunk")
    assert (send["ts"], send["dur"]) == (2.0, 3.0)
    names = {(e["name"], e["args"]["name"]) for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names == {("process_name", "agent n0"), ("thread_name", "send")}
    assert doc["oddl"]["clock"]["offset_ns"] == 500


@pytest.mark.parametrize("broken, complaint", [
    ({"ph": "X", "dur": -1.0}, "dur >= 0"),
    ({"ph": "b", "id": "1"}, "unmatched begin"),
    ({"ph": "X", "dur": 1.0, "args": {"job": "j"}}, "lacks args"),
])
def test_the_format_check_names_what_is_broken(broken: dict[str, Any], complaint: str):
    ok_args = {"job": "j", "seq": 1, "step": 0, "peer": "n1", "offset": 0, "bytes": 8}
    ev = {"name": "send", "cat": "chunk", "pid": 1, "tid": 1, "ts": 5.0, "args": ok_args,
          **broken}
    doc = to_chrome([], {"process": "p", "host": "h", "clock": {}, "buffer_events": 1,
                         "recorded": 0, "dropped": 0, "started_ns": 1, "stopped_ns": 2})
    assert problems(doc) == []
    doc["traceEvents"].append(ev)
    assert any(complaint in p for p in problems(doc)), problems(doc)
    with pytest.raises(TraceFormatError, match="run.json"):
        check(doc, "run.json")


def test_time_going_back_on_a_track_is_caught():
    doc = to_chrome([], {"process": "p", "host": "h", "clock": {}, "buffer_events": 1,
                         "recorded": 0, "dropped": 0, "started_ns": 1, "stopped_ns": 2})
    doc["traceEvents"] += [{"ph": "i", "s": "p", "name": "grant", "cat": "control", "pid": 1,
                            "tid": 1, "ts": t, "args": {"job": "j", "seq": 1}} for t in (5, 4)]
    assert any("back in time" in p for p in problems(doc))


# ---- an agent made late on purpose (in this process, real stream links) -------------------








def test_an_agent_made_late_shows_overruns_and_late_chunks(tmp_path: Path):
    TRACE.start(tmp_path, "agents-in-process")
    try:
        outs = gated_ring(late_rank=2, delay_s=0.5, slot_s=0.02)
    finally:
        path = TRACE.stop()
    assert all(isinstance(o, np.ndarray) and float(o[0]) == 10.0 for o in outs), outs
    doc = _load(path or tmp_path)
    faults = _events(doc, "fault")
    overruns = {e["args"]["seq"] for e in faults if e["name"] == "overrun"}
    by_node = Counter((e["pid"], e["name"]) for e in faults)
    pid_of = {e["args"]["name"]: e["pid"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "process_name"}
    assert overruns == {1} and by_node[(pid_of["agent n2"], "overrun")] > 0
    # n3 hears n2 in the ring: its chunks come after their slots
    late = [e for e in faults if e["name"] == "late chunk" and e["pid"] == pid_of["agent n3"]]
    assert late and all(e["args"]["peer"] == "n2" and e["args"]["by_us"] > 0 for e in late)
    slots = [e for e in _events(doc, "slot") if e["pid"] == pid_of["agent n2"]]
    assert len(slots) == 6 and min(e["args"]["gate_error_us"] for e in slots) > 400_000


def test_tracing_off_records_nothing(tmp_path: Path):
    assert not TRACE.on
    before = next(TRACE._next)  # the recorder's own counter: no hook appended
    outs = gated_ring(late_rank=-1, delay_s=0.0, slot_s=0.05)
    assert all(isinstance(o, np.ndarray) for o in outs)
    assert next(TRACE._next) == before + 1 and TRACE.stop() is None
    assert list(tmp_path.iterdir()) == []


# ---- traced collectives on the emulated testbed (real processes) --------------------------


def _expected(schedule: Any, node_ids: list[str]) -> dict[str, dict[str, int]]:
    """Per node: the slots it sends in and the chunks it sends and receives."""
    rank = {n: i for i, n in enumerate(node_ids)}
    chunk = CHUNK_BYTES // schedule.itemsize
    out = {n: {"slot": 0, "send": 0, "recv": 0} for n in node_ids}
    for slot in schedule.slots:
        for c in slot.circuits:
            out[c.src]["slot"] += 1
    for step in schedule.steps:
        for s, d, length in zip(step.src, step.dst, step.length, strict=True):
            k = math.ceil(length / chunk)
            out[node_ids[s]]["send"] += k
            out[node_ids[d]]["recv"] += k
    assert all(rank)
    return out


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_traced_ring_and_halving_doubling_hold_every_slot_retune_and_chunk(tmp_path: Path):
    trace = tmp_path / "trace"
    runs: dict[str, tuple[str, Any]] = {}
    retunes = {}
    with RunningTestbed(tmp_path, EMULATED, trace=trace) as tb:
        nodes = tb.launched.node_ids
        for collective in ("ring", "halving-doubling"):
            job = tb.operator.submit(f"trace-{collective}", [], collective, "optical")
            for _ in range(2):  # through the barrier, then standing
                arrays = [np.full(ELEMS, r + 1, np.float32) for r in range(len(nodes))]
                _, outs = allreduce_all(tb.clients, arrays)
                assert all(isinstance(o, np.ndarray) and o[0] == 10 for o in outs), outs
            runs[job["id"]] = (collective, tb.operator.schedule(job["id"], ELEMS * 4, 4))
            ended = tb.operator.cancel(job["id"])
            retunes[job["id"]] = int(ended.get("reconfigurations", 0))
    files = sorted(p.name for p in trace.iterdir())
    assert files == ["agent-n0.trace.json", "agent-n1.trace.json", "agent-n2.trace.json",
                     "agent-n3.trace.json", "controller.trace.json", "emulators.trace.json"]
    docs = {name: _load(trace / name) for name in files}  # json, and the format check
    assert len({d["oddl"]["testbed_sha256"] for d in docs.values()}) == 1
    for job_id, (collective, schedule) in runs.items():
        want = _expected(schedule, nodes)
        for node in nodes:
            doc = docs[f"agent-{node}.trace.json"]
            mine = Counter(e["name"] if e["cat"] == "chunk" else e["cat"]
                           for e in doc["traceEvents"]
                           if e.get("args", {}).get("job") == job_id and e["ph"] == "X")
            assert mine["slot"] == 2 * want[node]["slot"], (collective, node)
            assert mine["send"] == 2 * want[node]["send"], (collective, node)
            assert mine["recv"] == 2 * want[node]["recv"], (collective, node)
            assert mine["collective"] == 2
        got = [e for e in _events(docs["controller.trace.json"], "retune")
               if e["args"]["job"] == job_id]
        assert len(got) == retunes[job_id]
        assert all(e["args"]["ok"] and e["args"]["wss"] and e["args"]["in_port"] for e in got)
    assert retunes[next(j for j, (c, _) in runs.items() if c == "halving-doubling")] > 0
    ctl = docs["controller.trace.json"]
    assert _events(ctl, "device") and _events(ctl, "plan", "b") and _events(ctl, "circuit", "b")
    assert {e["name"] for e in _events(ctl, "control")} >= {"barrier start", "grant",
                                                           "handoff confirmed"}
    assert _events(docs["emulators.trace.json"], "light", "b")


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_trace_start_and_stop_at_run_time_record_only_the_window(tmp_path: Path):
    trace = tmp_path / "window"
    with RunningTestbed(tmp_path, EMULATED) as tb:
        job = tb.operator.submit("window", [], "ring", "optical")
        arrays = [np.full(1 << 16, r + 1, np.int32) for r in range(4)]
        allreduce_all(tb.clients, arrays)  # before the window: not on the trace
        told = tb.operator.set_trace(True, str(trace))
        assert sorted(told["agents"]) == tb.launched.node_ids
        wait_until(lambda: all(c.status()["tracing"] for c in tb.clients), 30,
                   "every agent recording")
        _, outs = allreduce_all(tb.clients, [np.full(1 << 16, r + 1, np.int32)
                                             for r in range(4)])
        assert all(isinstance(o, np.ndarray) for o in outs)
        stopped = tb.operator.set_trace(False)
        assert stopped["controller_file"] == str(trace / "controller.trace.json")
        wait_until(lambda: len(list(trace.glob("agent-*.trace.json"))) == 4, 30,
                   "every agent's file")
        with pytest.raises(OperationRefused, match="--dir"):
            tb.operator.set_trace(True, "")
        with pytest.raises(OperationRefused, match="not an absolute path"):
            tb.operator.set_trace(True, "relative/folder")
        assert not Path("relative").exists()
        tb.operator.cancel(job["id"])
    for path in trace.glob("agent-*.trace.json"):
        seqs = {e["args"]["seq"] for e in _events(_load(path), "collective")}
        assert seqs == {2}, (path, seqs)
    assert not (trace / "emulators.trace.json").exists()
