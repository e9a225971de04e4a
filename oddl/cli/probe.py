"""`oddl devices probe [--config FILE] [--json]`: check the bench against the testbed file
(--config, else ODDL_CONFIG, else /etc/oddl/testbed.toml when it exists).

Exit code 0 when every device of the file answered as the file says, 1 otherwise (the report
names each wrong port, wrong baud rate or silent device), 2 for a missing or bad file.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from oddl.cli.config_lookup import LOOKUP_HELP, testbed_file
from oddl.cli.exit_codes import EXIT_FAILED, EXIT_OK
from oddl.common.errors import ConfigError

SERVICE_USER, SERVICE_GROUP = "oddl", "dialout"
"""The User= and Group= the shipped controller unit runs it as (deploy/systemd; a house test
keeps them equal)."""


def register(devices_sub: Any) -> argparse.ArgumentParser:
    """Add `probe` under `oddl devices`."""
    p = devices_sub.add_parser(
        "probe", help="find attached serial ports and VISA resources, identify each device "
        "and check it against the testbed file (read-only; no controller needed)")
    # SUPPRESS: `oddl devices --config F probe` and `oddl devices probe --config F` both work
    p.add_argument("--config", default=argparse.SUPPRESS, help=LOOKUP_HELP)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print the report as JSON")
    p.add_argument("--no-scan", action="store_true",
                   help="only probe the devices of the file; do not list or try other ports")
    p.add_argument("--service-user", default=None, metavar="USER",
                   help="check that USER (the user the controller's service runs as) may open "
                   "every serial port, whoever probes (default: oddl, when that user exists)")
    p.add_argument("--service-group", default=SERVICE_GROUP, metavar="GROUP",
                   help="the group the controller's unit runs it with (Group=; default "
                   "%(default)s), counted as the service user's")
    p.set_defaults(func=cmd_probe)
    return p


def cmd_probe(args: argparse.Namespace) -> int:
    """Probe the bench; print the report; 0 when every device is as the file says."""
    from oddl.common.config import load_testbed
    from oddl.common.file_access import user_groups
    from oddl.operator.probe import format_report, probe

    path = testbed_file(args)
    if not path:
        raise ConfigError("oddl devices probe needs the testbed file: pass --config FILE, set "
                          "ODDL_CONFIG, or put it at /etc/oddl/testbed.toml")
    cfg = load_testbed(path)
    drivers_log = logging.getLogger("drivers")
    saved = drivers_log.level
    if not logging.getLogger().isEnabledFor(logging.INFO):
        # a probe expects silent ports and wrong protocols; the report says what they mean
        drivers_log.setLevel(logging.ERROR)
    user = args.service_user
    if user is None:
        user = SERVICE_USER if user_groups(SERVICE_USER) is not None else ""
    elif user_groups(user) is None:
        raise ConfigError(f"--service-user {user}: no such user on this host; name the user "
                          "the controller's service runs as (User= in its unit)")
    try:
        report = probe(cfg, scan=not args.no_scan, service_user=user,
                       service_group=args.service_group if user else "")
    finally:
        drivers_log.setLevel(saved)
    if getattr(args, "json", False):
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_report(report, path))
    return EXIT_OK if report.ok else EXIT_FAILED
