"""A controller that stays behind still finds the dead (decision record 0038).

The monitor holds its read-time verdicts while heartbeats are read late (0034); a held sweep
judges by the agents' own send times against the send front, and once the hold has lasted
`HOLD_CAP_INTERVALS`, by read silence with the lateness as grace. Every clock here is
constructed: each heartbeat is read at a chosen monotonic and wall time.
"""

from __future__ import annotations

import time
from pathlib import Path

from oddl.common.config import load_testbed
from oddl.controller.devices import DeviceManager
from oddl.controller.heartbeat_lateness import HOLD_CAP_INTERVALS, send_front_ns
from oddl.controller.servicer import ControllerService
from oddl.launch.shapes import control_plane
from oddl.protos import oddl_pb2 as pb

NODES = tuple(f"n{k}" for k in range(5))


class Clocks:
    """A monotonic and a wall clock that move together, by hand."""

    def __init__(self) -> None:
        self.mono0, self.wall0 = time.monotonic(), time.time_ns()
        self.t = 0.0

    @property
    def mono(self) -> float:
        return self.mono0 + self.t

    def wall_ns(self, at: float) -> int:
        return self.wall0 + round(at * 1e9)


def service_of(tmp_path: Path) -> tuple[ControllerService, float]:
    path = tmp_path / "cp.toml"
    path.write_text(control_plane(len(NODES)), encoding="utf-8")
    cfg = load_testbed(path)
    service = ControllerService(cfg, DeviceManager(cfg, drivers={}))
    service.loop_lag = lambda: 0.0
    for n in NODES:
        service.core.register(pb.RegisterAgentRequest(node_id=n))
    return service, service.core.registry.interval_s


def beat(service: ControllerService, clocks: Clocks, node: str, sent: float,
         send_times: bool = True) -> None:
    """`node`'s heartbeat sent at `sent` (s on the constructed clock) read now."""
    registry = service.core.registry
    registry.heartbeat(pb.HeartbeatRequest(
        node_id=node, session=registry.agents[node].session,
        sent_ns=clocks.wall_ns(sent) if send_times else 0),
        now=clocks.mono, now_ns=clocks.wall_ns(clocks.t))


def run(service: ControllerService, clocks: Clocks, interval: float, steps: int,
        lateness: float, killed: dict[str, float], timeless: str = "") -> dict[str, float]:
    """Every agent beats each interval; the controller reads on time at first, then falls
    behind (it reads half an interval of beats an interval) until it reads each beat
    `lateness` s after it was sent; it sweeps every half interval. `killed`: node -> when it
    stops sending; `timeless`: a node that sends no times. When each node was declared dead."""
    died: dict[str, float] = {}
    for k in range(1, 2 * steps + 1):
        clocks.t = k * interval / 2
        sent = clocks.t - min(lateness, max(0.0, (clocks.t - 2 * interval) / 2))
        if k % 2 == 0:
            for n in NODES:
                if sent < killed.get(n, float("inf")):
                    beat(service, clocks, n, sent, send_times=n != timeless)
        service.sweep(clocks.mono)
        for n in NODES:
            if n not in died and service.core.registry.dead(n):
                died[n] = clocks.t
    return died


def test_a_kill_during_a_long_lateness_is_found_within_the_bound(tmp_path: Path) -> None:
    service, interval = service_of(tmp_path)
    clocks = Clocks()
    lateness = 6 * interval  # in the end every beat waits six intervals unread
    kill = 10 * interval
    died = run(service, clocks, interval, 40, lateness, {"n4": kill})
    assert set(died) == {"n4"}, died  # the others' beats only waited: none is dead
    # found while held: three intervals of send time behind the front, which the
    # controller sees one lateness later (plus a beat and a sweep); the cap's read silence
    # (three intervals and twice the lateness) would have taken longer
    assert died["n4"] - kill <= 3 * interval + lateness + 1.5 * interval, died
    assert service.held_since is not None and service.held_since < clocks.mono0 + kill
    assert service.core.errors["sweep held: heartbeats read late"] >= 50
    assert service.core.errors["agent lost"] == 1
    service.close()


