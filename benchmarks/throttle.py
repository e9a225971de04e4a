"""A controller kept behind on demand (bench_control_plane.py --throttle-s): it is stopped
(SIGSTOP) for three quarters of every period and let run (SIGCONT) for the rest, as on a host
that gives it a quarter of a core in bursts, so it reads heartbeats late for as long as the
throttle lasts. Agents are killed meanwhile, and the time until the controller's log declares
them dead is measured (decision record 0038)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from controller_log import declared_dead, found_held


async def throttle(pid: int, seconds: float, period: float) -> None:
    """Stop and continue `pid` for `seconds`; it is left running (also when cancelled)."""
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(0.75 * period)
            os.kill(pid, signal.SIGCONT)
            await asyncio.sleep(0.25 * period)
    finally:
        os.kill(pid, signal.SIGCONT)


async def throttled(fleet: Any, pid: int, log: Path, kill: int, exclude: list[str],
                    seconds: float, period: float, patience: float) -> dict[str, Any]:
    """Throttle the controller for `seconds`; after a quarter of them kill `kill` agents that
    beat (not of `exclude`); seconds from the kill until each is declared dead."""
    offset = log.stat().st_size
    task = asyncio.create_task(throttle(pid, seconds, period))
    await asyncio.sleep(seconds / 4)
    beats = await fleet.beats()
    victims = [n for n, b in beats.items() if b >= 1 and n not in exclude][:kill]
    await fleet.kill(victims)
    killed = time.perf_counter()
    times = await declared_dead(log, offset, victims, killed, killed + seconds + patience)
    throttle_left = max(0.0, seconds - (time.perf_counter() - killed) - seconds / 4)
    await task
    with log.open("rb") as f:
        f.seek(offset)
        held = f.read().count(b"sweep held")
    return {"throttle_s": seconds, "throttle_killed": len(victims),
            "throttle_found": len(times),
            "throttle_found_s": round(max(times.values()), 2) if times else None,
            "throttle_found_before_end": throttle_left > 0,
            "throttle_found_held": found_held(log, victims), "throttle_sweeps_held": held}
