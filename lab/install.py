"""Installing oddl as a lab does: a built wheel, non-editable, into a venv with `[torch]`.

The venv is made at `/opt/oddl/.venv` (so its scripts' first lines say that path, as on a lab
host) inside a throw-away mount namespace where `/opt/oddl` is a cache folder keyed by the
wheel's content; every host then mounts that folder at `/opt/oddl`. A second run with the
same code reuses the venv.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from lab.procedure import INSTALL, MAKE_VENV, shown
from lab.shell import LabError, run

CACHE_ROOT = Path("/var/tmp/oddl-lab-venv")
KEEP_VENVS = 3          # the newest venvs kept (about 1.4 GB each with torch)


def build_wheel(source: Path, out_dir: Path) -> Path:
    """`pip wheel --no-deps` of the source tree; the one wheel it wrote."""
    out_dir.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out_dir),
         str(source)], timeout=600)
    wheels = sorted(out_dir.glob("oddl-*.whl"))
    if len(wheels) != 1:
        raise LabError(f"{out_dir}: expected one oddl wheel, found {[w.name for w in wheels]}")
    return wheels[0]


def wheel_key(wheel: Path) -> str:
    """A hash of the wheel's members and their contents (zip timestamps left out, so the
    same code gives the same key)."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            digest.update(name.encode() + b"\0" + zf.read(name) + b"\0")
    return digest.hexdigest()[:16]


def venv_for(wheel: Path, log: Path) -> tuple[Path, bool]:
    """The cache folder whose `.venv` holds this wheel with `[torch]`, and whether it was
    reused. Made once per wheel content; a half-made one is removed."""
    root = CACHE_ROOT / wheel_key(wheel)
    done = root / ".lab-complete"
    if done.exists():
        return root, True
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    root.chmod(0o755)
    CACHE_ROOT.chmod(0o755)
    with tempfile.TemporaryDirectory(prefix="oddl-lab-build-") as tmp:
        staged = Path(tmp) / wheel.name
        shutil.copy(wheel, staged)
        Path(tmp).chmod(0o755)
        script = "\n".join([
            "set -e",
            f"mount -t overlay overlay -o lowerdir=/opt,upperdir={tmp}/u,workdir={tmp}/w /opt",
            "mkdir -p /opt/oddl", f"mount --bind {root} /opt/oddl",
            shown(MAKE_VENV),
            f"{shown(INSTALL)} -q '{staged}[torch]'",
        ])
        (Path(tmp) / "u").mkdir()
        (Path(tmp) / "w").mkdir()
        try:
            result = run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh",
                          "-c", script], timeout=1500)
        except LabError:
            shutil.rmtree(root, ignore_errors=True)
            raise
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(result.stdout + result.stderr, encoding="utf-8")
    done.touch()
    return root, False


def prune(keep: Path) -> list[Path]:
    """Remove all but the KEEP_VENVS most recently made venvs (never `keep`); what went.
    Only while no other rig runs: its hosts may have one of them mounted."""
    made = sorted((p for p in CACHE_ROOT.iterdir() if (p / ".lab-complete").exists()),
                  key=lambda p: (p / ".lab-complete").stat().st_mtime, reverse=True)
    gone = [p for p in made[KEEP_VENVS:] if p != keep]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone
