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
import sys
from collections.abc import Callable, Sequence

from oddl import __version__
from oddl.cli.exit_codes import (
    EXIT_FAILED,
    EXIT_PIPE_CLOSED,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from oddl.common.errors import (
    CollectiveError,
    ConfigError,
    ControllerUnavailable,
    DeviceError,
    OddlError,
    OperationRefused,
    SafetyLimitError,
)

logger = logging.getLogger(__name__)

EMULATORS = {"itla": "itla_serve", "wss": "wss_serve", "powermeter": "powermeter_serve",
             "ocs": "ocs_serve",
             "testbed": "host", "bench": "bench_serve"}
"""`oddl emulate NAME` → the module in oddl.drivers.emulators that serves it."""


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


# ---- commands -----------------------------------------------------------------------------


def _emulate(module: str) -> tuple[Callable[[argparse.ArgumentParser], None],
                                   Callable[[argparse.Namespace], int]]:
    import importlib

    mod = importlib.import_module(f"oddl.drivers.emulators.{module}")
    return mod.add_arguments, mod.run


# ---- parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree: each sub-command module registers its own commands."""
    from oddl.cli import certs as certs_cli
    from oddl.cli import config as config_cli
    from oddl.cli import demo as demo_cli
    from oddl.cli import experiment as experiment_cli
    from oddl.cli import operator as operator_cli
    from oddl.cli import optinc as optinc_cli
    from oddl.cli import plan as plan_cli
    from oddl.cli import serve as serve_cli
    from oddl.cli import simulate as simulate_cli
    from oddl.cli import testbed as testbed_cli
    from oddl.cli import topoopt as topoopt_cli
    from oddl.cli import trace_tools as trace_tools_cli

    p = argparse.ArgumentParser(prog="oddl", description="Testbed controller for all-optical "
                                "networks carrying distributed deep learning (ODDL).")
    p.add_argument("--version", action="version", version=f"oddl {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv debug)")
    p.add_argument("--log-json", action="store_true",
                   help="log one JSON object per line (also ODDL_LOG_FORMAT=json)")
    sub = p.add_subparsers(dest="cmd", required=True)

    config_cli.register(sub)

    emu = sub.add_parser("emulate", help="run device emulators").add_subparsers(
        dest="emulate_cmd", required=True)
    for name, help_text in (
            ("itla", "one OIF-ITLA tunable laser (TCP or --pty)"),
            ("wss", "one flexgrid WSS (ASCII serial protocol)"),
            ("powermeter", "one N7744A-style power meter (SCPI on a TCPIP SOCKET)"),
            ("ocs", "one Polatis-style optical circuit switch (SCPI on a TCP socket)"),
            ("testbed", "every emulated device of a testbed file, and the optical fabric"),
            ("bench", "every device of a lab's testbed file, served at the resources it "
             "names (before the devices arrive)")):
        emu.add_parser(name, help=help_text, add_help=False)
    serve_cli.register(sub)
    demo_cli.register(sub)
    experiment_cli.register(sub)
    operator_cli.register(sub)
    operator_cli.register_schedule_show(plan_cli.register(sub))
    testbed_cli.register(sub)
    optinc_cli.register(sub)
    certs_cli.register(sub)
    simulate_cli.register(sub)
    topoopt_cli.register(sub)
    trace_tools_cli.register(sub)  # `oddl trace`: start, stop (trace_switch_cli), merge, ...
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
        if argv[1] == "testbed":  # a shipped testbed's name, as `oddl demo --config` takes
            return _guard(lambda: run(_shipped_config(args)))
        return _guard(lambda: run(args))
    args = parser.parse_args(argv)
    _setup_logging(verbose + args.verbose, json_logs)
    return _guard(lambda: args.func(args))


def _shipped_config(args: argparse.Namespace) -> argparse.Namespace:
    """`--config` as a path: a file, or the name of a shipped testbed (``topoopt-12node``)."""
    from oddl.launch.shipped import find_testbed

    args.config = str(find_testbed(args.config))
    return args


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
    except BrokenPipeError:  # `oddl plan ... | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit's flush does not fail again
        return EXIT_PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