def test_a_whole_fleet_read_ever_later_is_not_declared_dead(tmp_path: Path) -> None:
    # the controller falls ever further behind: the gaps between the beats it reads grow
    # from one interval to four, so each agent is read-silent four intervals at a time (and
    # in none of them is anything read), all alike, long past the hold's cap
    service, interval = service_of(tmp_path)
    clocks = Clocks()
    registry = service.core.registry
    gaps = [1.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5] + [4.0] * 22
    reads = [(sum(gaps[:s]) * interval, s * interval) for s in range(1, len(gaps) + 1)]
    died: dict[str, float] = {}
    for k in range(1, 2 * 100 + 1):
        clocks.t = k * interval / 2
        while reads and reads[0][0] <= clocks.t:
            _, sent = reads.pop(0)
            for n in NODES:
                beat(service, clocks, n, sent)
        service.sweep(clocks.mono)
        died.update({n: clocks.t for n in NODES if n not in died and registry.dead(n)})
    assert died == {}
    assert service.core.errors["sweep held: heartbeats read late"] >= 2 * HOLD_CAP_INTERVALS
    assert service.held_since is not None and \
        clocks.mono - service.held_since > HOLD_CAP_INTERVALS * interval  # capped, none lost
    service.close()


def test_a_capped_hold_finds_an_agent_that_sends_no_times(tmp_path: Path) -> None:
    # without send times (an agent whose clock is unbounded) only the cap can find it: read
    # silence beyond three intervals and twice the lateness, once the hold has lasted long
    service, interval = service_of(tmp_path)
    clocks = Clocks()
    lateness = 4 * interval
    kill = 8 * interval  # n4 sends no times: the send front cannot judge it
    died = run(service, clocks, interval, 60, lateness, {"n4": kill}, timeless="n4")
    assert set(died) == {"n4"}, died
    held = service.held_since - clocks.mono0 if service.held_since is not None else 0.0
    assert held > 0
    # its last beat (an interval before the kill) is read one lateness after it was sent;
    # the hold began before; the cap comes HOLD_CAP_INTERVALS after the hold began, and then
    # three intervals and twice the lateness of read silence (plus a sweep)
    last_read = kill - interval + lateness
    found_by = max(held + HOLD_CAP_INTERVALS * interval, last_read + 3 * interval + 2 * lateness)
    assert last_read + 3 * interval + 2 * lateness <= died["n4"] <= found_by + interval, died
    service.close()


def test_the_send_front_is_what_most_agents_sent_by() -> None:
    assert send_front_ns([]) == 0
    assert send_front_ns([5, 1, 9, 7]) == 5  # three of four sent at 5 or later
    assert send_front_ns([0, 0, 0, 8]) == 0  # most send no times: no front
    assert send_front_ns([3]) == 3


def test_a_backlog_read_after_a_stall_is_not_a_death(tmp_path: Path) -> None:
    # the whole controller stalls eight intervals (its loop and its monitor); then it reads
    # the waiting beats, most agents' first: the one read last is not dead, its beats waited
    service, interval = service_of(tmp_path)
    clocks = Clocks()
    registry = service.core.registry
    for t in (1.0, 2.0, 3.0, 4.0):
        clocks.t = t * interval
        for n in NODES:
            beat(service, clocks, n, clocks.t)
        service.sweep(clocks.mono)
    clocks.t = 12 * interval
    service.loop_lag = lambda: 8 * interval
    assert not service.sweep(clocks.mono)  # the monitor wakes to a loop eight intervals late
    service.loop_lag = lambda: 0.0
    clocks.t = 12.5 * interval
    for sent in range(5, 13):
        for n in NODES[:4]:
            beat(service, clocks, n, sent * interval)
    assert not service.sweep(clocks.mono)
    assert not any(registry.dead(n) for n in NODES)  # n4's beats still wait unread
    clocks.t = 14 * interval
    for sent in range(5, 14):
        beat(service, clocks, "n4", sent * interval)
    for n in NODES[:4]:
        beat(service, clocks, n, 13 * interval)
    service.sweep(clocks.mono)
    assert not any(registry.dead(n) for n in NODES)
    service.close()
