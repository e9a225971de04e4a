"""`oddl experiment run FILE`: every point of an experiment, one testbed start a variant, each
point recorded as it finishes (in the run folder and the index), a progress line with the time
left; `--resume` goes on where a stopped run stopped; a failing point is recorded with its
reason and the others go on."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oddl.common.config import TestbedConfig, load_testbed, parse_testbed
from oddl.common.config.schema import as_table
from oddl.common.errors import ConfigError, OddlError
from oddl.experiment import index
from oddl.experiment.measure import Bench, BenchFactory, testbed_bench
from oddl.experiment.points import (
    Point,
    Variant,
    duration_text,
    expand,
    resolve_hosts,
    time_left_s,
    variant_text,
    variants,
)
from oddl.experiment.record import RunFolder, sha256_text, utc_now
from oddl.experiment.spec import TESTBED_KNOBS, Experiment, parse_experiment

DEFAULT_ROOT = Path("runs") / "experiments"


@dataclass
class RunOptions:
    """How to run: where, with a trace or not, resuming which run."""

    root: Path = DEFAULT_ROOT
    index_path: Path | None = None
    """The index (default: `root`/index.sqlite)."""
    trace: bool = False
    resume: str | None = None
    """A run id, a run folder, or ``latest`` (the newest run of the experiment)."""
    retry_failed: bool = False
    stop_after: int | None = None
    """Stop (status "stopped") after this many points of this session."""
    command: str = ""
    say: Callable[[str], None] = print
    mlflow: str | None = None
    """A tracking URI: mirror the run into MLflow when it stops (off by default)."""


@dataclass
class Outcome:
    """What `run_experiment` did."""

    folder: RunFolder
    status: str
    ran: int = 0
    failed: int = 0
    skipped: int = 0
    records: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)


def find_experiment(given: str) -> Path:
    """An experiment file: a path, else the name of a shipped one (`oddl/experiments/`)."""
    from importlib.resources import files

    path = Path(given)
    if path.exists() or "/" in given or given.endswith(".toml"):
        return path
    shipped = files("oddl").joinpath("experiments", f"{given}.toml")
    if isinstance(shipped, Path) and shipped.is_file():
        return shipped
    raise ConfigError(f"{given}: no such file, and no shipped experiment of that name "
                      f"(shipped: {', '.join(shipped_experiments()) or 'none'}); give a path")


def shipped_experiments() -> list[str]:
    """The shipped experiment files by name."""
    from importlib.resources import files

    folder = files("oddl").joinpath("experiments")
    return sorted(e.name[:-5] for e in folder.iterdir() if e.name.endswith(".toml"))


def load_experiment(path: Path) -> Experiment:
    """Read and validate an experiment file; ConfigError naming the file when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the experiment file ({exc.strerror}); check "
                          "the path (shipped ones: `oddl experiment run NAME`)") from exc
    return parse_experiment(text, str(path))


def testbed_path(exp: Experiment) -> Path:
    """The testbed file the experiment names: beside the experiment file, a path, or a
    shipped name."""
    from oddl.launch.shipped import find_testbed

    beside = Path(exp.path).parent / exp.testbed
    if exp.testbed.endswith(".toml") and beside.is_file():
        return beside
    return find_testbed(exp.testbed)


def knob_values(cfg: TestbedConfig) -> dict[str, float]:
    """The testbed knobs' values in a loaded testbed file."""
    timing = as_table(cfg.timing)
    return {k: float(timing[k] if section == "timing" else cfg.fabric.line_rate_gbps)
            for k, (section, _lo) in TESTBED_KNOBS.items()}


def index_row(run_id: str, rec: dict[str, Any]) -> dict[str, Any]:
    """A record of results.jsonl as a row of the index's points table."""
    import json

    metrics = rec.get("metrics") or {}
    return {"run_id": run_id, "point": rec["point"], "repeat": rec["repeat"],
            "variant": rec["variant"], "status": rec["status"], "error": rec.get("error"),
            **rec["factors"], **{m: metrics.get(m) for m in index.METRICS},
            "started": rec.get("started"), "elapsed_s": rec.get("elapsed_s"),
            "metrics_json": json.dumps(metrics)}


def run_row(folder: RunFolder, exp: Experiment, data: dict[str, Any], status: str,
            records: dict[tuple[int, int], dict[str, Any]], finished: str | None
            ) -> dict[str, Any]:
    """A run's row of the index, from its run.json (`data`) and its records."""
    first = data["sessions"][0]
    ok = sum(1 for r in records.values() if r["status"] == "ok")
    return {"run_id": folder.run_id, "name": exp.name, "kind": exp.kind,
            "description": exp.description, "status": status, "started": data["started"],
            "finished": finished, "folder": str(folder.path.resolve()),
            "testbed": data["testbed"], "experiment_sha256": data["experiment_sha256"],
            "command": first["command"], "oddl_version": first["versions"]["oddl"],
            "git_commit": first["git"]["commit"], "git_dirty": first["git"]["dirty"],
            "hostname": first["host"]["hostname"], "cpu_count": first["host"]["cpu_count"],
            "points_total": len(expand(exp)), "points_ok": ok,
            "points_failed": len(records) - ok}


