"""Writes the hand-built fixture run of tests/top/test_trace_tools.py (run from the repo root:
`python tests/data/traces/make_fixture.py`); the files it writes are checked in beside it.

Two nodes, one halving-doubling all-reduce (job j1, seq 3) with two slots per node and one retune
slot (slot 1: itla-n0 from ch 12 to ch 13). Times are chosen on the controller's axis (µs from
BASE) and each agent writes them on its own axis, as the format says: n0's base is 2 µs after
the controller's, n1's 500.5 µs before it, the emulator host's 1 µs after. Every agent and the
controller use pid 1, so merging must renumber them. The answers the test expects are worked out
by hand in the test's docstrings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BASE = 1764170000000000000
SHA = "a1" * 32
OTHER_SHA = "b2" * 32
HERE = Path(__file__).parent
J = {"job": "j1", "seq": 3}


def header(process: str, base: int, sha: str = SHA, dropped: int = 0) -> dict[str, Any]:
    return {"format": "oddl-trace/1", "testbed": "fixture-2node", "testbed_sha256": sha,
            "process": process, "host": "bench", "clock": {"offset_ns": 0, "error_bound_ns": 0},
            "buffer_events": 1000, "recorded": 0, "dropped": dropped,
            "started_ns": base, "stopped_ns": base + 2_000_000}


def meta(pid: int, name: str, threads: dict[int, str]) -> list[dict[str, Any]]:
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}]
    out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": n}}
            for t, n in threads.items()]
    return out


def x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float, **args: Any) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def span(cat: str, name: str, pid: int, ident: int, ts: float, end: float, **args: Any) -> list:
    return [{"ph": "b", "cat": cat, "name": name, "pid": pid, "tid": 0, "id": ident, "ts": ts,
             "args": args},
            {"ph": "e", "cat": cat, "name": name, "pid": pid, "tid": 0, "id": ident, "ts": end}]


def instant(cat: str, name: str, pid: int, ts: float, **args: Any) -> dict:
    return {"ph": "i", "s": "p", "cat": cat, "name": name, "pid": pid, "tid": 0, "ts": ts,
            "args": args}


def controller() -> list[dict[str, Any]]:
    ev = meta(1, "controller", {0: "control"}) + meta(2, "device itla-n0", {1: "itla-n0"})
    ev += meta(3, "device wss-0", {1: "port 1"})
    for node, peer in (("n0", "n1"), ("n1", "n0")):
        for step, (s, e) in enumerate(((100, 300), (400, 600))):
            ev += span("plan", f"plan step {step} -> {peer}", 1, 10 + step + 2 * (node == "n1"),
                       s, e, **J, step=step, node=node, peer=peer, planned_start_us=s,
                       planned_end_us=e)
    ev += span("circuit", "tx n0 -> rx n1 ch 12", 1, 1, 90, 330, **J, slot=0, src="n0",
               dst="n1", channel=12)
    ev += span("circuit", "tx n0 -> rx n1 ch 13", 1, 2, 380, 610, **J, slot=1, src="n0",
               dst="n1", channel=13)
    ev += span("circuit", "tx n1 -> rx n0 ch 20", 1, 3, 90, 610, **J, slot=0, src="n1",
               dst="n0", channel=20)
    ev += [instant("control", "barrier start", 1, 50, **J),
           instant("control", "handoff confirmed", 1, 320, **J, slot=0, node="n1"),
           instant("control", "handoff confirmed", 1, 330, **J, slot=0, node="n0"),
           instant("control", "grant", 1, 390, **J, slot=1)]
    ev.append(x("retune", "retune itla-n0 -> ch 13", 1, 0, 335, 45, **J, slot=1,
                transmitter="itla-n0", channel=13, wss="wss-0", in_port=1, out_port=2))
    for name, pid, ts, dur in (("itla write FCF1", 2, 335, 5), ("wss route", 3, 338, 6),
                               ("itla read NOP", 2, 350, 4), ("itla read NOP", 2, 362, 4)):
        ev.append(x("device", name, pid, 1, ts, dur, device=name.split()[0], command=name,
                    ok=True, result="ok"))
    return ev


def agent(node: str, peer: str, shift: float, slots: list[tuple[float, float, float, float]],
          sends: list[tuple[int, float, float, int]]) -> list[dict[str, Any]]:
    """`slots`: (planned start, gate open, data µs, slot µs) on the controller's axis."""
    ev = meta(1, f"agent {node}", {1: "slots", 2: "send", 3: "recv", 4: "calls"})
    ev.append(x("collective", "halving_doubling all_reduce", 1, 4, 40 + (node == "n1") * 3
                + shift, 600, **J, collective="halving_doubling", kind="all_reduce",
                bytes=4194304, step=7))
    for step, (planned, gate, data, length) in enumerate(slots):
        ev.append(x("slot", f"step {step} -> {peer}", 1, 1, gate + shift, data, **J, step=step,
                    peer=peer, planned_start_us=planned + shift, gate_open_us=gate + shift,
                    gate_error_us=gate - planned, data_us=data, slot_us=length))
    for step, ts, dur, nbytes in sends:
        ev.append(x("chunk", "send", 1, 2, ts + shift, dur, **J, step=step, peer=peer,
                    offset=0, bytes=nbytes))
    return ev


