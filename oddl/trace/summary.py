"""`oddl trace summary`: the numbers a researcher quotes from one timeline. Pure: a trace
document (one process's file or a merged timeline) in, a JSON-able dict out.

- per slot (the agents' `slot` events): planned against actual start (gate error), data time
  against slot length (utilisation);
- per collective (the agents' `collective` events, joined on job and sequence number): its
  duration across nodes, its slots' worst gate error and utilisation, its faults;
- per retune slot (the controller's `retune` events of one job, sequence and slot): the guard
  time and what it went to. The guard runs from the edge (the latest planned window of the
  collective that ended before the first retune began; the first retune's start when no plan
  was recorded) to the grant (the first after the retunes), and splits along that time line:
  `handoff` (edge → the last hand-off confirmation before the first retune: waiting for the
  receivers of the previous flows), `other` (from there to the first retune command: the
  controller's reaction), `command` (device commands on the wire during the retunes, overlaps
  counted once), `tuning` (the rest until the last device command ended: the lasers settling
  while the controller polled them), `lock` (from there to the last retune's end: the
  receivers' lock), `grant` (from there to the grant). The parts add up to the guard;
- faults (`late chunk`, `lost chunk`, `overrun`) and late receptions; totals of all of it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

Event = dict[str, Any]
Key = tuple[Any, Any]

GUARD_PARTS = ("handoff", "other", "command", "tuning", "lock", "grant")


def process_names(events: Iterable[Event]) -> dict[Any, str]:
    """pid → the name its `process_name` metadata gives (`agent n0`, `controller`, ...)."""
    return {e.get("pid"): str(e.get("args", {}).get("name", ""))
            for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}


def node_of(pid_name: str) -> str:
    """`agent n0` → `n0`; any other process keeps its name."""
    return pid_name[len("agent "):] if pid_name.startswith("agent ") else pid_name


def _of(events: list[Event], cat: str, ph: str | None = None) -> list[Event]:
    return [e for e in events if e.get("cat") == cat and (ph is None or e.get("ph") == ph)]


def _key(e: Event) -> Key:
    a = e.get("args", {})
    return (a.get("job"), a.get("seq"))


def summarise(doc: dict[str, Any]) -> dict[str, Any]:
    """The summary of a trace document (see the module docstring)."""
    events: list[Event] = [e for e in doc.get("traceEvents", []) if isinstance(e, dict)]
    names = process_names(events)
    slots = _slots(events, names)
    faults = _faults(events, names)
    guards = _guards(events)
    collectives = _collectives(events, names, slots, faults)
    head = doc.get("oddl", {}) if isinstance(doc.get("oddl"), dict) else {}
    return {"testbed": head.get("testbed", ""), "recorded": head.get("recorded"),
            "dropped": head.get("dropped", 0), "collectives": collectives, "slots": slots,
            "guards": guards, "faults": faults,
            "totals": _totals(collectives, slots, guards, faults, events)}


def _slots(events: list[Event], names: dict[Any, str]) -> list[dict[str, Any]]:
    out = []
    for e in sorted(_of(events, "slot", "X"), key=lambda e: e["ts"]):
        a = e.get("args", {})
        slot_us = float(a.get("slot_us", 0.0))
        data_us = float(a.get("data_us", 0.0))
        out.append({"job": a.get("job"), "seq": a.get("seq"), "step": a.get("step"),
                    "node": node_of(names.get(e.get("pid"), "")), "peer": a.get("peer"),
                    "planned_start_us": a.get("planned_start_us"),
                    "gate_open_us": a.get("gate_open_us"),
                    "gate_error_us": float(a.get("gate_error_us", 0.0)),
                    "data_us": data_us, "slot_us": slot_us,
                    "utilisation": data_us / slot_us if slot_us > 0 else None})
    return out


def _faults(events: list[Event], names: dict[Any, str]) -> list[dict[str, Any]]:
    out = []
    for e in sorted(_of(events, "fault"), key=lambda e: e["ts"]):
        a = e.get("args", {})
        out.append({"fault": e.get("name"), "node": node_of(names.get(e.get("pid"), "")),
                    "job": a.get("job"), "seq": a.get("seq"), "step": a.get("step"),
                    "peer": a.get("peer"), "by_us": float(a.get("by_us", 0.0)), "ts": e["ts"]})
    return out


def _collectives(events: list[Event], names: dict[Any, str], slots: list[dict[str, Any]],
                 faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    calls: dict[Key, list[Event]] = defaultdict(list)
    for e in _of(events, "collective", "X"):
        calls[_key(e)].append(e)
    out = []
    for key, evs in sorted(calls.items(), key=lambda kv: min(e["ts"] for e in kv[1])):
        a = evs[0].get("args", {})
        start = min(e["ts"] for e in evs)
        end = max(e["ts"] + e.get("dur", 0.0) for e in evs)
        mine = [s for s in slots if (s["job"], s["seq"]) == key]
        bad = [f for f in faults if (f["job"], f["seq"]) == key]
        data = sum(s["data_us"] for s in mine)
        length = sum(s["slot_us"] for s in mine)
        out.append({"job": key[0], "seq": key[1], "collective": a.get("collective"),
                    "kind": a.get("kind"), "bytes": a.get("bytes"), "step": a.get("step"),
                    "nodes": sorted(node_of(names.get(e.get("pid"), "")) for e in evs),
                    "start_us": start, "duration_us": end - start, "slots": len(mine),
                    "gate_error_max_us": max((abs(s["gate_error_us"]) for s in mine),
                                             default=None),
                    "utilisation": data / length if length > 0 else None,
                    **_fault_counts(bad)})
    return out


def _fault_counts(faults: list[dict[str, Any]]) -> dict[str, int]:
    return {"late_chunks": sum(f["fault"] == "late chunk" for f in faults),
            "lost_chunks": sum(f["fault"] == "lost chunk" for f in faults),
            "overruns": sum(f["fault"] == "overrun" for f in faults)}


def _guards(events: list[Event]) -> list[dict[str, Any]]:
    retunes: dict[tuple[Any, Any, Any], list[Event]] = defaultdict(list)
    for e in _of(events, "retune", "X"):
        a = e.get("args", {})
        retunes[(a.get("job"), a.get("seq"), a.get("slot"))].append(e)
    control = _of(events, "control")
    plan_ends = [_plan_end(e) for e in _of(events, "plan", "b")]
    devices = _of(events, "device", "X")
    out = []
    for key, evs in sorted(retunes.items(), key=lambda kv: min(e["ts"] for e in kv[1])):
        mine = [c for c in control if _key(c) == key[:2]]
        out.append(_guard(key, evs, mine, [end for k, end in plan_ends if k == key[:2]],
                          devices))
    return out


def _plan_end(e: Event) -> tuple[Key, float]:
    return (_key(e), float(e.get("args", {}).get("planned_end_us", float("nan"))))


def _guard(key: tuple[Any, Any, Any], retunes: list[Event], control: list[Event],
           plan_ends: list[float], devices: list[Event]) -> dict[str, Any]:
    """One retune slot's guard on its time line: edge ≤ last hand-off ≤ first retune start
    (r0) ≤ last retune end (r1) ≤ grant; the parts add up to the guard."""
    r0 = min(e["ts"] for e in retunes)
    r1 = max(e["ts"] + e.get("dur", 0.0) for e in retunes)
    edge = max((end for end in plan_ends if end <= r0), default=r0)
    handoff = max((c["ts"] for c in control if c.get("name") == "handoff confirmed"
                   and edge <= c["ts"] <= r0), default=edge)
    grant = min((c["ts"] for c in control if c.get("name") == "grant" and c["ts"] >= r1),
                default=r1)
    wire = [(max(d["ts"], r0), min(d["ts"] + d.get("dur", 0.0), r1)) for d in devices
            if d["ts"] < r1 and d["ts"] + d.get("dur", 0.0) > r0]
    command = _union_us(wire)
    last_command = max((end for _s, end in wire), default=r0)
    parts = {"handoff": handoff - edge, "command": command,
             "tuning": last_command - r0 - command, "lock": r1 - last_command,
             "grant": grant - r1}
    guard = grant - edge
    parts["other"] = guard - sum(parts.values())  # from the last hand-off to the first command
    return {"job": key[0], "seq": key[1], "slot": key[2], "edge_us": edge, "guard_us": guard,
            "transmitters": sorted({str(e.get("args", {}).get("transmitter")) for e in retunes}),
            "retunes": len(retunes), **{f"{p}_us": v for p, v in parts.items()}}


def _union_us(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of intervals (overlapping commands counted once)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _totals(collectives: list[dict[str, Any]], slots: list[dict[str, Any]],
            guards: list[dict[str, Any]], faults: list[dict[str, Any]],
            events: list[Event]) -> dict[str, Any]:
    data = sum(s["data_us"] for s in slots)
    length = sum(s["slot_us"] for s in slots)
    errors = [abs(s["gate_error_us"]) for s in slots]
    recv = _of(events, "chunk", "X")
    return {"collectives": len(collectives), "slots": len(slots),
            "gate_error_mean_us": sum(errors) / len(errors) if errors else None,
            "gate_error_max_us": max(errors, default=None),
            "utilisation": data / length if length > 0 else None,
            "retunes": sum(g["retunes"] for g in guards),
            "guard_us": sum(g["guard_us"] for g in guards),
            **{f"guard_{p}_us": sum(g[f"{p}_us"] for g in guards) for p in GUARD_PARTS},
            "bytes_sent": sum(int(e.get("args", {}).get("bytes", 0)) for e in recv
                              if e.get("name") == "send"),
            "late_receptions": sum(float(e.get("args", {}).get("late_us", 0)) > 0 for e in recv
                                   if e.get("name") == "recv"),
            **_fault_counts(faults)}
