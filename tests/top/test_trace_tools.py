"""`oddl trace merge | summary | plot` on the hand-built fixture run in tests/data/traces/
(written by make_fixture.py there: two nodes, one halving-doubling all-reduce, one retune slot).

Axes of the fixture: the controller's base is B, n0's B + 2 µs, n1's B − 500.5 µs and the
emulator host's B + 1 µs; every file uses pid 1. Times below are on the controller's axis unless
said otherwise; the merged axis starts at n1's base, so controller time t is t + 500.5 there.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

from oddl.cli.main import main
from oddl.trace.files import TraceFileError, load_trace
from oddl.trace.merge import merge, merge_paths
from oddl.trace.summary import summarise

DATA = ROOT / "tests" / "data" / "traces"
RUN = DATA / "run"
BASE = 1764170000000000000


@pytest.fixture(scope="module")
def merged() -> dict[str, Any]:
    return merge_paths([str(RUN)])


def _named(doc: dict[str, Any]) -> dict[str, int]:
    return {e["args"]["name"]: e["pid"] for e in doc["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "process_name"}


def _one(doc: dict[str, Any], pid: int, name: str) -> dict[str, Any]:
    found = [e for e in doc["traceEvents"] if e.get("pid") == pid and e.get("name") == name
             and e.get("ph") != "M"]
    assert len(found) == 1, found
    return found[0]


def test_merge_rebases_every_file_onto_the_smallest_base_exactly(merged):
    """Controller t → t + 500.5; n0's local l (= t − 2) → l + 502.5; n1's local unchanged;
    the emulator host's local l (= t − 1) → l + 501.5. Time-point args move with their ts."""
    assert merged["baseTimeNanoseconds"] == BASE - 500500
    pids = _named(merged)
    assert _one(merged, pids["controller"], "retune itla-n0 -> ch 13")["ts"] == 335 + 500.5
    assert _one(merged, pids["device itla-n0"], "itla write FCF1")["ts"] == 335 + 500.5
    slot = _one(merged, pids["agent n0"], "step 1 -> n1")
    assert slot["ts"] == 410 + 500.5
    assert slot["args"]["planned_start_us"] == 400 + 500.5
    assert slot["args"]["gate_open_us"] == 410 + 500.5
    assert slot["args"]["gate_error_us"] == 10  # a difference: not moved
    assert _one(merged, pids["agent n1"], "step 0 -> n0")["ts"] == 98 + 500.5
    assert _one(merged, pids["emulators"], "settle")["ts"] == 375 + 500.5
    sources = {s["process"]: s["shift_us"] for s in merged["oddl"]["sources"]}
    assert sources == {"controller": 500.5, "agent-n0": 502.5, "agent-n1": 0.0,
                       "emulators": 501.5}


def test_merge_gives_colliding_pids_and_async_ids_fresh_numbers_and_keeps_names(merged):
    """Four files all on pid 1 (and the controller's devices on 2 and 3) become six processes
    with their names; the controller's circuit id 1 and the emulators' light id 1 no longer
    pair; every event's pid is named; the dropped counts add up."""
    pids = _named(merged)
    assert set(pids) == {"controller", "device itla-n0", "device wss-0", "agent n0",
                         "agent n1", "emulators"}
    assert len(set(pids.values())) == 6
    assert {e["pid"] for e in merged["traceEvents"]} <= set(pids.values())
    circuit = [e for e in merged["traceEvents"] if e.get("name") == "tx n0 -> rx n1 ch 12"]
    light = [e for e in merged["traceEvents"] if e.get("name") == "n0 -> n1 (ch 13)"]
    assert len({e["id"] for e in circuit}) == 1 and len({e["id"] for e in light}) == 1
    assert circuit[0]["id"] != light[0]["id"]
    assert merged["oddl"]["dropped"] == 2
    assert merged["oddl"]["testbed_sha256"] == "a1" * 32


