"""`oddl controller serve` and `oddl agent serve`: the run-time processes, until a signal.

Each prints one JSON ready line (and writes it to --ready-file) once it serves.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from oddl.cli.exit_codes import EXIT_OK
from oddl.common.errors import ConfigError
from oddl.common.signals import StopSignals
from oddl.common.tracing import session as tracing


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    with StopSignals() as stop:
        stop.wait()


def print_ready(info: dict[str, Any], ready_file: str | None) -> None:
    """Print the ready line (and write it atomically to `ready_file`)."""
    text = json.dumps(info)
    if ready_file:
        tmp = f"{ready_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, ready_file)
    print(text, flush=True)


def cmd_controller_serve(args: argparse.Namespace) -> int:
    """Run the controller until SIGINT/SIGTERM."""
    from oddl.common.config import load_testbed
    from oddl.controller.server import ControllerServer

    cfg = load_testbed(args.config)
    if args.trace:  # first: the start-up's device commands are on the trace
        tracing.start(args.trace, "controller", testbed=cfg.name, testbed_file=args.config,
                      capacity=args.trace_buffer)
    server = ControllerServer(cfg, args.listen, metrics_listen=args.metrics or None,
                              state=args.state, insecure=args.insecure)
    try:
        server.start()
        print_ready({"ready": True, "address": server.address, "testbed": cfg.name,
                      "metrics": server.metrics.address}, args.ready_file)
        wait_for_signal()
    finally:
        server.stop()
        tracing.stop()
    return EXIT_OK


def cmd_agent_serve(args: argparse.Namespace) -> int:
    """Run one node's agent until SIGINT/SIGTERM."""
    from oddl.agents.agent import Agent
    from oddl.common.config import load_testbed

    cfg = load_testbed(args.config)
    controller = args.controller or os.environ.get("ODDL_CONTROLLER") or cfg.controller.address
    if not controller:
        raise ConfigError(f"{args.config}: no controller address; pass --controller HOST:PORT "
                          "or set [controller] address")
    agent = Agent(cfg, args.node, controller, local_api=args.local_api, data_bind=args.data_bind,
                  local_api_group=args.local_api_group)
    try:
        if args.metrics:  # first: a bad address stops the agent before it registers
            agent.metrics.serve(args.metrics, who=f"agent {args.node}")
        agent.start()
        if args.trace:  # after the first clock sync: events go on the controller's clock
            trace_agent(agent, args)
        print_ready({"ready": True, "node": args.node, "local_api": agent.local_api,
                      "data_address": agent.data_address, "metrics": agent.metrics.address},
                     args.ready_file)
        wait_for_signal()
    finally:
        agent.close()
        tracing.stop()
    return EXIT_OK


def trace_agent(agent: Any, args: argparse.Namespace) -> None:
    """Record this agent's timeline on the controller's clock (its measured offset)."""
    from oddl.agents.trace import switch as trace_switch

    trace_switch.start(agent.node_id, agent.cfg, lambda: agent.clock, args.trace,
                       args.trace_buffer, lambda: agent.ctl.sync.offset_ns)


def _ready_and_metrics(sp: argparse.ArgumentParser) -> None:
    tracing.add_arguments(sp)
    sp.add_argument("--ready-file", help="write the ready line (JSON, with the served "
                    "addresses) here too")
    sp.add_argument("--metrics", default="127.0.0.1:0",
                    help="Prometheus endpoint HOST:PORT ('' to disable; default %(default)s)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `oddl controller serve` and `oddl agent serve`."""
    ctl = sub.add_parser("controller", help="the central controller").add_subparsers(
        dest="controller_cmd", required=True)
    serve = ctl.add_parser("serve", help="run the controller")
    serve.add_argument("--config", required=True)
    serve.add_argument("--listen", help="HOST:PORT (default: [controller] listen)")
    _ready_and_metrics(serve)
    serve.add_argument("--state", help="SQLite file to persist jobs, verified device state and "
                       "events in, and to resume from (default: [controller] state)")
    serve.add_argument("--insecure", action="store_true",
                       help="serve plaintext gRPC on a non-loopback address although the "
                       "testbed file has no [security] certs (anyone who reaches the port "
                       "can reconfigure the testbed)")
    serve.set_defaults(func=cmd_controller_serve)

    ag = sub.add_parser("agent", help="a node agent").add_subparsers(dest="agent_cmd",
                                                                      required=True)
    aserve = ag.add_parser("serve", help="run one node's agent")
    aserve.add_argument("--config", required=True)
    aserve.add_argument("--node", required=True)
    aserve.add_argument("--controller", help="HOST:PORT (default: ODDL_CONTROLLER or "
                        "[controller] address)")
    aserve.add_argument("--local-api", default="ipc://auto",
                        help="address of the training-process API: ipc://auto (default: a "
                        "Unix socket only this user can open), ipc:///PATH, or "
                        "tcp://127.0.0.1:PORT (reachable by every local user)")
    aserve.add_argument("--local-api-group", metavar="GROUP",
                        help="let members of GROUP use the local API too (socket 0660 and its "
                        "folder 0750 in that group): for training processes that run as "
                        "other users than the agent")
    aserve.add_argument("--data-bind", help="HOST:PORT for direct links (default: node host "
                        "and data_port)")
    _ready_and_metrics(aserve)
    aserve.set_defaults(func=cmd_agent_serve)
