"""The run folder (`runs/experiments/<name>-<time>/`) and what goes into it (I/O):

    experiment.toml        the experiment file as given
    run.json               run id, experiment, testbed, and per session (the first run and
                           each --resume) the command line, time, versions, host and git state
    git.diff               `git diff HEAD` of an unclean tree (git-<session>.diff on a resume)
    testbeds/base.toml     the testbed file named; testbeds/vK.toml each variant's copy
    devices/vK-before.json every device read back after the variant started, -after before
                           it stopped (the operator client's GetDeviceState)
    results.jsonl          one record per point and repeat, appended as each finishes
    results.json           every point's last record, when the run stops or ends
    trace/vK/              each process's timeline with --trace, merged into timeline.json
    work/vK/               the processes' logs and resolved testbed files
                           (devices, trace and work of resume K: vK-before-K.json, vK-K/)
    manifest.sha256        the SHA-256 of every other file (`sha256sum -c manifest.sha256`)
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oddl.common.errors import ConfigError
from oddl.experiment import provenance

RESULTS_LOG = "results.jsonl"


def utc_now() -> str:
    """The time now, ISO 8601 in UTC to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def sha256_text(text: str) -> str:
    """The SHA-256 of a text's UTF-8 bytes, hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class RunFolder:
    """One run's folder; `run_id` is its name."""

    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, root: Path, name: str) -> RunFolder:
        """A new folder `root/<name>-<UTC time>` (a suffix when that exists already)."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = root / f"{name}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = root / f"{name}-{stamp}-{n}"
        path.mkdir(parents=True)
        return cls(path)

    @classmethod
    def find(cls, root: Path, ref: str, name: str) -> RunFolder:
        """The folder to resume: a path, a run id under `root`, or ``latest`` (the newest
        folder of the experiment `name`)."""
        if ref == "latest":
            mine = sorted((p for p in root.glob(f"{name}-*") if (p / "run.json").is_file()),
                          key=lambda p: json.loads((p / "run.json").read_text())["started"])
            if not mine:
                raise ConfigError(f"--resume: no run of {name!r} under {root}; start one "
                                  "without --resume")
            return cls(mine[-1])
        path = Path(ref) if Path(ref).is_dir() else root / ref
        if not (path / "run.json").is_file():
            raise ConfigError(f"--resume {ref}: no run folder there (no run.json); give a "
                              f"run id under {root} or latest")
        return cls(path)

    # ---- what is written once, or once a session ------------------------------------------
    def write(self, rel: str, content: str | dict[str, Any] | list[Any]) -> Path:
        """Write a file of the folder (a dict or list as indented JSON)."""
        path = self.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = content if isinstance(content, str) else json.dumps(content, indent=2) + "\n"
        path.write_text(text, encoding="utf-8")
        return path

    def run_json(self) -> dict[str, Any]:
        """run.json as written."""
        data: dict[str, Any] = json.loads((self.path / "run.json").read_text(encoding="utf-8"))
        return data

    def start_session(self, command: str, head: dict[str, Any]) -> dict[str, Any]:
        """Record a session (the first, or a resume): its command line, time, versions, host
        and git state, with the diff of an unclean tree in its own file; returns run.json."""
        data = self.run_json() if (self.path / "run.json").is_file() else dict(head)
        sessions = data.setdefault("sessions", [])
        n = len(sessions)
        git = provenance.git_state()
        diff = git.pop("diff")
        if diff:
            git["diff_file"] = self.write("git.diff" if n == 0 else f"git-{n}.diff",
                                          diff).name
        sessions.append({"command": command, "started": utc_now(), "pid": os.getpid(),
                         "versions": provenance.versions(), "host": provenance.host(),
                         "git": git})
        self.write("command.txt" if n == 0 else f"command-{n}.txt", command + "\n")
        self.write("run.json", data)
        return data

    # ---- results --------------------------------------------------------------------------
    def append_result(self, record: dict[str, Any]) -> None:
        """Add one point's record to results.jsonl, on disk before this returns (a crash
        after it loses nothing a resume would redo)."""
        log = self.path / RESULTS_LOG
        torn = False
        if log.is_file() and log.stat().st_size > 0:
            with log.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
        with log.open("a", encoding="utf-8") as f:
            f.write(("\n" if torn else "") + json.dumps(record) + "\n")  # after a torn line
            f.flush()
            os.fsync(f.fileno())

    def results(self) -> dict[tuple[int, int], dict[str, Any]]:
        """Each point's last record by (point, repeat); a torn last line (a crash while
        writing) is left out."""
        log = self.path / RESULTS_LOG
        found: dict[tuple[int, int], dict[str, Any]] = {}
        if not log.is_file():
            return found
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            found[(int(rec["point"]), int(rec["repeat"]))] = rec
        return found

    def finish(self, records: Iterable[dict[str, Any]], status: str) -> None:
        """results.json (every point's last record), the status in run.json, the manifest."""
        ordered = sorted(records, key=lambda r: (r["point"], r["repeat"]))
        self.write("results.json", {"run_id": self.run_id, "status": status,
                                    "points": ordered})
        data = self.run_json()
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        data.update(status=status, finished=utc_now(),
                    load_average_end=list(load) if load else None)
        self.write("run.json", data)
        provenance.write_manifest(self.path)
