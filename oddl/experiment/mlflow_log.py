"""Mirroring a run folder into MLflow (off by default; the ``mlflow`` extra): one MLflow run a
oddl run, tagged with its run id, commit and testbed, with the experiment file's settings as
parameters and the folder's record files as artifacts; one nested MLflow run a point, its
factors as parameters and each metric with the repeat as the step. Logging a run again (after
a resume) replaces what an earlier logging of it put there. The run folder stays the record:
MLflow gets a copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oddl.experiment.export import require_extra
from oddl.experiment.index import METRICS

ARTIFACTS = ("experiment.toml", "run.json", "results.json", "manifest.sha256")
RUN_TAG = "oddl.run_id"


def log_run(folder: Path, tracking_uri: str) -> str:
    """Log the run folder `folder` to the MLflow tracking server (or store) at
    `tracking_uri`; returns the MLflow id of the run's parent run."""
    require_extra("mlflow", "--mlflow (logging runs to MLflow)")
    from mlflow.tracking import MlflowClient

    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(run["name"])
    eid = found.experiment_id if found is not None else client.create_experiment(run["name"])
    for old in client.search_runs([eid], f"tags.`{RUN_TAG}` = '{run['run_id']}'"):
        client.delete_run(old.info.run_id)
    first = run["sessions"][0]
    parent = client.create_run(eid, run_name=run["run_id"], tags={
        RUN_TAG: run["run_id"], "oddl.status": run.get("status", ""),
        "oddl.git_commit": str(first["git"].get("commit")),
        "oddl.git_dirty": str(first["git"].get("dirty")), "oddl.testbed": run["testbed"],
        "oddl.folder": str(folder.resolve()), "oddl.command": first["command"],
        "oddl.sessions": str(len(run["sessions"]))})
    pid = parent.info.run_id
    for key, value in _settings(folder).items():
        client.log_param(pid, key, value)
    for name in ARTIFACTS:
        if (folder / name).is_file():
            client.log_artifact(pid, str(folder / name))
    by_point: dict[int, list[dict[str, Any]]] = {}
    for rec in results["points"]:
        by_point.setdefault(int(rec["point"]), []).append(rec)
    for point, recs in sorted(by_point.items()):
        _log_point(client, eid, pid, run["run_id"], point, recs)
    client.set_terminated(pid, "FINISHED" if run.get("status") == "done" else "KILLED")
    return str(pid)


def _settings(folder: Path) -> dict[str, str]:
    """The experiment file's [experiment] keys and factor levels, as MLflow parameters."""
    import tomllib

    doc = tomllib.loads((folder / "experiment.toml").read_text(encoding="utf-8"))
    params = {k: str(v) for k, v in doc.get("experiment", {}).items() if k != "description"}
    params.update({f"factor.{k}": json.dumps(v) for k, v in doc.get("factors", {}).items()})
    return params


def _log_point(client: Any, eid: str, parent: str, run_id: str, point: int,
               recs: list[dict[str, Any]]) -> None:
    from mlflow.entities import Metric, Param

    child = client.create_run(eid, run_name=f"{run_id}/point-{point}", tags={
        "mlflow.parentRunId": parent, RUN_TAG: run_id, "oddl.point": str(point),
        "oddl.failed": str(sum(r["status"] != "ok" for r in recs)),
        "oddl.error": next((str(r["error"]) for r in recs if r.get("error")), "")[:5000]})
    cid = child.info.run_id
    params = [Param(k, str(v)) for k, v in recs[0]["factors"].items()]
    params.append(Param("variant", str(recs[0]["variant"])))
    metrics = [Metric(m, float(r["metrics"][m]), 0, int(r["repeat"]))
               for r in recs if r["status"] == "ok" for m in METRICS
               if r["metrics"].get(m) is not None]
    client.log_batch(cid, metrics=metrics, params=params)
    client.set_terminated(cid, "FINISHED" if all(r["status"] == "ok" for r in recs)
                          else "FAILED")
