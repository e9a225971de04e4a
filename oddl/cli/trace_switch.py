"""`oddl trace start|stop`: record the timeline of a running testbed for a time window.

The controller starts or stops its recorder and tells every registered agent; each process
writes DIR/<process>.trace.json on its own host when it stops (docs/how-to/trace-a-run.md). The emulator
host records only when started with --trace (`oddl testbed up --trace DIR`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oddl.cli.exit_codes import EXIT_OK
from oddl.cli.operator import connect, sub_with_controller


def cmd_trace_start(args: argparse.Namespace) -> int:
    """Start recording at the controller and every agent."""
    directory = str(Path(args.dir).resolve())
    with_op = connect(args)
    try:
        reply = with_op.set_trace(True, directory, args.buffer)
    finally:
        with_op.close()
    agents = reply.get("agents", [])
    print(json.dumps({"recording": True, "dir": directory, "agents": agents}) if args.json else
          f"recording into {directory}: controller and {len(agents)} agents "
          f"({', '.join(agents) or 'none registered'}); `oddl trace stop` writes the files")
    return EXIT_OK


def cmd_trace_stop(args: argparse.Namespace) -> int:
    """Stop recording: every process writes its file."""
    with_op = connect(args)
    try:
        reply = with_op.set_trace(False)
    finally:
        with_op.close()
    path = reply.get("controller_file", "")
    print(json.dumps({"recording": False, **reply}) if args.json else
          f"stopped: {path or 'the controller was not recording'}; the agents write "
          f"agent-<node>.trace.json beside it on their hosts")
    return EXIT_OK


def add_switch_commands(tsub: argparse._SubParsersAction) -> None:
    """Add `start` and `stop` under `oddl trace`."""
    start = sub_with_controller(tsub, "start", help="start recording the timeline (controller "
                                "and agents)")
    start.add_argument("--dir", required=True, help="folder every process writes its "
                       "<process>.trace.json into (on its own host)")
    start.add_argument("--buffer", type=int, default=0, metavar="EVENTS",
                       help="events each process keeps (default: 250000)")
    start.set_defaults(func=cmd_trace_start)
    stop = sub_with_controller(tsub, "stop", help="stop recording; each process writes its file")
    stop.add_argument("--dir", help="ignored (each process writes where it was started)")
    stop.set_defaults(func=cmd_trace_stop)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `oddl trace` with `start` and `stop` (the readers add merge, summary, plot)."""
    trace = sub.add_parser("trace", help="record and read the testbed's timeline")
    add_switch_commands(trace.add_subparsers(dest="trace_cmd", required=True))
