"""Operator commands against a running controller: `oddl status`, `topology`, `devices`,
`watch`, `jobs`, `reconfigure` and `schedule show`.

The testbed file is --config, else ODDL_CONFIG, else /etc/oddl/testbed.toml when it exists
(oddl.cli.config_lookup). The controller is found through --controller, ODDL_CONTROLLER, that
file's [controller] address, or the testbed of `oddl testbed up`, in that order.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oddl.cli.config_lookup import LOOKUP_HELP, testbed_file
from oddl.cli.exit_codes import EXIT_OK, EXIT_USAGE
from oddl.common.errors import ConfigError
from oddl.common.extras import require


def controller_address(args: argparse.Namespace) -> str:
    """--controller, then ODDL_CONTROLLER, then the testbed file's [controller] address (the
    file: --config, ODDL_CONFIG or /etc/oddl/testbed.toml), then the testbed started with
    `oddl testbed up`."""
    from oddl.cli.testbed import load_state

    if args.controller:
        return str(args.controller)
    if os.environ.get("ODDL_CONTROLLER"):
        return os.environ["ODDL_CONTROLLER"]
    path = testbed_file(args)
    if path:
        from oddl.common.config import load_testbed

        cfg = load_testbed(path)
        if cfg.controller.address:
            return cfg.controller.address
    state = load_state()
    if state:
        return str(state["controller"])
    raise ConfigError("no controller address: pass --controller HOST:PORT, set "
                      "ODDL_CONTROLLER, give a testbed file with a [controller] address "
                      "(--config, ODDL_CONFIG or /etc/oddl/testbed.toml), or start one with "
                      "`oddl testbed up`")


def connect(args: argparse.Namespace) -> Any:
    """An operator client for the controller of `args` (mutual TLS with --certs)."""
    from oddl.operator.client import OperatorClient

    certs, operator = getattr(args, "certs", None) or os.environ.get("ODDL_CERTS", ""), "operator"
    path = testbed_file(args)
    if path:
        from oddl.common.config import load_testbed

        security = load_testbed(path).security
        certs, operator = certs or security.certs, security.operator
    if certs:
        from oddl.common.security.files import SecurityFiles

        # a folder `certs hand-out` wrote names one operator: its own
        named = SecurityFiles.load(certs).operators
        if operator not in named and len(named) == 1:
            operator = named[0]
    return OperatorClient(controller_address(args), certs=certs, operator=operator)


def _show(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> int:
    """Print `data` as indented JSON (--json) or as `text(data)`."""
    print(json.dumps(data, indent=2) if args.json else text(data))
    return EXIT_OK


def cmd_topology(args: argparse.Namespace) -> int:
    """Show nodes, devices and the grid."""
    from oddl.operator.client import format_topology

    return _show(args, connect(args).topology(), format_topology)


def cmd_devices(args: argparse.Namespace) -> int:
    """Read every device back, or show the device log."""
    from oddl.operator.client import format_device_log, format_devices

    client = connect(args)
    if args.devices_cmd == "log":
        return _show(args, client.device_log(args.limit, args.device or ""), format_device_log)
    return _show(args, client.devices(), format_devices)


def cmd_schedule_show(args: argparse.Namespace) -> int:
    """Show the slot schedule a job gets for a message size."""
    from google.protobuf.json_format import MessageToDict

    from oddl.cli.plan import parse_size
    from oddl.operator.client import format_schedule

    sched = connect(args).schedule(args.job_id, parse_size(args.bytes), args.itemsize,
                                   args.kind, args.root)
    print(json.dumps(MessageToDict(sched, preserving_proto_field_name=True)) if args.json
          else format_schedule(sched))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    """The live terminal view."""
    require("rich", "`oddl watch`")
    from oddl.operator.watch import watch

    return watch(connect(args), interval=args.interval, once=args.once)


def cmd_status(args: argparse.Namespace) -> int:
    """Show agents, jobs and counters."""
    from oddl.operator.client import format_status

    return _show(args, connect(args).status(), format_status)


def cmd_jobs(args: argparse.Namespace) -> int:
    """List, submit or cancel jobs."""
    from oddl.operator.client import format_jobs

    client = connect(args)
    if args.jobs_cmd == "submit":
        try:
            params = job_params(args.param, args.topology)
        except ValueError as exc:
            print(f"oddl jobs submit: {exc}", file=sys.stderr)
            return EXIT_USAGE
        job = client.submit(args.name, args.nodes.split(",") if args.nodes else [],
                            args.collective, args.network or "", params)
        print(json.dumps(job) if args.json else f"submitted {job['id']} ({job['collective']} on "
              f"{','.join(job['nodes'])}, {job['network']})")
    elif args.jobs_cmd == "cancel":
        job = client.cancel(args.job_id)
        print(json.dumps(job) if args.json else f"{job['id']}: {job['state']}")
    else:
        jobs = client.jobs()
        print(json.dumps(jobs, indent=2) if args.json else format_jobs(jobs))
    return EXIT_OK


def job_params(pairs: list[str], topology: str | None) -> dict[str, str]:
    """`--param K=V` and `--topology FILE` as a job's parameters; ValueError naming the fix."""
    params: dict[str, str] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param {item!r}: give KEY=VALUE, e.g. --param degree=4")
        params[key.strip()] = value.strip()
    if topology:
        params.update(topoopt_params(topology))
    return params


