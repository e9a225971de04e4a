"""Recording what the testbed did as a Chrome trace-event timeline (docs/reference/trace-format.md).

`TRACE` is this process's one recorder, off by default: every hook checks `TRACE.on` (one
attribute read) and does nothing else while it is False. `start` switches it on with the
process's name and clock, `stop` writes ``DIR/<process>.trace.json`` and switches it off.
The pure parts: `chrome` turns recorded events into the file's JSON, `schema` checks a file
against the format.
"""

from oddl.common.tracing.events import FORMAT, Track
from oddl.common.tracing.recorder import DEFAULT_CAPACITY, Recorder

TRACE = Recorder()
"""This process's recorder (off until `TRACE.start`)."""

__all__ = ["DEFAULT_CAPACITY", "FORMAT", "TRACE", "Recorder", "Track"]
