"""`oddl experiment list|show|compare|export|plot`: the index read back (oddl.experiment)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from oddl.common.errors import ConfigError


def _load(args: argparse.Namespace, refs: list[str] | None, name: str | None = None
          ) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """(every run of the index, the ids `refs` name — [] the latest, None every run —, their
    points); the index is closed again."""
    from oddl.experiment import index

    path = Path(args.index) if args.index else Path(args.runs) / index.INDEX_NAME
    if not path.is_file():
        raise ConfigError(f"{path}: no index there; run an experiment first (`oddl experiment "
                          "run FILE`) or pass --runs/--index")
    with closing(index.connect(path)) as conn:
        all_runs = index.runs(conn, name)
        if refs is None:
            ids = [str(r["run_id"]) for r in all_runs]
        else:
            ids = [index.resolve_run(all_runs, r) for r in (refs or ["latest"])]
        return all_runs, ids, index.points(conn, ids) if ids else []


def cmd_list(args: argparse.Namespace) -> int:
    """Every run of the index (of one experiment with --name)."""
    from oddl.experiment.summary import table

    rows, _ids, _points = _load(args, None, args.name)
    for r in rows:
        commit = (r["git_commit"] or "?")[:10] + ("+dirty" if r["git_dirty"] else "")
        r["points"] = f"{r['points_ok']}/{r['points_total']}" + (
            f" ({r['points_failed']} failed)" if r["points_failed"] else "")
        r["commit"] = commit
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows, ["run_id", "kind", "status", "points", "started", "commit"])
              if rows else "no runs")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """One run: where it is, what made it, a row a point (repeats folded)."""
    from oddl.experiment.summary import MAIN_METRIC, fold, table, varied_factors

    all_runs, (run_id,), rows = _load(args, [args.run])
    run = next(r for r in all_runs if r["run_id"] == run_id)
    folded = fold(rows)
    if args.json:
        print(json.dumps({"run": run, "points": folded}, indent=2))
        return 0
    m = MAIN_METRIC[run["kind"]]
    print(f"run {run_id} ({run['kind']}, {run['status']}): {run['folder']}\n"
          f"command: {run['command']}\ncommit: {run['git_commit']}"
          f"{' (dirty: git.diff in the folder)' if run['git_dirty'] else ''}; "
          f"testbed {run['testbed']}\n")
    extra = ["bound_ms"] if m == "time_ms" else ["allreduce_ms", "final_accuracy"]
    cols = ["point", *(varied_factors(rows) or ["collective", "network"]), "n", "failed", m,
            f"{m}_std", *extra, "error"]
    print(table(folded, cols))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Two runs' points matched on their factors, the metric's ratio."""
    from oddl.experiment.summary import MAIN_METRIC, compare, fold, table, varied_factors

    all_runs, (a, b), rows = _load(args, [args.a, args.b])
    kind = next(r["kind"] for r in all_runs if r["run_id"] == a)
    metric = args.metric or MAIN_METRIC[kind]
    rows_a = [r for r in rows if r["run_id"] == a]
    rows_b = [r for r in rows if r["run_id"] == b]
    pairs = compare(fold(rows_a), fold(rows_b), metric)
    if args.json:
        print(json.dumps({"a": a, "b": b, "metric": metric, "points": pairs}, indent=2))
        return 0
    print(f"{metric}: a = {a}, b = {b}")
    print(table(pairs, [*(varied_factors(rows_a + rows_b) or ["collective"]), "a", "b",
                        "b_over_a"]))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """The points of some runs (default: all) as CSV or Parquet."""
    from oddl.experiment.export import write_table

    _runs, ids, rows = _load(args, args.runs_ or None)
    if args.folded:
        from oddl.experiment.summary import fold

        rows = fold(rows)
    path = write_table(rows, Path(args.out), args.format)
    print(f"{len(rows)} rows of {len(ids)} run(s) → {path}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """The standard figures of some runs."""
    from oddl.experiment.plot import draw

    all_runs, ids, rows = _load(args, args.runs_)
    runs = [r for r in all_runs if r["run_id"] in ids]
    written = draw(runs, rows, Path(args.out), args.figure, args.factor)
    for path in written:
        print(path)
    return 0


def cmd_mlflow(args: argparse.Namespace) -> int:
    """Log a run of the index to MLflow (again: it replaces the earlier copy)."""
    from oddl.experiment.mlflow_log import log_run

    all_runs, (run_id,), _rows = _load(args, [args.run])
    folder = Path(next(r["folder"] for r in all_runs if r["run_id"] == run_id))
    print(f"{run_id} → MLflow run {log_run(folder, args.tracking_uri)} at {args.tracking_uri}")
    return 0


def cmd_reindex(args: argparse.Namespace) -> int:
    """Rebuild the index from the run folders under --runs."""
    from oddl.experiment.index import INDEX_NAME
    from oddl.experiment.reindex import reindex

    runs = Path(args.runs)
    if not runs.is_dir():
        raise ConfigError(f"{runs}: no such folder; pass --runs the folder of the run folders")
    path = Path(args.index) if args.index else runs / INDEX_NAME
    ids = reindex(runs, path)
    print(f"{len(ids)} run(s) of {runs} indexed in {path}")
    return 0


def register(exp: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the sub-commands that read the index."""
    ls = exp.add_parser("list", help="the runs in the index")
    ls.add_argument("--name", default=None, help="only this experiment's runs")
    show = exp.add_parser("show", help="one run, a row a point (repeats folded)")
    show.add_argument("run", nargs="?", default="latest",
                      help="a run id, a unique prefix, an experiment's name or latest")
    cmp_ = exp.add_parser("compare", help="two runs' points side by side")
    cmp_.add_argument("a")
    cmp_.add_argument("b")
    cmp_.add_argument("--metric", default=None, help="default: time_ms (allreduce), "
                      "iteration_ms (train)")
    export = exp.add_parser("export", help="points as CSV (or Parquet with the experiments "
                            "extra)")
    export.add_argument("runs_", nargs="*", metavar="RUN", help="default: every run")
    export.add_argument("--out", required=True, help="FILE.csv or FILE.parquet")
    export.add_argument("--format", choices=["csv", "parquet"], default=None,
                        help="default: from the file's suffix")
    export.add_argument("--folded", action="store_true", help="a row a point (repeats "
                        "folded into median, mean, std, min, max)")
    plot = exp.add_parser("plot", help="the standard figures (needs matplotlib)")
    plot.add_argument("runs_", nargs="*", metavar="RUN", help="default: the latest run")
    plot.add_argument("--out", default="runs/experiments/figures", help="the figures' folder")
    plot.add_argument("--figure", choices=["auto", "sizes", "networks", "sweep"],
                      default="auto")
    plot.add_argument("--factor", default=None, help="the swept factor of --figure sweep "
                      "(default: the first varied testbed knob)")
    mlf = exp.add_parser("mlflow", help="log a run to MLflow (the mlflow extra)")
    mlf.add_argument("run", nargs="?", default="latest")
    mlf.add_argument("--tracking-uri", required=True, help="e.g. http://mlflow:5000 or "
                     "sqlite:///mlflow.db")
    rei = exp.add_parser("reindex", help="rebuild the index from the run folders (a lost "
                         "index, folders from another machine)")
    for p, fn in ((ls, cmd_list), (show, cmd_show), (cmp_, cmd_compare), (export, cmd_export),
                  (plot, cmd_plot), (mlf, cmd_mlflow), (rei, cmd_reindex)):
        common(p)
        if p not in (export, plot, mlf, rei):
            p.add_argument("--json", action="store_true")
        p.set_defaults(func=fn)
