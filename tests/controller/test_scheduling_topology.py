"""The scheduling core's topology: the channel grid, the timing model and the fabric's
invariants (moved from test_scheduler.py)."""

from __future__ import annotations

import dataclasses

import pytest
from plan_checks import TESTBED_TIMING as TIMING

from oddl.common.errors import ScheduleError
from oddl.controller.scheduling import Grid, NodeSpec, Topology, WssSpec


def test_grid_maps_channels_and_frequencies() -> None:
    grid = Grid(193.1, 100.0, 48)
    assert grid.frequency_thz(1) == 193.1
    assert grid.frequency_thz(4) == pytest.approx(193.4)
    assert grid.channel_of(193.4) == 4
    assert grid.channel_of(193.4004) == 4
    assert grid.channel_of(193.45) is None
    assert grid.channel_of(193.0) is None
    with pytest.raises(ScheduleError, match="channel 49 is off the grid; use 1..48"):
        grid.frequency_thz(49)


def test_timing_guard_is_command_tune_skew_cdr() -> None:
    assert TIMING.guard_s == pytest.approx(2e-3 + 2e-3 + 1e-4 + 1e-5)
    assert TIMING.hold_s(1250) == pytest.approx(1e-6)
    with pytest.raises(ScheduleError, match="tune_s must be a finite time >= 0 s; got -1"):
        dataclasses.replace(TIMING, tune_s=-1.0)
    with pytest.raises(ScheduleError, match="line_rate_bps must be positive"):
        dataclasses.replace(TIMING, line_rate_bps=0.0)


@pytest.mark.parametrize(
    ("nodes", "wss", "message"),
    [
        (
            [NodeSpec("a", "t1", 1, "w", 1), NodeSpec("a", "t2", 2, "w", 2)],
            2,
            "node id 'a' appears twice",
        ),
        (
            [NodeSpec("a", "t1", 1, "w", 1), NodeSpec("b", "t1", 2, "w", 2)],
            2,
            "transmitter id 't1'",
        ),
        (
            [NodeSpec("a", "t1", 1, "w", 1), NodeSpec("b", "t2", 1, "w", 2)],
            2,
            "both receive on channel 1",
        ),
        (
            [NodeSpec("a", "t1", 1, "w", 1), NodeSpec("b", "t2", 2, "w", 1)],
            2,
            "both hang on out-port 1",
        ),
        ([NodeSpec("a", "t1", 1, "w", 3)], 2, "out-ports 1..2"),
        ([NodeSpec("a", "t1", 9, "w", 1)], 2, "channel 9, off the grid"),
        ([NodeSpec("a", "t1", 1, "v", 1)], 2, "unknown WSS 'v'"),
    ],
)
def test_topology_checks_its_invariants(nodes: list[NodeSpec], wss: int, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        Topology(Grid(193.1, 100.0, 8), tuple(nodes), (WssSpec("w", wss),))


def test_single_wss_helper() -> None:
    topo = Topology.single_wss(3)
    assert topo.node_ids == ("node0", "node1", "node2")
    assert topo.node("node2") == NodeSpec("node2", "tx2", 3, "wss0", 3)
    assert topo.wss_spec("wss0").ports == 3
    with pytest.raises(ScheduleError, match="grid has 2"):
        Topology.single_wss(3, Grid(193.1, 100.0, 2))
    with pytest.raises(ScheduleError, match="unknown node 'x'; known: 'node0'"):
        topo.node("x")
