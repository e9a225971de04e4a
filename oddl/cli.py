"""The `oddl` command line: `main(argv)` returns the exit code.

Exit codes: 0 success; 1 the operation ran and failed (e.g. a wrong all-reduce result);
2 usage or configuration error; 3 the controller could not be reached; 4 the controller
refused the operation. Every error message says what to do.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from common.errors import (
    CollectiveError,
    ConfigError,
    ControllerUnavailable,
    DeviceError,
    OddlError,
    OperationRefused,
    SafetyLimitError,
)
from oddl import __version__

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_REFUSED = 0, 1, 2, 3, 4

EMULATORS = {"itla": "itla", "wss": "wss", "powermeter": "powermeter", "testbed": "host"}
"""`oddl emulate NAME` → the module in drivers.emulators that serves it."""


class JsonLogFormatter(logging.Formatter):
    """One JSON object per log record (`--log-json` or ODDL_LOG_FORMAT=json)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
                 "level": record.levelname, "logger": record.name, "pid": record.process,
                 "thread": record.threadName, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _setup_logging(verbosity: int, json_logs: bool = False) -> None:
    level = logging.WARNING - 10 * verbosity
    handler = logging.StreamHandler(sys.stderr)
    if json_logs or os.environ.get("ODDL_LOG_FORMAT") == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=max(level, logging.DEBUG), handlers=[handler])


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def _print_ready(info: dict[str, Any], ready_file: str | None) -> None:
    text = json.dumps(info)
    if ready_file:
        tmp = f"{ready_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, ready_file)
    print(text, flush=True)


# ---- commands -----------------------------------------------------------------------------


def cmd_config_check(args: argparse.Namespace) -> int:
    """Validate a testbed file offline."""
    from common.config import load_testbed

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


def cmd_controller_serve(args: argparse.Namespace) -> int:
    """Run the controller until SIGINT/SIGTERM."""
    from common.config import load_testbed
    from controller.service import ControllerServer

    cfg = load_testbed(args.config)
    server = ControllerServer(cfg, args.listen, metrics_listen=args.metrics or None,
                              state=args.state, insecure=args.insecure)
    server.start()
    try:
        _print_ready({"ready": True, "address": server.address, "testbed": cfg.name,
                      "metrics": server.metrics.address}, args.ready_file)
        _wait_for_signal()
    finally:
        server.stop()
    return EXIT_OK


def cmd_agent_serve(args: argparse.Namespace) -> int:
    """Run one node's agent until SIGINT/SIGTERM."""
    from agents.agent import Agent
    from common.config import load_testbed

    cfg = load_testbed(args.config)
    controller = args.controller or os.environ.get("ODDL_CONTROLLER") or cfg.controller.address
    if not controller:
        raise ConfigError(f"{args.config}: no controller address; pass --controller HOST:PORT "
                          "or set [controller] address")
    agent = Agent(cfg, args.node, controller, local_api=args.local_api, data_bind=args.data_bind,
                  local_api_group=args.local_api_group)
    try:
        agent.start()
        if args.metrics:
            agent.metrics.serve(args.metrics)
        _print_ready({"ready": True, "node": args.node, "local_api": agent.local_api,
                      "data_address": agent.data_address, "metrics": agent.metrics.address},
                     args.ready_file)
        _wait_for_signal()
    finally:
        agent.close()
    return EXIT_OK