def agents() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    n0 = agent("n0", "n1", -2.0, [(100, 104, 150, 200), (400, 410, 100, 200)],
               [(0, 104, 75, 1048576), (0, 179, 75, 1048576), (1, 410, 100, 1048576)])
    n0 += [x("chunk", "recv", 1, 3, 180 - 2.0, 20, **J, step=0, peer="n1", offset=0,
             bytes=2097152, late_us=0),
           x("chunk", "recv", 1, 3, 520 - 2.0, 10, **J, step=1, peer="n1", offset=0,
             bytes=2097152, late_us=12),
           instant("fault", "late chunk", 1, 520 - 2.0, **J, step=1, peer="n1", by_us=12)]
    n1 = agent("n1", "n0", 500.5, [(100, 98, 180, 200), (400, 403, 210, 200)],
               [(0, 98, 180, 2097152), (1, 403, 210, 2097152)])
    n1 += [instant("fault", "overrun", 1, 613 + 500.5, **J, step=1, peer="n0", by_us=10),
           instant("fault", "lost chunk", 1, 650 + 500.5, **J, step=1, peer="n0", by_us=0)]
    return n0, n1


def emulators() -> list[dict[str, Any]]:
    ev = meta(1, "emulators", {1: "light"})
    ev += span("light", "n0 -> n1 (ch 13)", 1, 1, 375 - 1.0, 615 - 1.0, src="n0", receiver="n1",
               channel=13, settle_us=5)
    ev.append(x("light", "settle", 1, 1, 375 - 1.0, 5))
    ev.append({"ph": "C", "cat": "power", "name": "power dBm", "pid": 1, "tid": 0,
               "ts": 376 - 1.0, "args": {"rx n1": -3.5}})
    return ev


def write(path: Path, events: list[dict[str, Any]], head: dict[str, Any]) -> None:
    head = {**head, "recorded": len(events)}
    doc = {"traceEvents": events, "displayTimeUnit": "ns",
           "baseTimeNanoseconds": head["started_ns"], "oddl": head}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    run = HERE / "run"
    n0, n1 = agents()
    write(run / "controller.trace.json", controller(), header("controller", BASE))
    write(run / "agent-n0.trace.json", n0, header("agent-n0", BASE + 2000))
    write(run / "agent-n1.trace.json", n1, header("agent-n1", BASE - 500500, dropped=2))
    write(run / "emulators.trace.json", emulators(), header("emulators", BASE + 1000))
    write(HERE / "other-testbed" / "agent-n2.trace.json", agent("n2", "n3", 0.0, [], []),
          header("agent-n2", BASE, sha=OTHER_SHA))


if __name__ == "__main__":
    main()
