"""Which testbed file an operator command reads: ``--config``, then ``ODDL_CONFIG``, then
``/etc/oddl/testbed.toml`` when it exists (the lab host's file, where the lab steps of
docs/how-to/lab-bring-up.md put it), so that `oddl status`, `jobs`, `devices`, `watch`, `reconfigure`, `devices probe`
... need no ``--config`` on a lab host."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from oddl.common.errors import ConfigError

SYSTEM_TESTBED = Path("/etc/oddl/testbed.toml")
"""The lab host's testbed file (docs/reference/cli.md, docs/how-to/lab-bring-up.md)."""

LOOKUP_HELP = ("testbed file (default: ODDL_CONFIG, else /etc/oddl/testbed.toml when it "
               "exists)")


def testbed_file(args: argparse.Namespace) -> str | None:
    """The testbed file of `args`: --config, ODDL_CONFIG, the system file when it exists,
    else None. An ODDL_CONFIG naming no file is an error that says so."""
    given = getattr(args, "config", None)
    if given:
        return str(given)
    env = os.environ.get("ODDL_CONFIG", "")
    if env:
        if not Path(env).is_file():
            raise ConfigError(f"ODDL_CONFIG={env}: no such testbed file; point it at the "
                              "testbed file (e.g. /etc/oddl/testbed.toml) or unset it")
        return env
    return str(SYSTEM_TESTBED) if SYSTEM_TESTBED.is_file() else None