def topoopt_params(path: str) -> dict[str, str]:
    """The rings and matchings of the topology `oddl topoopt --json` wrote, as job
    parameters (jumps=…, links=…)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--topology {path}: cannot read it ({exc}); write it with "
                         "`oddl topoopt --model M --nodes N --json > FILE`") from None
    topo = (doc.get("topoopt") or {}).get("topology") if isinstance(doc, dict) else None
    topo = topo or (doc.get("topology") if isinstance(doc, dict) else None)
    if not isinstance(topo, dict) or "jumps" not in topo:
        raise ValueError(f"--topology {path}: no topology with jumps in it; give the JSON "
                         "`oddl topoopt --json` prints")
    n = int(topo.get("nodes", 0))
    rings = topo.get("ring_jumps", {}).get("1") or [p for p in topo["jumps"]
                                                     if math.gcd(int(p), n) == 1]
    links = [f"{a}-{b}" for matching in topo.get("matchings", []) for a, b in matching]
    params = {"jumps": ",".join(str(p) for p in rings)}
    if links:
        params["links"] = ",".join(links)
    return params


def cmd_reconfigure(args: argparse.Namespace) -> int:
    """Set a transceiver's channel, a WSS route or circuit-switch connections by hand (dry
    run, then confirm)."""
    try:
        change = _change_of(args)
    except ValueError as exc:
        print(f"oddl reconfigure: {exc}", file=sys.stderr)
        return EXIT_USAGE
    client = connect(args)
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


def _change_of(args: argparse.Namespace) -> dict[str, Any]:
    """The ReconfigureRequest change the options ask for; ValueError saying what is missing."""
    if args.ocs:
        if args.connect is None and args.disconnect is None:
            raise ValueError("--ocs needs --connect IN:OUT[,IN:OUT...] and/or --disconnect "
                             "IN[,IN...] (ingress ports 1..N, egress ports N+1..2N)")
        return {"set_connections": {"ocs": args.ocs, "connect": parse_pairs(args.connect or ""),
                                    "disconnect": parse_ports(args.disconnect or "")}}
    if args.connect is not None or args.disconnect is not None:
        raise ValueError("--connect and --disconnect set a circuit switch: give --ocs SWITCH")
    if args.channel is None:
        raise ValueError(f"--{'transmitter' if args.transmitter else 'wss'} needs --channel")
    if args.transmitter:
        return {"set_channel": {"transmitter": args.transmitter, "channel": args.channel}}
    if args.port is None:
        raise ValueError("--wss needs --port: the out-port for the channel, or 99 to block it")
    return {"set_route": {"wss": args.wss, "channel": args.channel, "port": args.port,
                          "attenuation_db": args.attenuation}}


def parse_ports(text: str) -> list[int]:
    """'3,4' → [3, 4]; ValueError naming the bad item."""
    ports = []
    for item in (t.strip() for t in text.split(",")):
        if item:
            if not item.isdigit():
                raise ValueError(f"--disconnect: {item!r} is not a port number (give "
                                 "ingress ports as IN[,IN...], e.g. 3,4)")
            ports.append(int(item))
    return ports


def parse_pairs(text: str) -> dict[int, int]:
    """'1:53,2:54' → {1: 53, 2: 54}; ValueError naming the bad item."""
    pairs: dict[int, int] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        ingress, sep, egress = item.partition(":")
        if not (sep and ingress.strip().isdigit() and egress.strip().isdigit()):
            raise ValueError(f"--connect: {item!r} is not IN:OUT (give ingress:egress port "
                             "pairs, e.g. 1:53,2:54)")
        if int(ingress) in pairs:
            raise ValueError(f"--connect: ingress {int(ingress)} is given twice; name each "
                             "ingress port once")
        pairs[int(ingress)] = int(egress)
    return pairs


# ---- parser -------------------------------------------------------------------------------


def with_controller(sp: argparse.ArgumentParser, default: Any = None) -> argparse.ArgumentParser:
    """Add --controller/--config/--json (sub-commands repeat them without defaults, so
    they may stand before or after the sub-command)."""
    sp.add_argument("--controller", default=default,
                    help="HOST:PORT (default: ODDL_CONTROLLER, the testbed file's "
                    "[controller] address, or the testbed of `oddl testbed up`)")
    sp.add_argument("--config", default=default,
                    help=LOOKUP_HELP + "; its [controller] address and [security] are used")
    sp.add_argument("--json", action="store_true",
                    default=False if default is None else default)
    sp.add_argument("--certs", default=default, help="folder of `oddl certs init` for "
                    "mutual TLS (default: ODDL_CERTS or --config's [security] certs)")
    return sp

def sub_with_controller(group: Any, name: str, **kw: Any) -> argparse.ArgumentParser:
    """A sub-command that takes the controller options too."""
    return with_controller(group.add_parser(name, **kw), default=argparse.SUPPRESS)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `oddl status`, `topology`, `devices` (with `devices probe`), `watch`, `jobs` and
    `reconfigure`."""
    from oddl.cli import devices as devices_cli
    from oddl.cli import probe as probe_cli

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
    probe_cli.register(dsub)
    devices_cli.register(dsub)
    w = with_controller(sub.add_parser("watch", help="live view of circuits, slots, devices"))
    w.add_argument("--interval", type=float, default=1.0)
    w.add_argument("--once", action="store_true", help="print one frame and exit")
    w.set_defaults(func=cmd_watch)
    _register_jobs(sub)
    _register_reconfigure(sub)


