"""Measuring points on a running emulated testbed (I/O): one `TestbedBench` a testbed
variant. It keeps a job open while consecutive points share it (collective, network, hosts)
and checks every all-reduce result, so a number it returns is of a run that was right.

The runner sees only the `Bench` protocol (measure a point, read the devices back, close):
the tests hand it a scripted one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from oddl.common.config import TestbedConfig
from oddl.common.errors import OddlError
from oddl.experiment.points import Point, line_rate_bound_s
from oddl.experiment.spec import Experiment


class PointFailed(OddlError):
    """A point ran and failed: a wrong result, a failed call, a refused job."""


class Bench(Protocol):
    """A started testbed variant, as the runner uses it."""

    cfg: TestbedConfig

    def measure(self, point: Point) -> dict[str, Any]:
        """The point's metrics; raises (PointFailed or any OddlError) when it fails."""
        ...

    def devices(self) -> dict[str, Any]:
        """Every device read back now."""
        ...

    def close(self) -> None:
        """Cancel what runs and stop every process."""
        ...


BenchFactory = Callable[[Path, Path, Experiment, Path | None], Bench]
"""(testbed file, work folder, experiment, trace folder or None) → a started Bench."""


class TestbedBench:
    """An emulated testbed (`RunningTestbed`) measuring an experiment's points."""

    __test__ = False  # not a pytest test class

    def __init__(self, config: Path, workdir: Path, exp: Experiment, trace: Path | None):
        from oddl.launch.testbed import RunningTestbed

        self.exp = exp
        workdir.mkdir(parents=True, exist_ok=True)
        self.tb = RunningTestbed(workdir, config, agent_timeout_s=None, trace=trace)
        self.cfg = self.tb.cfg
        self._job: dict[str, Any] | None = None
        self._job_key: tuple[Any, ...] | None = None

    def devices(self) -> dict[str, Any]:
        return self.tb.operator.devices()

    def close(self) -> None:
        try:
            self._drop_job()
        finally:
            self.tb.close()

    def measure(self, point: Point) -> dict[str, Any]:
        try:
            if self.exp.kind == "train":
                return self._train(point)
            return self._allreduce(point)
        except OddlError:
            self._drop_job()  # the job's step counts may now disagree: the next point
            raise             # starts on a new one

    # ---- jobs ----------------------------------------------------------------------------
    def _job_for(self, point: Point) -> tuple[str, list[Any]]:
        """The job of the point (submitted when the last one differs) and its clients."""
        hosts = int(point.factors["hosts"])
        if self._job_key != point.job_key:
            self._drop_job()
            nodes = self.tb.launched.node_ids[:hosts]
            self._job = self.tb.operator.submit(
                f"exp-{self.exp.name}-{point.index}", nodes, str(point.factors["collective"]),
                str(point.factors["network"]))
            self._job_key = point.job_key
        assert self._job is not None
        return str(self._job["id"]), self.tb.clients[:hosts]

    def _drop_job(self) -> None:
        if self._job is not None:
            job, self._job, self._job_key = self._job, None, None
            try:
                self.tb.operator.cancel(str(job["id"]))
            except OddlError:
                pass  # the testbed is going down or the job is gone: nothing left to free

    def _retunes(self, job_id: str) -> int:
        job = next((j for j in self.tb.operator.jobs() if j["id"] == job_id), {})
        return int(job.get("reconfigurations", 0))

    # ---- the two kinds -------------------------------------------------------------------
    def _allreduce(self, point: Point) -> dict[str, Any]:
        job_id, clients = self._job_for(point)
        size = int(point.factors["size_bytes"])
        rng = np.random.default_rng(1000 * point.index + point.repeat)
        arrays = [rng.integers(-1000, 1000, size // 4).astype(np.int32) for _ in clients]
        exact: np.ndarray = np.asarray(np.sum(np.stack(arrays), axis=0, dtype=np.int32))
        for _ in range(self.exp.warmup):
            _checked_allreduce(clients, arrays, exact)
        before = self._retunes(job_id)
        times = [_checked_allreduce(clients, arrays, exact) for _ in range(self.exp.calls)]
        retunes = (self._retunes(job_id) - before) / self.exp.calls
        bound = line_rate_bound_s(len(clients), size, self.cfg.fabric.line_rate_gbps)
        return {"time_ms": float(np.median(times)) * 1e3, "min_ms": min(times) * 1e3,
                "max_ms": max(times) * 1e3, "bound_ms": bound * 1e3, "retunes": retunes,
                "calls_ms": [t * 1e3 for t in times]}

    def _train(self, point: Point) -> dict[str, Any]:
        from oddl.demo.workload import train

        _job_id, clients = self._job_for(point)
        run = train(clients, int(point.factors["iterations"]), int(point.factors["params"]),
                    str(point.factors["network"]), seed=7 + point.repeat)
        if run.errors or run.mismatches:
            raise PointFailed("; ".join((run.errors + run.mismatches)[:3]))
        s = run.summary()
        return {"iteration_ms": s["iteration_ms_median"],
                "allreduce_ms": s["allreduce_ms_median"], "final_loss": s["final_loss"],
                "final_accuracy": s["final_accuracy"], "train_accuracy": s["train_accuracy"],
                "iterations_ms": [t * 1e3 for t in run.iteration_s],
                "allreduces_ms": [t * 1e3 for t in run.allreduce_s]}


def _checked_allreduce(clients: list[Any], arrays: list[np.ndarray],
                       exact: np.ndarray) -> float:
    """One all-reduce on every client at once; its wall time, or PointFailed naming the
    rank that failed or got a wrong result."""
    from oddl.agents.client.every_rank import allreduce_all

    elapsed, outs = allreduce_all(clients, arrays)
    for rank, out in enumerate(outs):
        if isinstance(out, Exception):
            raise PointFailed(f"rank {rank}: {type(out).__name__}: {out}")
        if not np.array_equal(out, exact):
            raise PointFailed(f"rank {rank}: the all-reduce result differs from the exact sum")
    return elapsed


def testbed_bench(config: Path, workdir: Path, exp: Experiment,
                  trace: Path | None) -> Bench:
    """The runner's default BenchFactory: an emulated testbed of `config`."""
    return TestbedBench(config, workdir, exp, trace)
