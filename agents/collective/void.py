"""The window in which a call may be voided: from its start to the end of its ready exchange
(decision record 0033).

A call whose training process is gone is voided while it still waits for its peers (for them
to come back, or to say they are ready): nothing of it moved yet, and every node that waits
for it fails alike (the ready exchange ends the same way everywhere it ends). Once the ready
exchange is done the peers count on this node, so the window closes: the collective runs to
its end, and its result goes to nobody.
"""

from __future__ import annotations

import threading


class VoidWindow:
    """One node's call in flight, as far as voiding it goes (see the module docstring)."""

    def __init__(self, cancel: threading.Event):
        self._cancel = cancel
        self._lock = threading.Lock()
        self._open = False
        self.reason = ""
        """Why the call in flight was voided ("" while it was not)."""

    def open(self) -> None:
        """A call starts: it may be voided until `close`."""
        with self._lock:
            self._open, self.reason = True, ""

    def close(self) -> None:
        """The call's ready exchange is done (or it runs without one): no void from now on."""
        with self._lock:
            self._open, self.reason = False, ""

    def void(self, reason: str) -> bool:
        """Void the call in flight with `reason` (its waits end on the cancel event); False
        when no call is in the window."""
        with self._lock:
            if not self._open:
                return False
            self.reason = reason
            self._cancel.set()
            return True

    def rearm(self) -> None:
        """After the cancel event was cleared for a new phase: set it again if voided."""
        with self._lock:
            if self.reason:
                self._cancel.set()