def _emulate(module: str) -> tuple[Callable[[argparse.ArgumentParser], None],
                                   Callable[[argparse.Namespace], int]]:
    import importlib

    mod = importlib.import_module(f"drivers.emulators.{module}")
    return mod.add_arguments, mod.run


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the emulated four-node testbed end to end (`--train`: PyTorch DDP on digits)."""
    if args.train:
        from oddl.train_demo import run_train

        return run_train(args)
    from oddl.demo import run_demo

    return run_demo(args)


# ---- operator commands against a running controller ---------------------------------------


def controller_address(args: argparse.Namespace) -> str:
    """--controller, then ODDL_CONTROLLER, then --config's [controller] address, then the
    testbed started with `oddl testbed up`."""
    from oddl.testbed_cli import load_state

    if args.controller:
        return args.controller
    if os.environ.get("ODDL_CONTROLLER"):
        return os.environ["ODDL_CONTROLLER"]
    if getattr(args, "config", None):
        from common.config import load_testbed

        cfg = load_testbed(args.config)
        if cfg.controller.address:
            return cfg.controller.address
    state = load_state()
    if state:
        return state["controller"]
    raise ConfigError("no controller address: pass --controller HOST:PORT, set "
                      "ODDL_CONTROLLER, give --config with a [controller] address, or start "
                      "one with `oddl testbed up`")


def _controller(args: argparse.Namespace) -> Any:
    from oddl.operator import OperatorClient

    certs, operator = getattr(args, "certs", None) or os.environ.get("ODDL_CERTS", ""), "operator"
    if getattr(args, "config", None):
        from common.config import load_testbed

        security = load_testbed(args.config).security
        certs, operator = certs or security.certs, security.operator
    return OperatorClient(controller_address(args), certs=certs, operator=operator)


def cmd_topology(args: argparse.Namespace) -> int:
    """Show nodes, devices and the grid."""
    from oddl.operator import format_topology

    topo = _controller(args).topology()
    print(json.dumps(topo, indent=2) if args.json else format_topology(topo))
    return EXIT_OK


def cmd_devices(args: argparse.Namespace) -> int:
    """Read every device back, or show the device log."""
    from oddl.operator import format_device_log, format_devices

    client = _controller(args)
    if args.devices_cmd == "log":
        entries = client.device_log(args.limit, args.device or "")
        print(json.dumps(entries, indent=2) if args.json else format_device_log(entries))
    else:
        state = client.devices()
        print(json.dumps(state, indent=2) if args.json else format_devices(state))
    return EXIT_OK


def cmd_schedule_show(args: argparse.Namespace) -> int:
    """Show the slot schedule a job gets for a message size."""
    from google.protobuf.json_format import MessageToDict

    from oddl.operator import format_schedule
    from oddl.plan_cli import parse_size

    sched = _controller(args).schedule(args.job_id, parse_size(args.bytes), args.itemsize)
    print(json.dumps(MessageToDict(sched, preserving_proto_field_name=True)) if args.json
          else format_schedule(sched))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    """The live terminal view."""
    from oddl.watch import watch

    return watch(_controller(args), interval=args.interval, once=args.once)


def cmd_status(args: argparse.Namespace) -> int:
    """Show agents, jobs and counters."""
    from oddl.operator import format_status

    status = _controller(args).status()
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return EXIT_OK


def cmd_jobs(args: argparse.Namespace) -> int:
    """List, submit or cancel jobs."""
    from oddl.operator import format_jobs

    client = _controller(args)
    if args.jobs_cmd == "submit":
        job = client.submit(args.name, args.nodes.split(",") if args.nodes else [],
                            args.collective, args.network)
        print(json.dumps(job) if args.json else f"submitted {job['id']} ({job['collective']} on "
              f"{','.join(job['nodes'])}, {job['network']})")
    elif args.jobs_cmd == "cancel":
        job = client.cancel(args.job_id)
        print(json.dumps(job) if args.json else f"{job['id']}: {job['state']}")
    else:
        jobs = client.jobs()
        print(json.dumps(jobs, indent=2) if args.json else format_jobs(jobs))
    return EXIT_OK


def cmd_reconfigure(args: argparse.Namespace) -> int:
    """Set a transceiver's channel or a WSS route by hand (dry run, then confirm)."""
    client = _controller(args)
    if args.transmitter:
        change: dict[str, Any] = {"set_channel": {"transmitter": args.transmitter,
                                                  "channel": args.channel}}
    else:
        if args.port is None:
            print("oddl reconfigure --wss needs --port: the out-port for the channel, or 99 to "
                  "block it", file=sys.stderr)
            return EXIT_USAGE
        change = {"set_route": {"wss": args.wss, "channel": args.channel, "port": args.port,
                                "attenuation_db": args.attenuation}}
    preview = client.reconfigure(change, dry_run=True)
    if args.dry_run:
        print(json.dumps(preview) if args.json else "\n".join(["dry run:", *preview["changes"]]))
        return EXIT_OK
    if not args.yes:
        if not sys.stdin.isatty():
            print("refusing to apply without confirmation: pass --yes (or --dry-run)",
                  file=sys.stderr)
            return EXIT_USAGE
        answer = input(f"apply {'; '.join(preview['changes'])}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not applied")
            return EXIT_OK
    result = client.reconfigure(change, dry_run=False)
    print(json.dumps(result) if args.json else f"{result['message']}: {'; '.join(result['changes'])}")
    return EXIT_OK


