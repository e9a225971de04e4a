"""`oddl experiment reindex`: the index rebuilt from the run folders (I/O). The folders are
the record and the index a cache of them: a lost or stale index, or folders copied from
another machine, are indexed again from each folder's run.json, experiment.toml and
results.jsonl."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

from oddl.experiment import index
from oddl.experiment.record import RunFolder
from oddl.experiment.runner import index_row, run_row
from oddl.experiment.spec import parse_experiment


def reindex(root: Path, index_path: Path) -> list[str]:
    """Put every run folder under `root` (a folder with run.json) into the index at
    `index_path`, replacing the rows it had for them; the run ids indexed."""
    done = []
    with closing(index.connect(index_path)) as conn:
        for path in sorted(p for p in root.iterdir() if (p / "run.json").is_file()):
            folder = RunFolder(path)
            data = folder.run_json()
            exp = parse_experiment((path / "experiment.toml").read_text(encoding="utf-8"),
                                   str(path / "experiment.toml"))
            records = folder.results()
            conn.execute("DELETE FROM points WHERE run_id = ?", (folder.run_id,))
            for rec in records.values():
                index.put_point(conn, index_row(folder.run_id, rec))
            index.put_run(conn, run_row(folder, exp, data, data.get("status", "stopped"),
                                        records, data.get("finished")))
            done.append(folder.run_id)
    return done
