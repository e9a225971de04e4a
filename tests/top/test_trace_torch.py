"""A real recorded run end to end: the emulated testbed recording (`trace=DIR`: controller,
agents, emulator host) under examples/profile_ddp.py on four ranks of the `oddl` backend over a
halving-doubling job, with torch.profiler and ODDL_TRACE_DIR (the backend's `torch` events);
then `oddl trace merge` of it all with a rank's profiler trace, the join of the torch calls with
the profiler's annotations and the agents' collectives, `summary` and `plot` of the real
timeline, and HolisticTraceAnalysis reading the merged file (extra `oddl[torch]`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import EMULATED, ROOT, run_ranks

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "examples" / "profile_ddp.py"
WORLD = 4
STEPS = 2


def _run_ranks(apis: list[str], trace_dir: Path, profile_dir: Path,
               testbed: Path) -> list[dict[str, Any]]:
    return run_ranks([sys.executable, str(EXAMPLE), "--out", str(profile_dir), "--steps",
                      str(STEPS)], apis, 240,
                     {"ODDL_TRACE_DIR": str(trace_dir), "ODDL_CONFIG": str(testbed)})


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[Path, Path]:
    """The traced run's folders: the backend's trace files and the profiler's."""
    from oddl.launch.testbed import RunningTestbed

    work = tmp_path_factory.mktemp("profile-ddp")
    trace_dir, profile_dir = work / "trace", work / "profile"
    (work / "testbed").mkdir()
    with RunningTestbed(work / "testbed", EMULATED, trace=trace_dir) as tb:
        job = tb.operator.submit("profile-ddp", tb.launched.node_ids, "halving-doubling",
                                 "optical")
        results = _run_ranks(tb.launched.apis, trace_dir, profile_dir, tb.launched.resolved)
        tb.operator.cancel(job["id"])
    assert [r["rank"] for r in results] == list(range(WORLD))
    return trace_dir, profile_dir


def _torch_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "torch"]


def test_each_call_is_a_torch_event_that_names_the_profilers_annotation(profiled):
    """Every rank records the same calls (same c10d names, Seq 1..n on process group "0"), each
    with the agent's job and consecutive call numbers, and the profiler's trace of that rank
    holds an `oddl:<name> pg=0 seq=<Seq>` annotation for each call it profiled."""
    trace_dir, profile_dir = profiled
    per_rank = []
    for rank in range(WORLD):
        doc = json.loads((trace_dir / f"torch-rank{rank}.trace.json").read_text())
        assert doc["oddl"]["dropped"] == 0
        events = _torch_events(doc)
        assert events, f"rank {rank} recorded no torch events"
        args = [e["args"] for e in events]
        assert [a["Seq"] for a in args] == list(range(1, len(args) + 1))
        assert {a["Process Group Name"] for a in args} == {"0"}
        assert all(a["Group size"] == WORLD and a["job"] for a in args)
        seqs = [a["seq"] for a in args]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        per_rank.append([(e["name"], a["Out msg nelems"]) for e, a in zip(events, args,
                                                                          strict=True)])
        profile = json.loads((profile_dir / f"rank{rank}.json").read_text())
        names = {e["name"] for e in profile["traceEvents"] if e.get("name", "").startswith("oddl:")}
        allreduces = {f"oddl:allreduce pg=0 seq={a['Seq']}" for a in args
                      if a["Collective name"] == "allreduce"}
        profiled_calls = names & allreduces
        assert len(profiled_calls) >= STEPS, (names, allreduces)
    assert all(r == per_rank[0] for r in per_rank)


