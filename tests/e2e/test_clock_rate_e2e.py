"""End to end: an agent whose clock is shifted (ODDL_CLOCK_SHIFT_US) still gates its slots on
the controller's time, and a line rate far above what the links carry is named.

Every process is the command a lab runs; the shift goes through the agent's own clock seam.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import EMULATED, wait_for

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all as run_on_all
from oddl.launch.testbed import RunningTestbed, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SHIFT_US = 3000.0
SHIFTED = "n2"


def _exact_runs(clients: list[AgentClient], seed: int, n: int, runs: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(runs):
        arrays = [rng.integers(-2**40, 2**40, n) for _ in clients]
        exact = np.sum(arrays, axis=0)
        for out in run_on_all(clients, arrays)[1]:
            assert isinstance(out, np.ndarray), out
            assert np.array_equal(out, exact)


def _starts(status: dict[str, Any], job: str, shift_s: float) -> dict[int, float]:
    """Each collective's first slot start of `job` on the real clock (the shift removed)."""
    return {int(seq): start - shift_s for job_id, seq, _called, start
            in status["collective_starts"] if job_id == job}


def test_a_shifted_agent_is_found_and_its_slots_hold(tmp_path: Path):
    with RunningTestbed(tmp_path, EMULATED,
                        agent_env={SHIFTED: {"ODDL_CLOCK_SHIFT_US": f"{SHIFT_US:g}"}}) as tb:
        nodes = tb.launched.node_ids
        clients = dict(zip(nodes, tb.clients, strict=True))
        # the estimate finds the shift within its stated bound (controller minus agent)
        s = wait_for(lambda: all(c.status()["clock_error_bound_s"] for c in tb.clients)
                     and clients[SHIFTED].status(), 60.0,
                     "a bounded clock estimate at every agent")
        assert s["clock_shift_s"] == pytest.approx(SHIFT_US / 1e6)
        assert s["clock_samples_via"] == "udp"
        assert abs(s["clock_offset_s"] + SHIFT_US / 1e6) <= s["clock_error_bound_s"] < 1e-3
        for node, c in clients.items():
            if node != SHIFTED:
                st = c.status()
                assert abs(st["clock_offset_s"]) <= st["clock_error_bound_s"], (node, st)
        listed = {a["node_id"]: a for a in tb.operator.status()["agents"]}
        assert float(listed[SHIFTED]["clock_error_bound_s"]) < 1e-3
        for collective in ("ring", "halving-doubling"):
            job = tb.operator.submit(f"shift-{collective}", [], collective, "optical")
            _exact_runs(tb.clients, 7, 200_000, 4)  # the barrier, then standing starts
            # every slot edge is the collective's start plus the slot's offset in the
            # schedule, so slots hold when every node starts at the same real time. On its
            # own clock the shifted node starts 3 ms later than the others (the shift is in
            # force where it gates); on the real clock at the same moment, within the clock
            # bounds (an uncorrected shift would put it 3 ms off, and its slots with it)
            local = {n: _starts(c.status(), job["id"], 0.0) for n, c in clients.items()}
            assert len(local[SHIFTED]) == 4
            for seq, t in local[SHIFTED].items():
                for node in nodes:
                    if node != SHIFTED:
                        assert abs(t - SHIFT_US / 1e6 - local[node][seq]) < 1e-3, \
                            (collective, seq, node, local)
                        assert abs(t - local[node][seq]) > 2e-3
            tb.operator.cancel(job["id"])


def test_a_line_rate_far_above_the_links_is_named(tmp_path: Path):
    config = write_config(EMULATED, tmp_path / "absurd.toml", {
        'link = "fabric"': 'link = "direct"', "line_rate_gbps = 3.0": "line_rate_gbps = 10000.0"})
    with RunningTestbed(tmp_path, config) as tb:
        job = tb.operator.submit("absurd", [], "ring", "optical")
        _exact_runs(tb.clients, 8, 2_000_000, 2)  # 16 MB: 1 MiB chunks at every node
        log = tmp_path / "agent-n0.log"
        text = wait_for(lambda: (
            "well below [fabric] line_rate_gbps = 10000" in log.read_text(errors="replace")
            and log.read_text(errors="replace")), 60.0, "the line-rate warning in n0's log")
        assert str(tb.resolved) in text  # the file this agent runs with
        assert "Set [fabric] line_rate_gbps to what the links carry" in text
        assert text.count("well below [fabric] line_rate_gbps") == 1  # once per excursion
        measured = tb.clients[0].status()["measured_line_rate_gbps"]
        assert 0 < measured < 8000
        agents = wait_for(lambda: all(
            float(a.get("measured_line_rate_gbps", 0)) > 0
            for a in tb.operator.status()["agents"]) and tb.operator.status()["agents"], 60.0,
            "the measured rate in `oddl status`")
        assert all(float(a["measured_line_rate_gbps"]) < 8000 for a in agents)
        with urllib.request.urlopen(tb.metrics["n0"], timeout=10) as reply:
            metrics = reply.read().decode()
        assert 'oddl_agent_link_rate_bits_per_second{node="n0"}' in metrics
        assert 'oddl_agent_clock_error_bound_seconds{node="n0"}' in metrics
        tb.operator.cancel(job["id"])
