"""Ground truth at small scale: the simulator's prediction vs the emulated four-node testbed.

Starts the emulated testbed with real processes (emulators and fabric, controller, four
agents), from a copy of deploy/testbeds/emulated-4node.toml whose line rate is lowered to
10 Mbit/s so that serialisation dominates Python's per-frame costs on a loaded 2-core machine.
For each case it measures the median all-reduce time of a tiny (256 B) and a large (256 KiB)
message, alternating them, and compares the large one with the simulator's prediction: the
same schedule the controller builds (line rate and device timing from the testbed file), plus
the launch margin from the file, plus the fixed overheads measured by the tiny all-reduce.
The a-priori prediction (fixed overheads from docs/sources.md §7) is printed alongside.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import EMULATED

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import allreduce_all
from oddl.launch.testbed import RunningTestbed
from oddl.offline.simulator.testbed import calibrate, predict_testbed_allreduce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

RATE_GBPS = 0.01
TINY_ELEMS = 64
LARGE_ELEMS = 65_536
REPEATS = 5
TOLERANCE = 0.15


class Bed(RunningTestbed):
    """A running emulated testbed at RATE_GBPS: config, agent clients, operator, processes."""

    def __init__(self, tmp: Path) -> None:
        text = EMULATED.read_text(encoding="utf-8")
        text, n = re.subn(r"(?m)^line_rate_gbps\s*=\s*[0-9.eE+-]+",
                          f"line_rate_gbps = {RATE_GBPS}", text)
        assert n == 1, "the emulated testbed file has no [fabric] line_rate_gbps line"
        source = tmp / "emulated-4node-10mbps.toml"
        source.write_text(text, encoding="utf-8")
        super().__init__(tmp, source)


@pytest.fixture(scope="module")
def bed(tmp_path_factory) -> Iterator[Bed]:
    b = Bed(tmp_path_factory.mktemp("groundtruth"))
    yield b
    b.close()


def _allreduce_all(clients: list[AgentClient], arrays: list[np.ndarray]) -> float:
    """All nodes call allreduce at once; return the time until the last result is back."""
    elapsed, outs = allreduce_all(clients, arrays)
    exact = np.sum(arrays, axis=0)
    for out in outs:
        assert isinstance(out, np.ndarray) and np.array_equal(out, exact), out
    return elapsed


@pytest.mark.parametrize("collective,network", [("ring", "optical"), ("ring", "ideal"),
                                                ("halving-doubling", "optical")])
def test_prediction_matches_emulated_testbed(bed: Bed, collective: str, network: str):
    rng = np.random.default_rng(5)
    tiny = [rng.integers(-1000, 1000, TINY_ELEMS).astype(np.int32) for _ in bed.clients]
    large = [rng.integers(-1000, 1000, LARGE_ELEMS).astype(np.int32) for _ in bed.clients]
    job = bed.operator.submit(f"gt-{collective}-{network}", [], collective, network)
    try:
        _allreduce_all(bed.clients, tiny)  # warm-up: schedule caches, connections
        _allreduce_all(bed.clients, large)
        t_tiny, t_large = [], []
        for _ in range(REPEATS):  # alternate, so both see the same load
            t_tiny.append(_allreduce_all(bed.clients, tiny))
            t_large.append(_allreduce_all(bed.clients, large))
    finally:
        bed.operator.cancel(job["id"])
    m_tiny, m_large = float(np.median(t_tiny)), float(np.median(t_large))

    kw = {"collective": collective, "network": network, "itemsize": 4}
    a_priori = predict_testbed_allreduce(bed.cfg, LARGE_ELEMS, **kw)
    overheads = calibrate(m_tiny, predict_testbed_allreduce(bed.cfg, TINY_ELEMS, **kw))
    pred = predict_testbed_allreduce(bed.cfg, LARGE_ELEMS, overheads=overheads, **kw)
    err = pred.total_s / m_large - 1.0
    err0 = a_priori.total_s / m_large - 1.0
    print(f"\n{collective}/{network} at {RATE_GBPS * 1e3:g} Mbit/s, {LARGE_ELEMS * 4} B: "
          f"measured median {m_large * 1e3:.1f} ms ({', '.join(f'{x * 1e3:.1f}' for x in t_large)})"
          f"; predicted {pred.total_s * 1e3:.1f} ms ({err:+.1%}) = schedule "
          f"{pred.schedule_s * 1e3:.1f} + launch {pred.launch_s * 1e3:.1f} + fixed "
          f"{pred.fixed_s * 1e3:.1f} (from tiny {m_tiny * 1e3:.1f} ms) + copies "
          f"{pred.copy_s * 1e3:.2f}; a priori {a_priori.total_s * 1e3:.1f} ms ({err0:+.1%})")
    assert pred.schedule_s > 0.8 * pred.total_s, "the line-rate term must dominate"
    assert abs(err) <= TOLERANCE, (
        f"{collective}/{network}: predicted {pred.total_s * 1e3:.1f} ms, measured "
        f"{m_large * 1e3:.1f} ms ({err:+.1%}); tolerance ±{TOLERANCE:.0%}")
