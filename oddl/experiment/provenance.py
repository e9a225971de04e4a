"""What a run records about where it ran (I/O): oddl's version and git commit with the diff of
an unclean tree, the versions of Python and of the packages measured with, the host; and the
run folder's manifest of SHA-256 checksums."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import oddl

PACKAGES = ("numpy", "torch", "grpcio", "pyzmq", "protobuf", "matplotlib", "pandas", "pyarrow")
"""Whose versions a run records (absent ones as null)."""

MANIFEST = "manifest.sha256"
"""The manifest's name: `sha256sum -c manifest.sha256` checks the folder."""


def _git(source: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(source), *args], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def source_tree() -> Path:
    """The folder oddl is imported from: a git checkout's root, or site-packages."""
    return Path(oddl.__file__).resolve().parent.parent


def git_state(source: Path | None = None) -> dict[str, Any]:
    """The commit oddl runs from, whether the tree is dirty, and the diff against the commit
    (tracked files) with the list of untracked ones; ``commit`` None outside a checkout."""
    source = source or source_tree()
    commit = _git(source, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "diff": "", "untracked": [],
                "note": f"{source} is not a git checkout (an installed wheel?)"}
    status = _git(source, "status", "--porcelain", "--untracked-files=normal") or ""
    untracked = [line[3:] for line in status.splitlines() if line.startswith("??")]
    diff = _git(source, "diff", "HEAD") or ""
    branch = (_git(source, "rev-parse", "--abbrev-ref", "HEAD") or "").strip()
    return {"commit": commit.strip(), "branch": branch, "dirty": bool(status.strip()),
            "diff": diff, "untracked": untracked}


def versions() -> dict[str, Any]:
    """oddl's, Python's and each of PACKAGES' versions (None: not installed)."""
    found: dict[str, Any] = {"oddl": oddl.__version__, "python": platform.python_version(),
                             "python_implementation": platform.python_implementation()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def host() -> dict[str, Any]:
    """The machine: platform, processor, CPU count, load when the run started."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"hostname": platform.node(), "platform": platform.platform(),
            "machine": platform.machine(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "load_average": list(load) if load else None}


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> Path:
    """Write `folder/manifest.sha256`: every other file under `folder`, in `sha256sum`'s
    format (two spaces, the path relative to the folder), sorted by path."""
    lines = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        lines.append(f"{sha256_file(path)}  {path.relative_to(folder).as_posix()}")
    manifest = folder / MANIFEST
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest


def check_manifest(folder: Path) -> list[str]:
    """The files of the manifest whose checksum differs or that are missing (none: intact)."""
    bad = []
    for line in (folder / MANIFEST).read_text(encoding="utf-8").splitlines():
        digest, _, rel = line.partition("  ")
        path = folder / rel
        if not path.is_file():
            bad.append(f"{rel}: missing")
        elif sha256_file(path) != digest:
            bad.append(f"{rel}: changed")
    return bad
