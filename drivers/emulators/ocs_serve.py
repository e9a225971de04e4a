"""The emulated optical circuit switch's TCP server and its command line.

``python -m oddl.drivers.emulators.ocs_serve --listen 127.0.0.1:0 --size 16`` serves one
emulated switch and prints one JSON line once it listens::

    {"ready": true, "resource": "TCPIP0::127.0.0.1::41234::SOCKET",
     "url": "socket://127.0.0.1:41234", "host": "127.0.0.1", "port": 41234, "size": 16,
     "model": "N-OST-16x16-LA1-DMHNS", "serial": "EMU00001", "state": null}

It serves until SIGINT or SIGTERM. Lines in end in LF, CR or CR-LF; every answer goes out
ending in CR-LF, when it is due (``*OPC?`` after the switching time).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import socket
import sys
import time
from collections.abc import Callable

from oddl.common.errors import ConfigError
from oddl.drivers.emulators.cli import (
    checked_arg,
    listen_arg,
    milliseconds_arg,
    serve_until_signal,
    start_server,
)
from oddl.drivers.emulators.ocs import OcsEmulator
from oddl.drivers.emulators.ocs_model import DEFAULT_LOSS_DB, DEFAULT_SWITCH_S, MAX_SIZE
from oddl.drivers.emulators.scpi import LineSplitter
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer

logger = logging.getLogger(__name__)

__all__ = ["add_arguments", "main", "ocs_connection_handler", "ready_line", "run"]

MAX_LINE_BYTES = 65536
"""Longest line a client may send without a terminator (longer: error -223)."""


def ocs_connection_handler(emulator: OcsEmulator) -> Callable[[socket.socket], None]:
    """A TcpEmulatorServer handler: one line at a time, each answer sent when it is due."""

    def handle(conn: socket.socket) -> None:
        lines = LineSplitter(MAX_LINE_BYTES, emulator.overlong_line)
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return
            for raw, _terminator in lines.feed(chunk):
                if raw is None:  # the LF of a CR-LF split across two reads
                    continue
                reply = emulator.process(raw)
                if reply.drop_connection:
                    return
                for due, data in reply.answers:
                    while (delay := due - emulator.clock()) > 0:  # never early, however woken
                        time.sleep(delay)
                    if data is not None:
                        conn.sendall(data)

    return handle


def ready_line(server: TcpEmulatorServer, emulator: OcsEmulator) -> str:
    """The JSON line printed once the emulator listens."""
    host, port = server.address
    state = emulator.switch.state_file
    return json.dumps({"ready": True, "resource": f"TCPIP0::{host}::{port}::SOCKET",
                       "url": server.url, "host": host, "port": port,
                       "size": emulator.switch.size, "model": emulator.model,
                       "serial": emulator.serial_number,
                       "state": str(state) if state is not None else None})


def _size_arg(text: str) -> int:
    return checked_arg(text, int, lambda v: 1 <= v <= MAX_SIZE, f"a size N in 1..{MAX_SIZE}")


def _loss_arg(text: str) -> float:
    return checked_arg(text, float, lambda v: math.isfinite(v) and v >= 0, "a loss >= 0 dB")


def _dbm_arg(text: str) -> float:
    return checked_arg(text, float, math.isfinite, "a power in dBm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the OCS emulator's options to `parser` (for ``oddl emulate ocs`` when wired)."""
    parser.add_argument("--listen", default="127.0.0.1:0", type=listen_arg, metavar="HOST:PORT",
                        help="address to serve on (port 0: any free port; a real switch "
                        "listens on 5025)")
    parser.add_argument("--size", default=16, type=_size_arg, metavar="N",
                        help="an N x N switch: ingress 1..N, egress N+1..2N (default 16)")
    parser.add_argument("--switch-ms", default=DEFAULT_SWITCH_S * 1e3, type=milliseconds_arg,
                        metavar="MS", help="time to make one connection (default 25 ms)")
    parser.add_argument("--loss-db", default=DEFAULT_LOSS_DB, type=_loss_arg,
                        help="insertion loss of a connection (default 1.5 dB)")
    parser.add_argument("--input-dbm", default=None, type=_dbm_arg, metavar="DBM",
                        help="light arriving at every ingress port (default: dark)")
    parser.add_argument("--state", default=None, metavar="FILE",
                        help="keep the connections in FILE, so they outlive a restart of "
                        "the emulator (as a real switch's optics hold)")
    parser.add_argument("--serial", default="EMU00001", help="serial number *IDN? reports")
    parser.add_argument("--seed", default=0, type=int, help="seed for random faults")


def run(args: argparse.Namespace) -> int:
    """Serve one emulated switch; print its ready line once; stop on SIGINT/SIGTERM."""
    emulator = OcsEmulator(args.size, switch_s=args.switch_ms / 1e3, loss_db=args.loss_db,
                           serial_number=args.serial, state_file=args.state, seed=args.seed)
    if args.input_dbm is not None:
        for port in range(1, args.size + 1):
            emulator.set_input_dbm(port, args.input_dbm)
    server = start_server(ocs_connection_handler(emulator), args.listen, "ocs-emulator")
    logger.info("OCS emulator %s (%dx%d) serving on %s", args.serial, args.size, args.size,
                server.url)
    return serve_until_signal(server, lambda s: ready_line(s, emulator))


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m oddl.drivers.emulators.ocs_serve [options]``."""
    parser = argparse.ArgumentParser(prog="python -m oddl.drivers.emulators.ocs_serve",
                                     description="Emulated Polatis-style optical circuit "
                                     "switch, served as SCPI over TCP.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
