"""What the recorder records: an event on a track (`Track`, `Event`), and the file format's
name. Shared by the recorder (`oddl.common.tracing.recorder`) and the conversion to Chrome JSON
(`oddl.common.tracing.chrome`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FORMAT = "oddl-trace/1"
"""The trace file's format (its ``oddl.format``)."""


@dataclass(frozen=True)
class Track:
    """Where an event is drawn: a process (``controller``, ``device itla-n0``) and one of its
    threads (``slots``, ``send``)."""

    process: str
    thread: str = "main"


Event = tuple[str, Track, str, str, int, int, Any, Mapping[str, Any] | None]
"""(ph, track, name, cat, t_ns, dur_ns, id, args), times on the controller's clock."""
