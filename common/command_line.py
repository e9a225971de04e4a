"""Running an argparse command tree as a program: the exit codes every oddl command uses and
the one-line message of an :class:`~common.errors.OddlError`.

A command module registers its subcommands with ``register(subparsers)``, each setting
``func`` (parsed arguments → exit code); its ``main`` is then
``run_command_tree(register, argv)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from common.errors import OddlError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
"""Done; refused or failed (an :class:`OddlError`); bad command line."""


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
    try:
        args = parser.parse_args([*prefix, *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return int(args.func(args))
    except OddlError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
