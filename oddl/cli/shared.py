"""Pieces the command modules share (`oddl simulate`, `topoopt`, `optinc`, `plan`, `certs`).

`run_alone` and `parse_or_exit_code` run argparse for a module's own ``main(argv)`` and turn
argparse's exit into a return code; `json_default` writes numpy scalars and non-finite floats in ``--json``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from oddl.cli.exit_codes import EXIT_FAILED, EXIT_USAGE
from oddl.common.errors import OddlError


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


def run_command_tree(register: Callable[[Any], Any], argv: Sequence[str] | None = None, *,
                     prefix: Sequence[str] = (), dest: str = "cmd", required: bool = True,
                     prog: str = "oddl") -> int:
    """Parse ``prefix + argv`` (`argv` defaults to ``sys.argv[1:]``) with the subcommands
    `register` adds, run the chosen ``func`` and return its exit code.

    A usage error returns argparse's code (2; 0 after ``--help``); an :class:`OddlError`
    prints ``failed: <message>`` on stderr and returns :data:`EXIT_FAILED`.
    """
    parser = argparse.ArgumentParser(prog=prog)
    register(parser.add_subparsers(dest=dest, required=required))
    args = parse_or_exit_code(parser, [*prefix, *(sys.argv[1:] if argv is None else argv)])
    if isinstance(args, int):
        return args
    try:
        return int(args.func(args))
    except OddlError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
