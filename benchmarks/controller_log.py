"""What the controller's log tells a benchmark (bench_control_plane.py): held sweeps and the
agents it declared dead, read from the log file as the controller writes it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path


def held_seen(log: Path, offset: int) -> bool:
    """Whether the controller's log (from `offset`) tells of a held sweep."""
    with log.open("rb") as f:
        f.seek(offset)
        return b"sweep held" in f.read()


def found_held(log: Path, nodes: list[str]) -> int:
    """How many of `nodes` a held sweep declared dead: their line follows a "sweep held"
    line of the same sweep (within 0.2 s; only a held sweep logs a line before its verdicts)."""
    held_at, found = -1.0, set()
    for line in log.read_text(errors="replace").splitlines():
        try:
            hms = line.split()[1].replace(",", ".").split(":")
            at = 3600 * int(hms[0]) + 60 * int(hms[1]) + float(hms[2])
        except (IndexError, ValueError):
            continue
        if "sweep held" in line:
            held_at = at
        elif "stopped answering" in line and "agent_registry" in line and 0 <= at - held_at < 0.2:
            found.update(v for v in nodes if f"node {v} stopped answering" in line)
    return len(found)


async def declared_dead(log: Path, offset: int, nodes: list[str], since: float,
                        deadline: float) -> dict[str, float]:
    """Seconds from `since` until the controller's log (from `offset`) declares each of
    `nodes` dead; those not declared by `deadline` are left out."""
    seen: dict[str, float] = {}
    while len(seen) < len(nodes) and time.perf_counter() < deadline:
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        for v in nodes:
            if v not in seen and f"node {v} stopped answering" in text:
                seen[v] = time.perf_counter() - since
        await asyncio.sleep(0.1)
    return seen