# ---- parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    p = argparse.ArgumentParser(prog="oddl", description="Testbed controller for all-optical "
                                "networks carrying distributed deep learning (ODDL).")
    p.add_argument("--version", action="version", version=f"oddl {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv debug)")
    p.add_argument("--log-json", action="store_true",
                   help="log one JSON object per line (also ODDL_LOG_FORMAT=json)")
    sub = p.add_subparsers(dest="cmd", required=True)

    cfg = sub.add_parser("config", help="testbed files").add_subparsers(dest="config_cmd",
                                                                          required=True)
    check = cfg.add_parser("check", help="validate a testbed file offline")
    check.add_argument("file")
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=cmd_config_check)

    emu = sub.add_parser("emulate", help="run device emulators").add_subparsers(
        dest="emulate_cmd", required=True)
    for name, help_text in (
            ("itla", "one OIF-ITLA tunable laser (TCP or --pty)"),
            ("wss", "one flexgrid WSS (ASCII serial protocol)"),
            ("powermeter", "one N7744A-style power meter (SCPI on a TCPIP SOCKET)"),
            ("testbed", "every emulated device of a testbed file, and the optical fabric")):
        emu.add_parser(name, help=help_text, add_help=False)

    ctl = sub.add_parser("controller", help="the central controller").add_subparsers(
        dest="controller_cmd", required=True)
    serve = ctl.add_parser("serve", help="run the controller")
    serve.add_argument("--config", required=True)
    serve.add_argument("--listen", help="HOST:PORT (default: [controller] listen)")
    serve.add_argument("--ready-file", help="write the served address here as JSON")
    serve.add_argument("--metrics", default="127.0.0.1:0",
                       help="Prometheus endpoint HOST:PORT ('' to disable; default %(default)s)")
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
    aserve.add_argument("--ready-file")
    aserve.add_argument("--metrics", default="127.0.0.1:0",
                        help="Prometheus endpoint HOST:PORT ('' to disable; default %(default)s)")
    aserve.set_defaults(func=cmd_agent_serve)

    demo = sub.add_parser("demo", help="run the emulated four-node testbed end to end")
    demo.add_argument("--config", default=None, help="testbed file (default: the emulated "
                      "four-node testbed)")
    demo.add_argument("--iterations", type=int, default=20)
    demo.add_argument("--collective", default="ring")
    demo.add_argument("--params", type=int, default=1_000_000,
                      help="model parameters (gradient elements)")
    demo.add_argument("--run-dir", default=None, help="where logs go (default runs/<time>)")
    demo.add_argument("--json", action="store_true")
    demo.add_argument("--train", action="store_true", help="train a CNN on scikit-learn's "
                      "digits with PyTorch DDP through the agents, then over gloo as baseline "
                      "(needs the torch extra: pip install '.[torch]')")
    demo.add_argument("--epochs", type=int, default=5, help="epochs with --train")
    demo.add_argument("--backend", choices=["hook", "oddl"], default="hook",
                      help="with --train: hook (DDP over gloo with the optical comm hook) or "
                      "oddl (DDP with no hook over the oddl torch.distributed backend)")
    demo.set_defaults(func=cmd_demo)

    def with_controller(sp: argparse.ArgumentParser, default: Any = None) -> argparse.ArgumentParser:
        """Add --controller/--config/--json (sub-commands repeat them without defaults, so
        they may stand before or after the sub-command)."""
        sp.add_argument("--controller", default=default,
                        help="HOST:PORT (default: ODDL_CONTROLLER, --config, or the testbed "
                        "of `oddl testbed up`)")
        sp.add_argument("--config", default=default,
                        help="testbed file whose [controller] address to use")
        sp.add_argument("--json", action="store_true",
                        default=False if default is None else default)
        sp.add_argument("--certs", default=default, help="folder of `oddl certs init` for "
                        "mutual TLS (default: ODDL_CERTS or --config's [security] certs)")
        return sp

    def sub_with_controller(group: Any, name: str, **kw: Any) -> argparse.ArgumentParser:
        return with_controller(group.add_parser(name, **kw), default=argparse.SUPPRESS)

    with_controller(sub.add_parser("status", help="agents, jobs, counters")).set_defaults(
        func=cmd_status)
    with_controller(sub.add_parser("topology", help="nodes, devices, grid")).set_defaults(
        func=cmd_topology)
    dev = with_controller(sub.add_parser("devices", help="device state and log"))
    dsub = dev.add_subparsers(dest="devices_cmd")
    sub_with_controller(dsub, "state", help="read every device back (the default)")
    dlog = sub_with_controller(dsub, "log", help="identify/stage/apply/tune/transaction events")
    dlog.add_argument("--device", help="only this device")
    dlog.add_argument("--limit", type=int, default=50)
    dev.set_defaults(func=cmd_devices)
    from oddl import probe_cli

    probe_cli.register(dsub)
    from oddl import certs_cli, optinc_cli, plan_cli, simulate_cli, testbed_cli, topoopt_cli

    ssub = plan_cli.register(sub)
    testbed_cli.register(sub)
    optinc_cli.register(sub)
    certs_cli.register(sub)
    simulate_cli.register(sub)
    topoopt_cli.register(sub)
    show = with_controller(ssub.add_parser("show", help="the slots a running job gets for a "
                                           "message size"))  # `schedule` itself has none
    show.add_argument("job_id")
    show.add_argument("--bytes", default="1MB", help="message size (e.g. 4MB)")
    show.add_argument("--itemsize", type=int, default=4)
    show.set_defaults(func=cmd_schedule_show)
    w = with_controller(sub.add_parser("watch", help="live view of circuits, slots, devices"))
    w.add_argument("--interval", type=float, default=1.0)
    w.add_argument("--once", action="store_true", help="print one frame and exit")
    w.set_defaults(func=cmd_watch)
    jobs = with_controller(sub.add_parser("jobs", help="list, submit, cancel jobs"))
    jsub = jobs.add_subparsers(dest="jobs_cmd")
    sub_with_controller(jsub, "list")
    js = sub_with_controller(jsub, "submit")
    js.add_argument("--name", default="")
    js.add_argument("--nodes", default="", help="comma-separated, rank order (default: all)")
    js.add_argument("--collective", default="ring",
                    help="ring, halving-doubling, wrht, totientperms, parameter-server, topoopt, "
                    "optinc")
    js.add_argument("--network", default="optical", choices=("optical", "ideal"))
    jc = sub_with_controller(jsub, "cancel")
    jc.add_argument("job_id")
    jobs.set_defaults(func=cmd_jobs)

    rc = with_controller(sub.add_parser("reconfigure", help="set a channel or a WSS route"))
    what = rc.add_mutually_exclusive_group(required=True)
    what.add_argument("--transmitter", help="transmitter device id (with --channel)")
    what.add_argument("--wss", help="WSS device id (with --channel --port [--attenuation])")
    rc.add_argument("--channel", type=int, required=True)
    rc.add_argument("--port", type=int, default=None,
                    help="the WSS out-port for the channel (99 blocks it)")
    rc.add_argument("--attenuation", type=float, default=0.0)
    rc.add_argument("--dry-run", action="store_true")
    rc.add_argument("--yes", action="store_true", help="apply without asking")
    rc.set_defaults(func=cmd_reconfigure)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    verbose, json_logs = 0, False
    while argv and argv[0] in ("-v", "-vv", "-vvv", "--verbose", "--log-json"):
        if argv[0] == "--log-json":
            json_logs = True
        else:
            verbose += argv[0].count("v") if argv[0] != "--verbose" else 1
        argv = argv[1:]
    # emulator sub-commands own their options: parse them with the module's own parser
    if len(argv) >= 2 and argv[0] == "emulate" and argv[1] in EMULATORS:
        add_arguments, run = _emulate(EMULATORS[argv[1]])
        sp = argparse.ArgumentParser(prog=f"oddl emulate {argv[1]}")
        sp.add_argument("-v", "--verbose", action="count", default=0)
        add_arguments(sp)
        args = sp.parse_args(argv[2:])
        _setup_logging(verbose + args.verbose, json_logs)
        return _guard(lambda: run(args))
    args = parser.parse_args(argv)
    _setup_logging(verbose + args.verbose, json_logs)
    return _guard(lambda: args.func(args))


def _guard(fn: Callable[[], int]) -> int:
    try:
        return fn()
    except (ConfigError, SafetyLimitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ControllerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except OperationRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (CollectiveError, DeviceError, OddlError) as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
