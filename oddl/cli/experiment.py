"""Registers `oddl experiment run|list|show|compare|export|plot` (oddl.experiment)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from oddl.experiment.runner import DEFAULT_ROOT


def cmd_run(args: argparse.Namespace) -> int:
    """Run an experiment file (or resume a stopped run of it)."""
    from oddl.experiment.runner import RunOptions, find_experiment, run_experiment

    opts = RunOptions(root=Path(args.runs), index_path=_index(args), trace=args.trace,
                      resume=args.resume, retry_failed=args.retry_failed,
                      stop_after=args.stop_after, mlflow=args.mlflow,
                      command=shlex.join(["oddl", *sys.argv[1:]]) if args.command is None
                      else args.command,
                      say=lambda msg: print(f"[experiment] {msg}", flush=True))
    out = run_experiment(find_experiment(args.file), opts)
    return 0 if out.failed == 0 else 1


def _index(args: argparse.Namespace) -> Path:
    return Path(args.index) if args.index else Path(args.runs) / "index.sqlite"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", default=str(DEFAULT_ROOT),
                   help=f"the folder of the run folders (default {DEFAULT_ROOT})")
    p.add_argument("--index", default=None,
                   help="the SQLite index (default: RUNS/index.sqlite)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `oddl experiment ...`."""
    exp = sub.add_parser("experiment", help="experiments as code: run a declarative sweep, "
                         "list, compare, export and plot the runs (docs/how-to/"
                         "run-an-experiment.md)").add_subparsers(dest="experiment_cmd",
                                                                  required=True)
    run = exp.add_parser("run", help="run every point of an experiment file")
    run.add_argument("file", help="an experiment file, or the name of a shipped one "
                     "(allreduce-sizes, train-optical-vs-ideal, guard-time)")
    _common(run)
    run.add_argument("--trace", action="store_true",
                     help="every process records its timeline into RUN/trace/<variant>/")
    run.add_argument("--resume", nargs="?", const="latest", default=None, metavar="RUN",
                     help="go on with a stopped run (default: the newest run of this file)")
    run.add_argument("--retry-failed", action="store_true",
                     help="with --resume: run the points that failed again")
    run.add_argument("--stop-after", type=int, default=None, metavar="N",
                     help="stop after N points (status stopped; --resume goes on)")
    run.add_argument("--mlflow", default=None, metavar="TRACKING_URI",
                     help="also log the run to MLflow there when it stops (the mlflow "
                     "extra; off by default)")
    run.add_argument("--command", default=None, help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_run)
    from oddl.cli import experiment_views

    experiment_views.register(exp, _common)