def register_schedule_show(ssub: argparse._SubParsersAction) -> None:
    """Add `oddl schedule show` under `oddl schedule` (of oddl.cli.plan)."""
    show = with_controller(ssub.add_parser("show", help="the slots a running job gets for a "
                                           "message size"))  # `schedule` itself has none
    show.add_argument("job_id")
    show.add_argument("--bytes", default="1MB", help="message size (e.g. 4MB)")
    show.add_argument("--itemsize", type=int, default=4)
    show.add_argument("--kind", default="all_reduce", help="collective kind: all_reduce, "
                      "all_gather, reduce_scatter, broadcast, all_to_all, gather, scatter")
    show.add_argument("--root", type=int, default=0, help="root rank (broadcast, gather, "
                      "scatter)")
    show.set_defaults(func=cmd_schedule_show)


def _register_jobs(sub: argparse._SubParsersAction) -> None:
    jobs = with_controller(sub.add_parser("jobs", help="list, submit, cancel jobs"))
    jsub = jobs.add_subparsers(dest="jobs_cmd")
    sub_with_controller(jsub, "list")
    js = sub_with_controller(jsub, "submit")
    js.add_argument("--name", default="")
    js.add_argument("--nodes", default="", help="comma-separated, rank order (default: all)")
    js.add_argument("--collective", default="ring",
                    help="ring, halving-doubling, wrht, totientperms, parameter-server, topoopt, "
                    "optinc")
    js.add_argument("--network", default=None, choices=("optical", "ideal", "circuit"),
                    help="optical (ODDL's slots on a WSS), circuit (light paths a circuit "
                    "switch holds for the job), ideal (the electrical baseline); default: the "
                    "one the hosts' optics make")
    js.add_argument("--param", action="append", default=[], metavar="K=V",
                    help="a collective parameter, e.g. degree=4 or wavelengths=2 (repeat)")
    js.add_argument("--topology", metavar="FILE",
                    help="with --collective topoopt: the JSON `oddl topoopt --json` wrote; "
                    "the job's rings are its ring jumps and its matchings become light paths")
    jc = sub_with_controller(jsub, "cancel")
    jc.add_argument("job_id")
    jobs.set_defaults(func=cmd_jobs)


def _register_reconfigure(sub: argparse._SubParsersAction) -> None:
    rc = with_controller(sub.add_parser("reconfigure", help="set a channel, a WSS route or "
                                        "circuit-switch connections"))
    what = rc.add_mutually_exclusive_group(required=True)
    what.add_argument("--transmitter", help="transmitter device id (with --channel)")
    what.add_argument("--wss", help="WSS device id (with --channel --port [--attenuation])")
    what.add_argument("--ocs", help="circuit switch device id (with --connect and/or "
                      "--disconnect); its other ports keep their connections")
    rc.add_argument("--channel", type=int, default=None)
    rc.add_argument("--connect", default=None, metavar="IN:OUT[,IN:OUT...]",
                    help="connect ingress ports to egress ports (ingress 1..N, egress "
                    "N+1..2N of an NxN switch)")
    rc.add_argument("--disconnect", default=None, metavar="IN[,IN...]",
                    help="leave these ingress ports unconnected")
    rc.add_argument("--port", type=int, default=None,
                    help="the WSS out-port for the channel (99 blocks it)")
    rc.add_argument("--attenuation", type=float, default=0.0)
    rc.add_argument("--dry-run", action="store_true")
    rc.add_argument("--yes", action="store_true", help="apply without asking")
    rc.set_defaults(func=cmd_reconfigure)
