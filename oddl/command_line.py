"""Pieces every offline command module shares (`oddl simulate`, `topoopt`, `optinc`, `plan`).

`run_alone` and `parse_or_exit_code` run argparse for a module's own ``main(argv)`` and turn
argparse's exit into a return code; `json_default` writes numpy scalars and non-finite floats in ``--json``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

EXIT_USAGE = 2
"""Exit code of a usage error (argparse's own)."""


def parse_or_exit_code(parser: argparse.ArgumentParser, argv: Sequence[str] | None
                       ) -> argparse.Namespace | int:
    """The parsed `argv` (None: ``sys.argv[1:]``), or the exit code argparse asked for
    (2 on a usage error, 0 after ``--help``)."""
    try:
        return parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE


def run_alone(prog: str, doc: str | None,
              add_arguments: Callable[[argparse.ArgumentParser], None],
              command: Callable[[argparse.Namespace], int], argv: Sequence[str] | None) -> int:
    """Run one command on its own: a parser named `prog` described by `doc`'s first paragraph,
    its arguments, then `command` on them; return the exit code."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])
    add_arguments(parser)
    args = parse_or_exit_code(parser, argv)
    return args if isinstance(args, int) else command(args)


def json_default(o: Any) -> Any:
    """`json.dumps` default: numpy scalars as Python numbers, inf and nan as null."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
