"""The emulated power meter's TCP server and ``oddl emulate powermeter`` command line."""

from __future__ import annotations

import argparse
import logging
import math
import socket
import time
from collections.abc import Callable

from oddl.drivers.emulators.cli import checked_arg, listen_arg, serve_until_signal, start_server
from oddl.drivers.emulators.powermeter import PowerMeterEmulator
from oddl.drivers.emulators.powermeter_model import ALL_BLOCK_UNITS, PowerSource
from oddl.drivers.emulators.scpi import LineSplitter

logger = logging.getLogger(__name__)

__all__ = ["add_arguments", "constant_source", "main", "powermeter_connection_handler", "run"]

MAX_LINE_BYTES = 65536
"""Longest line a client may send without a terminator (longer: error -223)."""


def powermeter_connection_handler(emulator: PowerMeterEmulator) -> Callable[[socket.socket],
                                                                              None]:
    """A TcpEmulatorServer handler: lines ended by LF, CR or CR-LF in; each response ends
    with the terminator of its line (binary blocks too)."""

    def handle(conn: socket.socket) -> None:
        lines = LineSplitter(MAX_LINE_BYTES, emulator.overlong_line)
        answered_with_cr = False  # the last line ended in CR and got an answer
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return
            for raw, terminator in lines.feed(chunk):
                if raw is None:  # the LF of a CR-LF split across two reads
                    if answered_with_cr:
                        conn.sendall(b"\n")
                    answered_with_cr = False
                    continue
                reply = emulator.process(raw, terminator)
                answered_with_cr = False
                if reply.drop_connection:
                    return
                if reply.data is None:
                    continue
                if reply.delay_s > 0:
                    time.sleep(reply.delay_s)
                conn.sendall(reply.data)
                emulator.note_sent()
                answered_with_cr = terminator == b"\r"

    return handle


# ----- command line (wired by the integrator as `oddl emulate powermeter`) ----------------
def _channels_arg(text: str) -> int:
    return checked_arg(text, int, lambda v: 1 <= v <= 8, "1..8 (N7744A: 4, N7745A: 8)")


def _finite_arg(text: str) -> float:
    return checked_arg(text, float, math.isfinite, "a finite number")


def _noise_arg(text: str) -> float:
    return checked_arg(text, float, lambda v: math.isfinite(v) and v >= 0,
                       "a standard deviation >= 0 dB")


def constant_source(dbm: float) -> PowerSource:
    """A power source that delivers `dbm` to every channel (a stand-alone meter)."""

    def source(channel: int) -> float | None:
        return dbm

    return source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``oddl emulate powermeter`` options to `parser`."""
    parser.add_argument("--listen", default="127.0.0.1:0", type=listen_arg, metavar="HOST:PORT",
                        help="address to serve on (port 0: any free port)")
    parser.add_argument("--channels", default=4, type=_channels_arg,
                        help="meter channels (default 4, N7744A; 8 reports N7745A)")
    parser.add_argument("--seed", default=0, type=int, help="seed for reading noise and faults")
    parser.add_argument("--constant-dbm", default=None, type=_finite_arg, metavar="DBM",
                        help="every channel reads this power (default: no light)")
    parser.add_argument("--noise-db", default=0.01, type=_noise_arg,
                        help="standard deviation of the reading noise in dB (default 0.01)")
    parser.add_argument("--serial", default="EMU0000001", help="serial number *IDN? reports")
    parser.add_argument("--all-unit", default="watt", choices=ALL_BLOCK_UNITS,
                        help="unit of the :READ/:FETC:POW:ALL? blocks: watt (the programming "
                        "guide, default) or channel (the unit each channel is set to)")


def run(args: argparse.Namespace) -> int:
    """Serve one emulated meter; print its VISA resource string once; stop on SIGINT/SIGTERM."""
    source = None if args.constant_dbm is None else constant_source(args.constant_dbm)
    emulator = PowerMeterEmulator(channels=args.channels, power_source=source, seed=args.seed,
                                  noise_db=args.noise_db, serial_number=args.serial,
                                  all_block_unit=args.all_unit)
    server = start_server(powermeter_connection_handler(emulator), args.listen,
                          "powermeter-emulator")
    resource = f"TCPIP0::{server.address[0]}::{server.address[1]}::SOCKET"
    logger.info("power meter emulator %s serving on %s", args.serial, resource)
    return serve_until_signal(server, lambda s: resource)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m oddl.drivers.emulators.powermeter_serve [options]``."""
    parser = argparse.ArgumentParser(prog="python -m oddl.drivers.emulators.powermeter_serve",
                                     description="Emulated Keysight N7744A/N7745A multiport "
                                     "optical power meter, served as SCPI over TCP.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
