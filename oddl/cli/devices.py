"""`oddl devices host`: serve one device host's transmitters to the controller (decision
record 0036). Prints one JSON ready line (and writes it to --ready-file) once it serves."""

from __future__ import annotations

import argparse
import json
import sys

from oddl.cli.exit_codes import EXIT_OK
from oddl.cli.serve import print_ready
from oddl.common.signals import StopSignals


def cmd_devices_host(args: argparse.Namespace) -> int:
    """Drive the host's lasers for the controller until SIGINT/SIGTERM."""
    from oddl.common.config import load_testbed
    from oddl.controller.device_host import DeviceHost

    cfg = load_testbed(args.config)
    host = DeviceHost(cfg, args.host, listen=args.listen, insecure=args.insecure)
    try:
        with StopSignals() as stop:
            print_ready({"ready": True, "host": host.spec.id, "address": host.address,
                         "devices": list(host.drivers)}, args.ready_file)
            host.serve(lambda: stop.received is not None)
    finally:
        host.close()
        # on stderr, the process's log: what it served (a test or an operator checks that the
        # controller drove the rack through it)
        print(f"device host {host.spec.id} stopped; served {json.dumps(host.served)}",
              file=sys.stderr, flush=True)
    return EXIT_OK


def register(devices: argparse._SubParsersAction) -> None:
    """Add `oddl devices host` (to the sub-commands of `oddl devices`)."""
    host = devices.add_parser("host", help="drive one device host's lasers for the controller "
                              "(a rack's lasers on their own machine)")
    host.add_argument("--config", required=True, help="the testbed file the controller runs with")
    host.add_argument("--host", required=True, help="the id of its [[device_hosts]] entry")
    host.add_argument("--listen", help="HOST:PORT to bind (default: the entry's address; port 0: "
                      "any, printed in the ready line)")
    host.add_argument("--ready-file", help="also write the ready line to this file")
    host.add_argument("--insecure", action="store_true",
                      help="listen on a non-loopback address although the device host's wire "
                      "is not authenticated (a control network only the controller reaches)")
    host.set_defaults(func=cmd_devices_host)