class Runner:
    """One session of one run: the variants in order, the pending points of each."""

    def __init__(self, exp: Experiment, base: Path, opts: RunOptions, factory: BenchFactory):
        self.exp, self.base, self.opts, self.factory = exp, base, opts, factory
        self.index: sqlite3.Connection = index.connect(
            opts.index_path or opts.root / index.INDEX_NAME)
        self.durations: list[float] = []
        self.start_costs: list[float] = []
        self.session_points = 0

    def open_folder(self) -> tuple[RunFolder, dict[tuple[int, int], dict[str, Any]]]:
        """A new run folder, or the one to resume (which must hold this very file)."""
        opts, exp = self.opts, self.exp
        if opts.resume is None:
            folder = RunFolder.create(opts.root, exp.name)
            folder.write("experiment.toml", exp.text)
            folder.write("testbeds/base.toml", self.base.read_text(encoding="utf-8"))
        else:
            folder = RunFolder.find(opts.root, opts.resume, exp.name)
            stored = (folder.path / "experiment.toml").read_text(encoding="utf-8")
            if sha256_text(stored) != sha256_text(exp.text):
                raise ConfigError(f"--resume {folder.run_id}: {exp.path} is not the file that "
                                  "run started with; resume with its own copy "
                                  f"({folder.path / 'experiment.toml'}) or start a new run")
            base = (folder.path / "testbeds" / "base.toml").read_text(encoding="utf-8")
            if sha256_text(base) != sha256_text(self.base.read_text(encoding="utf-8")):
                raise ConfigError(f"--resume {folder.run_id}: the testbed file {self.base} "
                                  "changed since the run started; start a new run (the old "
                                  "one's points were measured on the old file)")
        head = {"run_id": folder.run_id, "name": exp.name, "kind": exp.kind,
                "experiment_sha256": sha256_text(exp.text), "testbed": str(self.base),
                "started": utc_now(), "status": "running"}
        data = folder.start_session(self.opts.command, head)
        self._put_run(folder, data, "running", {})
        return folder, folder.results()

    def _put_run(self, folder: RunFolder, data: dict[str, Any], status: str,
                 records: dict[tuple[int, int], dict[str, Any]]) -> None:
        index.put_run(self.index, run_row(folder, self.exp, data, status, records,
                                          utc_now() if status != "running" else None))

    # ---- the sweep ----------------------------------------------------------------------
    def run(self) -> Outcome:
        """Run every pending point; the folder and the index are complete when this returns,
        also when it raises (KeyboardInterrupt: status "stopped")."""
        folder, records = self.open_folder()
        points = expand(self.exp)
        pending = [p for p in points if self._pending(records.get(p.key))]
        out = Outcome(folder, "stopped", skipped=len(points) - len(pending), records=records)
        todo: dict[str, list[Point]] = {}
        for p in pending:
            todo.setdefault(p.variant, []).append(p)
        self.total, self.remaining, self.starts_left = len(points), len(pending), len(todo)
        if out.skipped:
            self.opts.say(f"resuming {folder.run_id}: {out.skipped} of {len(points)} points "
                          f"done, {len(pending)} to go")
        else:
            self.opts.say(f"run {folder.run_id}: {len(points)} points on "
                          f"{len(variants(self.exp))} testbed variant(s), in {folder.path}")
        try:
            for variant in variants(self.exp):
                if variant.name in todo and self._variant(folder, variant, todo[variant.name],
                                                          out):
                    break
            else:
                out.status = "done"
        finally:
            self._finish(folder, out)
        return out

    def _pending(self, rec: dict[str, Any] | None) -> bool:
        return rec is None or (rec["status"] != "ok" and self.opts.retry_failed)

    def _variant(self, folder: RunFolder, variant: Variant, todo: list[Point],
                 out: Outcome) -> bool:
        """Start the variant's testbed, run its points, stop it; True when --stop-after says
        to stop. A testbed that cannot be written or started fails its points, with why."""
        text = variant_text(self.base.read_text(encoding="utf-8"), variant, str(self.base))
        path = folder.write(f"testbeds/{variant.name}.toml", text)
        self.starts_left -= 1
        session = len(folder.run_json()["sessions"]) - 1
        suffix = f"-{session}" if session else ""  # a resume keeps the earlier files
        trace = folder.path / "trace" / f"{variant.name}{suffix}" if self.opts.trace else None
        self.opts.say(f"testbed {variant.name} ({variant.label()}): starting")
        t0 = time.perf_counter()
        try:
            parse_testbed(text, str(path))
            bench = self.factory(path, folder.path / "work" / f"{variant.name}{suffix}",
                                 self.exp, trace)
        except Exception as exc:  # recorded on each of its points; the other variants go on
            reason = f"testbed {variant.name} did not start: {type(exc).__name__}: {exc}"
            for p in todo:
                self._record(folder, p, {}, reason, 0.0, {}, out)
            return False
        self.start_costs.append(time.perf_counter() - t0)
        try:
            self._devices(folder, bench, f"devices/{variant.name}-before{suffix}.json")
            knobs = knob_values(bench.cfg)
            for p in todo:
                self._point(folder, bench, p, knobs, out)
                if self.opts.stop_after is not None and \
                        self.session_points >= self.opts.stop_after:
                    self.opts.say(f"stopping after {self.session_points} points (--stop-after);"
                                  f" `--resume {folder.run_id}` goes on")
                    return True
        finally:
            self._devices(folder, bench, f"devices/{variant.name}-after{suffix}.json")
            bench.close()
            if trace is not None:
                self._merge_trace(trace)
        return False

    def _devices(self, folder: RunFolder, bench: Bench, rel: str) -> None:
        try:
            folder.write(rel, bench.devices())
        except OddlError as exc:
            folder.write(rel, {"error": f"{type(exc).__name__}: {exc}"})

    def _merge_trace(self, trace: Path) -> None:
        from oddl.trace.merge import merge_paths, write_json

        try:
            write_json(merge_paths([str(trace)]), str(trace / "timeline.json"))
        except (OddlError, OSError, ValueError) as exc:
            self.opts.say(f"the trace in {trace} was not merged: {exc}")

    def _point(self, folder: RunFolder, bench: Bench, p: Point, knobs: dict[str, float],
               out: Outcome) -> None:
        t0 = time.perf_counter()
        started = utc_now()
        try:
            metrics, error = bench.measure(p), None
        except Exception as exc:  # recorded with its reason; the other points go on
            metrics, error = {}, f"{type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - t0
        self._record(folder, p, metrics, error, elapsed, knobs, out, started)

    def _record(self, folder: RunFolder, p: Point, metrics: dict[str, Any], error: str | None,
                elapsed: float, knobs: dict[str, float], out: Outcome,
                started: str | None = None) -> None:
        rec = {"point": p.index, "repeat": p.repeat, "variant": p.variant,
               "factors": {**knobs, **p.factors}, "status": "failed" if error else "ok",
               "error": error, "metrics": metrics, "started": started or utc_now(),
               "elapsed_s": elapsed}
        folder.append_result(rec)
        index.put_point(self.index, index_row(folder.run_id, rec))
        out.records[p.key] = rec
        out.ran += 1
        out.failed += bool(error)
        self.session_points += 1
        self.remaining -= 1
        if elapsed:
            self.durations.append(elapsed)
        left = time_left_s(self.durations, self.remaining, self.starts_left, self.start_costs)
        self.opts.say(f"[{self.total - self.remaining}/{self.total}] {p.variant} {p.label()} "
                      f"#{p.repeat + 1}: {outcome_text(rec)}; {duration_text(left)} left")

    def _finish(self, folder: RunFolder, out: Outcome) -> None:
        folder.finish(out.records.values(), out.status)
        self._put_run(folder, folder.run_json(), out.status, out.records)
        self.index.close()
        self.opts.say(f"{out.status}: {out.ran} points run ({out.failed} failed)"
                      + (f", {out.skipped} done before" if out.skipped else "")
                      + f"; {folder.path} (manifest.sha256), index "
                      f"{self.opts.index_path or self.opts.root / index.INDEX_NAME}")


def outcome_text(rec: dict[str, Any]) -> str:
    """A record's result in a few words."""
    if rec["status"] != "ok":
        return f"FAILED: {rec['error']}"
    m = rec["metrics"]
    if "time_ms" in m:
        return f"{m['time_ms']:.2f} ms (bound {m['bound_ms']:.2f} ms)"
    return (f"{m['iteration_ms']:.1f} ms an iteration, all-reduce {m['allreduce_ms']:.1f} ms, "
            f"accuracy {m['final_accuracy']:.2f}")


def run_experiment(path: Path, opts: RunOptions,
                   factory: BenchFactory = testbed_bench) -> Outcome:
    """Validate the experiment and its testbed file, then run it (`Runner`)."""
    exp = load_experiment(path)
    base = testbed_path(exp)
    exp = resolve_hosts(exp, load_testbed(base))
    out = Runner(exp, base, opts, factory).run()
    if opts.mlflow:
        from oddl.experiment.mlflow_log import log_run

        mlflow_id = log_run(out.folder.path, opts.mlflow)
        opts.say(f"logged to MLflow at {opts.mlflow}: run {mlflow_id}")
    return out
