"""Switching a process's recording on from its command line (`--trace DIR`) and off at exit.

Every recording process (`oddl controller serve`, `oddl agent serve`, `oddl emulate testbed`)
takes the same two options; the trace names the testbed and the SHA-256 of the resolved
testbed file the process runs on (the same file for all of them), so a reader can refuse a
trace of another testbed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from oddl.common.tracing import DEFAULT_CAPACITY, TRACE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --trace DIR and --trace-buffer N to a serving command."""
    parser.add_argument("--trace", metavar="DIR", help="record this process's timeline into DIR/<process>.trace.json "
                        "(written when it stops, SIGTERM too; docs/how-to/trace-a-run.md)")
    parser.add_argument("--trace-buffer", metavar="EVENTS", type=int,
                        default=DEFAULT_CAPACITY, help="events kept while recording (more are "
                        "counted as dropped; default %(default)s, about 0.5 KB each)")


def testbed_digest(text: str | bytes) -> str:
    """The SHA-256 (hex) of a testbed file's text."""
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def start(directory: str | os.PathLike[str], process: str, *, testbed: str,
          testbed_file: str | os.PathLike[str] | None = None, testbed_text: str = "",
          capacity: int = DEFAULT_CAPACITY, clock: Callable[[], int] | None = None,
          offset_ns: Callable[[], int] | None = None,
          error_ns: Callable[[], int] | None = None) -> None:
    """Start this process's recording into `directory` (see `Recorder.start`)."""
    text: str | bytes = testbed_text or (Path(testbed_file).read_bytes() if testbed_file else b"")
    kwargs = {k: v for k, v in (("clock", clock), ("offset_ns", offset_ns),
                                ("error_ns", error_ns)) if v is not None}
    TRACE.start(directory, process, capacity=capacity,
                meta={"testbed": testbed, "testbed_sha256": testbed_digest(text)}, **kwargs)


def stop() -> Path | None:
    """Stop recording and write the file (nothing when not recording); its path."""
    return TRACE.stop()
