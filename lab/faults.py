"""A lab's faults (filled in below)."""

from __future__ import annotations

from lab.report import Report
from lab.rig import Rig


def run_all(rig: Rig, report: Report, bench: bool) -> None:
    return None
