"""Hand-offs between circuits: moved to the schedule codec (`protos.schedule_wire`), which
computes them once at encoding time and carries them in the message."""

from __future__ import annotations

# house: re-export for protos.schedule_wire
from protos.schedule_wire import Handoff, SlotPairs, confirmations_for, handoffs

__all__ = ["Handoff", "SlotPairs", "confirmations_for", "handoffs"]