def test_merge_puts_the_ranks_and_their_profiles_on_one_axis_and_hta_reads_it(profiled,
                                                                              tmp_path):
    """Merging rank 0's profiler trace with the four backend files: the profiler's own
    top-level keys survive, each file keeps its names under fresh pids, and every torch event
    of rank 0 lies within the profiler's window of the steps it profiled, give or take the
    warm-up step before it (the same clock on one host; the offset is the agent's, µs)."""
    from oddl.cli.main import main

    trace_dir, profile_dir = profiled
    out = tmp_path / "timeline.json"
    assert main(["trace", "merge", str(trace_dir), str(profile_dir / "rank0.json"),
                 "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["distributedInfo"]["rank"] == 0
    names = {e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert {f"torch rank {r}" for r in range(WORLD)} <= names
    steps = [e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert len(steps) == STEPS
    annotated = {e["name"]: e for e in doc["traceEvents"]
                 if e.get("name", "").startswith("oddl:allreduce pg=0 seq=")}
    rank0 = [e for e in _torch_events(doc) if e["pid"] in _pids_named(doc, "torch rank 0")]
    joined = [e for e in rank0 if f"oddl:allreduce pg=0 seq={e['args']['Seq']}" in annotated]
    assert len(joined) >= STEPS
    for e in joined:
        a = annotated[f"oddl:allreduce pg=0 seq={e['args']['Seq']}"]
        # the annotation spans the submission; the call starts within it or after it, and
        # within a millisecond (clock offset between agent and controller on one host)
        assert a["ts"] - 1000 <= e["ts"] <= a["ts"] + a["dur"] + 5e5


def _pids_named(doc: dict[str, Any], name: str) -> set[int]:
    return {e["pid"] for e in doc["traceEvents"] if e.get("ph") == "M"
            and e.get("name") == "process_name" and e["args"]["name"] == name}


# HTA 0.5 calls pandas APIs that pandas deprecates: their warnings are not this test's subject
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
def test_holistic_trace_analysis_reads_the_merged_timeline(profiled, tmp_path):
    """HolisticTraceAnalysis (a published parser of Kineto traces) parses the merged file as
    rank 0's trace: the profiler's steps and the backend's torch events both become events."""
    hta = pytest.importorskip("hta.trace_analysis")
    from oddl.trace.merge import merge_paths, write_json

    trace_dir, profile_dir = profiled
    folder = tmp_path / "hta"
    folder.mkdir()
    write_json(merge_paths([str(trace_dir), str(profile_dir / "rank0.json")]),
               str(folder / "rank0.json"))
    analysis = hta.TraceAnalysis(trace_dir=str(folder))
    df = analysis.t.get_trace(0)
    names = set(analysis.t.symbol_table.get_sym_table())
    assert len(df) > 0 and any(n.startswith("ProfilerStep#") for n in names)
    assert "allreduce" in names  # the backend's torch events are parsed as events too


@pytest.fixture(scope="module")
def timeline(profiled, tmp_path_factory) -> dict[str, Any]:
    """The testbed's files, the four backend files and rank 0's profile, merged."""
    from oddl.trace.merge import merge_paths

    trace_dir, profile_dir = profiled
    names = sorted(p.name for p in trace_dir.iterdir())
    assert names == ["agent-n0.trace.json", "agent-n1.trace.json", "agent-n2.trace.json",
                     "agent-n3.trace.json", "controller.trace.json", "emulators.trace.json",
                     *(f"torch-rank{r}.trace.json" for r in range(WORLD))]
    return merge_paths([str(trace_dir), str(profile_dir / "rank0.json")])


def test_each_torch_call_joins_its_agents_collective(timeline):
    """Rank r runs on node n<r> (ODDL_LOCAL_API in node order): each of its torch events has
    the agent's collective of the same job whose `step` is the call's `seq`, and that
    collective lies within the call (the same controller clock; 5 ms for the two processes'
    offset estimates)."""
    events = timeline["traceEvents"]
    for rank in range(WORLD):
        torch_pids = _pids_named(timeline, f"torch rank {rank}")
        agent_pids = _pids_named(timeline, f"agent n{rank}")
        collectives = {(e["args"]["job"], e["args"]["step"]): e for e in events
                       if e.get("cat") == "collective" and e["pid"] in agent_pids}
        calls = [e for e in events if e.get("cat") == "torch" and e["pid"] in torch_pids]
        assert calls and len(collectives) >= len(calls)
        for call in calls:
            agent = collectives[(call["args"]["job"], call["args"]["seq"])]
            assert call["ts"] - 5000 <= agent["ts"]
            assert agent["ts"] + agent["dur"] <= call["ts"] + call["dur"] + 5000


def test_summary_and_plot_of_the_real_timeline(timeline, tmp_path):
    """Every agent slot and every controller retune is in the summary; each retune slot's
    guard splits into parts that add up to it; every slot's utilisation is positive; the
    plot has a row per node."""
    from oddl.trace.plot import plot_timeline
    from oddl.trace.summary import GUARD_PARTS, summarise

    s = summarise(timeline)
    events = timeline["traceEvents"]
    slots = [e for e in events if e.get("cat") == "slot" and e["ph"] == "X"]
    retunes = [e for e in events if e.get("cat") == "retune" and e["ph"] == "X"]
    assert len(s["slots"]) == len(slots) > 0 and retunes
    assert s["totals"]["retunes"] == len(retunes)
    assert all(c["nodes"] == ["n0", "n1", "n2", "n3"] for c in s["collectives"])
    assert all(sl["utilisation"] > 0 for sl in s["slots"])
    for g in s["guards"]:
        parts = sum(g[f"{p}_us"] for p in GUARD_PARTS)
        assert g["guard_us"] > 0 and parts == pytest.approx(g["guard_us"], abs=1e-6)
    assert plot_timeline(timeline, str(tmp_path / "t.png")) == WORLD
