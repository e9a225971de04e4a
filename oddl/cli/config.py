"""`oddl config check | show | example | new`: testbed files, validated and shown offline,
shipped, or written for a shape (docs/reference/testbed-file.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from oddl.cli.exit_codes import EXIT_OK, EXIT_USAGE


def cmd_config_check(args: argparse.Namespace) -> int:
    """Validate a testbed file offline."""
    from oddl.common.config import load_testbed

    cfg = load_testbed(args.file)
    summary = {"file": args.file, "ok": True, "name": cfg.name, "nodes": [n.id for n in cfg.nodes],
               "devices": {**{d.id: d.kind for d in cfg.devices},
                           **{d.id: "optinc" for d in getattr(cfg, "optinc", ())}},
               "fibres": len(cfg.fibres),
               "link": cfg.fabric.link}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{args.file}: ok — testbed {cfg.name!r}: {len(cfg.nodes)} nodes "
              f"({', '.join(summary['nodes'])}), {len(summary['devices'])} devices, "
              f"{len(cfg.fibres)} fibres, {cfg.fabric.link} link")
    return EXIT_OK


def cmd_config_show(args: argparse.Namespace) -> int:
    """Show what a testbed file wires: hosts on WSSs, host ports on circuit switches, devices."""
    from oddl.common.config import load_testbed
    from oddl.launch.shipped import find_testbed
    from oddl.operator.wiring import describe, format_wiring

    view = describe(load_testbed(find_testbed(args.file)))
    print(json.dumps(view) if args.json else format_wiring(view))
    return EXIT_OK


def cmd_config_example(args: argparse.Namespace) -> int:
    """Print a testbed file shipped with oddl (or list them)."""
    from oddl.launch.shipped import read_shipped_testbed, shipped_testbed_names

    if not args.name:
        print("\n".join(shipped_testbed_names()))
        return EXIT_OK
    sys.stdout.write(read_shipped_testbed(args.name))
    return EXIT_OK


def cmd_config_new(args: argparse.Namespace) -> int:
    """Write a testbed file of ODDL's shape with any number of hosts."""
    from oddl.launch.shapes import Shape, check_shape, oddl_wss, switched

    shape = Shape(args.hosts, lab=args.lab, ports=args.ports, named=args.name, rack=args.rack)
    problem = check_shape(shape)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(switched(shape) if shape.ports else oddl_wss(shape))
    return EXIT_OK


def register(sub: Any) -> None:
    """Add `oddl config` and its commands to the command tree."""
    cfg = sub.add_parser("config", help="testbed files").add_subparsers(dest="config_cmd",
                                                                          required=True)
    check = cfg.add_parser("check", help="validate a testbed file offline")
    check.add_argument("file")
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=cmd_config_check)
    show = cfg.add_parser("show", help="show what a testbed file wires (hosts, their WSS "
                          "ports and circuit-switch ports, devices), offline")
    show.add_argument("file", help="a testbed file, or the name of a shipped one")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_config_show)
    example = cfg.add_parser("example", help="print a testbed file shipped with oddl (no "
                             "name: list them), e.g. the template of /etc/oddl/testbed.toml",
                             description="oddl config example lab-4node > testbed.toml")
    example.add_argument("name", nargs="?", help="lab-4node or emulated-4node")
    example.set_defaults(func=cmd_config_example)
    new = cfg.add_parser("new", help="write a testbed file of ODDL's shape with N hosts (one "
                         "laser each, one 1xN WSS) to standard output",
                         description="oddl config new --hosts 16 > emulated-16node.toml; "
                         "oddl config new --hosts 12 --ports 4 > topoopt-12node.toml; "
                         "oddl config new --hosts 48 --rack 16 > racked.toml; "
                         "oddl config new --hosts 8 --lab > testbed.toml (then edit it to the "
                         "bench and run oddl config check)")
    new.add_argument("--hosts", type=int, required=True, help="number of hosts, 2..48")
    new.add_argument("--ports", type=int, default=0,
                     help="fixed ports per host, all on one optical circuit switch (TopoOpt's "
                     "shape); without it, ODDL's shape")
    new.add_argument("--name", default="", help="the testbed's name (default: from the shape, "
                     "e.g. emulated-8node)")
    new.add_argument("--rack", type=int, default=None, metavar="K",
                     help="every K consecutive lasers on one device host ([[device_hosts]] "
                     "rack0, rack1, ...; ODDL's shape only), command_ms budgeting one request "
                     "per rack")
    new.add_argument("--lab", action="store_true",
                     help="serial and LAN resources, direct links, security (else emulated)")
    new.set_defaults(func=cmd_config_new)