def test_merge_takes_a_profiler_trace_from_before_torch_2_4_with_absolute_ts(tmp_path):
    """No baseTimeNanoseconds: its ts are epoch µs, so it shifts by −(merged base)/1000 µs."""
    old = tmp_path / "rank0.json"
    old.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0},
                               "traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "pid": 7,
                                                "tid": 7, "ts": BASE / 1000 + 250, "dur": 9}]}))
    doc = merge([load_trace(str(RUN / "controller.trace.json")), load_trace(str(old))])
    assert doc["baseTimeNanoseconds"] == 0 and doc["distributedInfo"] == {"rank": 0}
    ts = {e["name"]: e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert ts["ProfilerStep#1"] == BASE / 1000 + 250
    assert ts["retune itla-n0 -> ch 13"] == BASE / 1000 + 335


def _cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_truncated_file_is_refused_naming_it_and_the_fix(tmp_path, capsys):
    whole = (RUN / "agent-n0.trace.json").read_text()
    cut = tmp_path / "agent-n0.trace.json"
    cut.write_text(whole[: len(whole) // 2])
    with pytest.raises(TraceFileError, match=rf"{cut}: truncated .*stopped before it finished "
                                             "writing. Record again, or leave this file out"):
        load_trace(str(cut))
    code, _out, err = _cli(capsys, "trace", "merge", str(RUN / "controller.trace.json"),
                           str(cut), "-o", str(tmp_path / "t.json"))
    assert code == 2 and f"{cut}: truncated" in err
    assert not (tmp_path / "t.json").exists()
    code, _out, err = _cli(capsys, "trace", "summary", str(cut))
    assert code == 2 and "truncated" in err


@pytest.mark.parametrize("content, message", [
    ("", "empty; the process that records it writes it when recording stops"),
    ('{"traceEvents": [}', "not valid JSON at line 1 column 18"),
    ('{"events": []}', 'not a Chrome trace in object form \\(no "traceEvents" list\\)'),
    ('{"traceEvents": [{"ph": "X", "name": "a"}]}', r"traceEvents\[0\] \('a'\) has no numeric ts"),
    ('{"traceEvents": [], "oddl": {"format": "oddl-trace/9"}}', "oddl.format is 'oddl-trace/9', this oddl reads 'oddl-trace/1'"),
])
def test_files_that_are_not_traces_are_refused_with_the_reason(tmp_path, content, message):
    bad = tmp_path / "x.trace.json"
    bad.write_text(content)
    with pytest.raises(TraceFileError, match=f"{bad}: {message}"):
        load_trace(str(bad))


def test_a_file_of_another_testbed_is_refused_naming_both(tmp_path, capsys):
    other = DATA / "other-testbed" / "agent-n2.trace.json"
    code, _out, err = _cli(capsys, "trace", "merge", str(RUN), str(other),
                           "-o", str(tmp_path / "t.json"))
    assert code == 2
    assert (f"{other}: recorded on another testbed (testbed file sha256 b2b2b2b2b2b2…, "
            f"'fixture-2node') than {RUN / 'agent-n0.trace.json'} (a1a1a1a1a1a1…") in err
    testbed = tmp_path / "testbed.toml"
    testbed.write_text("# not the fixture's testbed file\n")
    code, _out, err = _cli(capsys, "trace", "summary", str(RUN), "--testbed", str(testbed))
    assert code == 2 and f"{RUN}: recorded on another testbed" in err
    code, _out, err = _cli(capsys, "trace", "merge", str(tmp_path), "-o", str(tmp_path / "x"))
    assert code == 2 and f"{tmp_path}: no *.trace.json files in this directory" in err


def test_summary_numbers_match_the_hand_computed_answer(merged):
    """Slots (gate error = open − planned; utilisation = data / slot): n0 step 0 +4 µs, 150/200;
    n0 step 1 +10 µs, 100/200; n1 step 0 −2 µs, 180/200; n1 step 1 +3 µs, 210/200 (the
    overrun). Mean |error| 19/4 = 4.75 µs; utilisation 640/800 = 0.8. The collective runs from
    n0's start (40) to n1's end (43 + 600): 603 µs. Bytes sent: 3 × 1 MiB + 2 × 2 MiB.

    The retune slot's guard runs from the edge (planned windows end at 300) to the grant (390):
    90 µs = hand-off 30 (to the last confirmation at 330) + other 5 (330 → the retune's start
    at 335) + command 17 (the union of the device commands 335–340 ∪ 338–344, 350–354,
    362–366) + tuning 14 (335 → 366 less the commands) + lock 14 (366 → the retune's end at
    380) + grant 10 (380 → 390)."""
    s = summarise(merged)
    t = s["totals"]
    assert [(x["node"], x["step"], x["gate_error_us"], x["utilisation"]) for x in s["slots"]] \
        == [("n1", 0, -2.0, 0.9), ("n0", 0, 4.0, 0.75), ("n1", 1, 3.0, 1.05),
            ("n0", 1, 10.0, 0.5)]
    assert t["gate_error_mean_us"] == 4.75 and t["gate_error_max_us"] == 10.0
    assert t["utilisation"] == 0.8 and t["bytes_sent"] == 3 * 2**20 + 2 * 2**21
    (c,) = s["collectives"]
    assert (c["collective"], c["kind"], c["bytes"], c["nodes"], c["duration_us"], c["slots"]) \
        == ("halving_doubling", "all_reduce", 4194304, ["n0", "n1"], 603.0, 4)
    assert (c["late_chunks"], c["lost_chunks"], c["overruns"]) == (1, 1, 1)
    (g,) = s["guards"]
    assert {k: g[k] for k in ("guard_us", "handoff_us", "command_us", "tuning_us", "lock_us",
                              "grant_us", "other_us")} == \
        {"guard_us": 90.0, "handoff_us": 30.0, "command_us": 17.0, "tuning_us": 14.0,
         "lock_us": 14.0, "grant_us": 10.0, "other_us": 5.0}
    assert g["transmitters"] == ["itla-n0"] and t["retunes"] == 1
    assert [(f["fault"], f["node"], f["by_us"]) for f in s["faults"]] == \
        [("late chunk", "n0", 12.0), ("overrun", "n1", 10.0), ("lost chunk", "n1", 0.0)]
    assert t["late_receptions"] == 1 and s["dropped"] == 2


def test_summary_cli_prints_text_and_json_and_reads_one_process_file(capsys, tmp_path):
    out_file = tmp_path / "timeline.json"
    code, out, err = _cli(capsys, "trace", "merge", str(RUN), "-o", str(out_file))
    assert code == 0 and "recorders dropped 2 events" in err
    code, out, _err = _cli(capsys, "trace", "summary", str(out_file))
    assert code == 0 and "overrun    at n1 job j1 seq 3 step 1 peer n0 by 10.0 µs" in out
    assert ("guard 90.0 µs: handoff 30.0 µs, other 5.0 µs, command 17.0 µs, tuning 14.0 µs, "
            "lock 14.0 µs, grant 10.0 µs") in out
    code, out, _err = _cli(capsys, "trace", "summary", str(RUN / "agent-n0.trace.json"),
                           "--json")
    one = json.loads(out)
    assert code == 0 and [x["gate_error_us"] for x in one["slots"]] == [4.0, 10.0]
    assert one["guards"] == [] and one["totals"]["late_chunks"] == 1


def test_plot_writes_a_png_with_a_row_per_node(tmp_path, capsys):
    png = tmp_path / "timeline.png"
    code, out, _err = _cli(capsys, "trace", "plot", str(RUN), "--out", str(png), "--json")
    assert code == 0 and json.loads(out) == {"out": str(png), "nodes": 2}
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width == 1200 and height > 200


def test_the_torch_tracer_counts_what_its_bounded_buffer_drops(tmp_path, monkeypatch):
    """Past its capacity a tracer drops and counts; its file says so. With ODDL_TRACE_DIR
    unset the backend's function is submitted unchanged."""
    from oddl.torch import trace as torch_trace

    monkeypatch.delenv(torch_trace.ENV_DIR, raising=False)

    def fn() -> list[Any]:
        return []
    with torch_trace.call(object(), "all_reduce", fn) as submitted:
        assert submitted is fn
    rec = torch_trace.Tracer(str(tmp_path), 3, buffer_events=2)
    for i in range(3):
        rec.add({"ph": "X", "cat": "torch", "name": "allreduce", "pid": 1, "tid": 1,
                 "ts": float(i), "dur": 1.0, "args": {}})
    path = rec.flush()
    doc = load_trace(path).doc
    assert Path(path).name == "torch-rank3.trace.json"
    assert (doc["oddl"]["recorded"], doc["oddl"]["dropped"]) == (2, 1)
    assert torch_trace.c10d_name("reduce_scatter_tensor(MAX)") == "_reduce_scatter_base"


def test_plot_of_one_collective_and_of_one_that_is_not_there(tmp_path, capsys):
    """--job/--seq keep that collective's events (and the device commands within its span);
    a job the trace does not hold is refused, listing what it holds."""
    from oddl.trace.plot import collect_rows, select

    doc = merge_paths([str(RUN)])
    rows, _t0 = collect_rows(select(doc, "j1", 3))
    assert rows["n0"].retunes == [(335 + 500.5, 45)] and len(rows["n1"].slots) == 2
    code, _out, err = _cli(capsys, "trace", "plot", str(RUN), "--out", str(tmp_path / "x.png"),
                           "--job", "j9")
    assert code == 2 and "no events of job j9 seq any; the trace holds (job, seq) [('j1', 3)]" \
        in err
    assert not (tmp_path / "x.png").exists()


def test_an_agent_made_late_on_purpose_shows_as_overruns_in_the_summary(tmp_path, capsys):
    """A gated ring on real stream links (tests/common/test_trace_record.py's scenario) whose rank 2
    starts 0.5 s late: the summary gives n2's slots a gate error above 0.4 s and counts its
    overruns (the others', who wait for its data, too), and the text names them."""
    from gated_ring import gated_ring

    from oddl.common.tracing import TRACE

    TRACE.start(tmp_path, "agents-in-process",
                meta={"testbed": "in-process", "testbed_sha256": "c3" * 32})
    try:
        gated_ring(late_rank=2, delay_s=0.5, slot_s=0.02)
    finally:
        path = TRACE.stop()
    assert path is not None
    s = summarise(load_trace(str(path)).doc)
    (c,) = s["collectives"]
    late = [sl for sl in s["slots"] if sl["node"] == "n2"]
    assert late and min(sl["gate_error_us"] for sl in late) > 400_000
    assert c["overruns"] > 0 and "n2" in {f["node"] for f in s["faults"]
                                          if f["fault"] == "overrun"}
    code, out, _err = _cli(capsys, "trace", "summary", str(path))
    assert code == 0 and "overrun    at n2" in out
