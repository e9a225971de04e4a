"""What is revoked: reading ``revoked.json`` of a certs folder (the run-time side).

The file is written by :mod:`oddl.common.revocation` (``oddl certs revoke`` and ``rotate``); every
host reads it here: the CURVE allow-list (:meth:`oddl.common.security.files.SecurityFiles.curve_clients`),
the authenticated streams and the controller's certificate check (:class:`RevocationList`,
which rereads the file when it changes).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oddl.common.errors import SecurityError

logger = logging.getLogger(__name__)

REVOKED = "revoked.json"
FORMAT = "oddl-revoked/1"


@dataclass(frozen=True)
class Revoked:
    """What is revoked: certificate serial numbers and CURVE public keys (z85)."""

    serials: frozenset[int] = frozenset()
    keys: frozenset[bytes] = frozenset()


def read_revoked(root: Path) -> Revoked:
    """The revocations recorded under the certs folder `root` (none if the file is absent)."""
    doc = read_revocation_document(root / REVOKED)
    entries = doc.get("entries", [])
    return Revoked(frozenset(int(e["serial"], 16) for e in entries if e.get("serial")),
                   frozenset(e["curve_public"].encode("ascii") for e in entries
                             if e.get("curve_public")))


def read_revocation_document(path: Path) -> dict[str, Any]:
    """The revocation list at `path` as its JSON document (an empty list if it is absent)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"format": FORMAT, "entries": []}
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{path}: cannot read the revocation list ({exc}); restore it "
                            "from another host or run `oddl certs revoke` again") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SecurityError(f"{path}: not an oddl revocation list (format {FORMAT!r})")
    return doc


class RevocationList:
    """The revocations of a certs folder, reread when the file changes (for long-lived
    servers: a revocation takes effect without a restart)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.path = Path(root) / REVOKED
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._current = Revoked()

    def current(self) -> Revoked:
        """What is revoked now (the file is reread only when it changed)."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = (0, 0)
        with self._lock:
            if stamp != self._stamp:
                self._current = read_revoked(self.path.parent) if stamp != (0, 0) else Revoked()
                self._stamp = stamp
                logger.info("revocation list %s: %d certificates, %d keys", self.path,
                            len(self._current.serials), len(self._current.keys))
            return self._current
