"""Checks shared by the collective-plan tests."""

from __future__ import annotations

import numpy as np

from oddl.controller.scheduling import Plan, TimingModel, execute_plan, validate_plan

TIMING = TimingModel(1e-6, 1e-7, 1e-6, 0.0, 0.1, 1e-6, 100e9)
"""Fast-transceiver timing at 100 Gbit/s for plan tests."""

TESTBED_TIMING = TimingModel(
    tune_s=2e-3,
    skew_s=1e-4,
    cdr_s=1e-5,
    command_s=2e-3,
    wss_settle_s=0.1,
    slot_margin_s=6e-4,
    line_rate_bps=10e9,
)
"""ITLA-class timing at 10 Gbit/s (2 ms retunes) for the scheduler tests."""


def assert_allreduce(plan: Plan, seed: int) -> None:
    """Every rank ends with the exact int64 sum (wrapping addition is associative)."""
    validate_plan(plan)
    rng = np.random.default_rng(seed)
    info = np.iinfo(np.int64)
    inputs = [
        rng.integers(info.min, info.max, size=plan.n_elems, dtype=np.int64, endpoint=True)
        for _ in range(plan.n_ranks)
    ]
    with np.errstate(over="ignore"):
        expected = np.sum(np.stack(inputs), axis=0, dtype=np.int64)
        outputs = execute_plan(plan, inputs)
    for rank, out in enumerate(outputs):
        assert np.array_equal(out, expected), f"rank {rank} differs"
