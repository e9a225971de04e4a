"""The `oddl` command line."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the oddl command line and return its exit code."""
    return 0
