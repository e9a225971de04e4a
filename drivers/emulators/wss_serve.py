"""Byte-stream servers for the emulated WSS (TCP and pseudo-terminal) and ``oddl emulate wss``.

Lines towards the module end in CR, LF or CR-LF (the manual: CR, LF optional); replies go out
with CR-LF, each at its due time (RSW's ``OK`` comes when the optics have settled).
"""

from __future__ import annotations

import argparse
import logging
import socket
import time
from collections.abc import Callable

from oddl.drivers.emulators.cli import (
    listen_arg,
    milliseconds_arg,
    non_negative_int_arg,
    positive_int_arg,
    serve_tcp_or_pty,
)
from oddl.drivers.emulators.ptyserve import Pty
from oddl.drivers.emulators.wss import MAX_LINE, WssEmulator

logger = logging.getLogger(__name__)

__all__ = ["LineSplitter", "add_arguments", "main", "run", "serve_pty",
           "wss_connection_handler"]


class LineSplitter:
    """Cuts a byte stream into command lines at CR, LF or CR-LF; over-long input is one line."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[str]:
        """Add `data`; return the complete lines (latin-1 decoded, terminators removed)."""
        self._buf += data
        lines = []
        while True:
            cuts = [i for i in (self._buf.find(b"\r"), self._buf.find(b"\n")) if i >= 0]
            if not cuts:
                break
            i = min(cuts)
            raw = bytes(self._buf[:i])
            del self._buf[:i + 1]
            if raw:
                lines.append(raw.decode("latin-1"))
        if len(self._buf) > MAX_LINE:  # an endless line: answer it as over-long
            self._buf.clear()
            lines.append("?" * (MAX_LINE + 1))
        return lines


def _send_replies(emulator: WssEmulator, line: str, send: Callable[[bytes], None],
                  wait: Callable[[float], bool]) -> bool:
    """Send the replies to one line at their due times; False to stop (closed or stopping)."""
    received = time.monotonic()
    for delay, text in emulator.handle_timed(line):
        remaining = received + delay - time.monotonic()
        if remaining > 0 and wait(remaining):
            return False
        send(text.encode("latin-1", "replace") + b"\r\n")
    return True


def wss_connection_handler(emulator: WssEmulator) -> Callable[[socket.socket], None]:
    """A TcpEmulatorServer handler: command lines in, CR-LF reply lines out, timing honoured."""

    def handle(conn: socket.socket) -> None:
        conn.settimeout(None)
        lines = LineSplitter()

        def wait(seconds: float) -> bool:
            time.sleep(seconds)
            return conn.fileno() == -1

        while True:
            data = conn.recv(4096)
            if not data:
                return
            for line in lines.feed(data):
                if not _send_replies(emulator, line, conn.sendall, wait):
                    return

    return handle


def serve_pty(emulator: WssEmulator) -> tuple[str, Callable[[], None]]:
    """Serve `emulator` on a new pseudo-terminal; return (slave device path, stop function).

    Any serial-port software opens the path (pyserial ``serial.Serial(path)``, pyvisa
    ``ASRL<path>::INSTR``); the baud rate is ignored. The stop function ends the server thread
    and closes the terminal.
    """
    pty = Pty()
    lines = LineSplitter()

    def on_data(data: bytes) -> bool:
        for line in lines.feed(data):
            try:
                if not _send_replies(emulator, line, pty.send, pty.stop.wait):
                    return False
            except OSError:
                logger.debug("WSS emulator pty: reply to %r lost", line[:40])
        return True

    stop_serving = pty.serve(on_data, f"wss-pty-{emulator.serial_number}")
    logger.info("WSS emulator %s serving on %s", emulator.serial_number, pty.path)
    return pty.path, stop_serving


# --- command line ---------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``oddl emulate wss`` options to `parser`."""
    parser.add_argument("--listen", default="127.0.0.1:0", type=listen_arg,
                        metavar="HOST:PORT", help="address to serve on (port 0: any free port)")
    parser.add_argument("--pty", action="store_true",
                        help="serve on a pseudo-terminal instead of TCP and print its path")
    parser.add_argument("--ports", default=4, type=positive_int_arg,
                        help="number of out-ports (default 4)")
    parser.add_argument("--first-channel", default=None, type=non_negative_int_arg,
                        help="number of the lowest fixed-grid channel (factory: 0)")
    parser.add_argument("--first-thz", default=None, type=float,
                        help="centre of the lowest channel in THz (factory: 191.35)")
    parser.add_argument("--spacing-ghz", default=None, type=float,
                        help="fixed-grid spacing in GHz (factory: 50)")
    parser.add_argument("--channels", default=None, type=positive_int_arg,
                        help="number of fixed-grid channels (factory: 96)")
    parser.add_argument("--settle-ms", default=100.0, type=milliseconds_arg,
                        help="settle time after RSW/UCA in ms (default 100)")
    parser.add_argument("--restart-ms", default=0.0, type=milliseconds_arg,
                        help="time RES leaves the module deaf, in ms (default 0)")
    parser.add_argument("--rra-per-line", default=0, type=non_negative_int_arg,
                        help="RRA? entries per line (default 0: the whole array on one line)")
    parser.add_argument("--no-echo", action="store_true", help="do not echo command lines")
    parser.add_argument("--serial", default="SN000001", help="serial number SNO? reports")
    parser.add_argument("--seed", default=0, type=int, help="seed for injected random faults")


def run(args: argparse.Namespace) -> int:
    """Serve one emulated WSS; print its address (URL or pty path) once; stop on a signal."""
    plan = {k: v for k, v in (("first_channel", args.first_channel),
                              ("first_thz", args.first_thz),
                              ("spacing_ghz", args.spacing_ghz),
                              ("channels", args.channels)) if v is not None}
    emulator = WssEmulator(ports=args.ports, settle_s=args.settle_ms / 1000.0,
                           restart_s=args.restart_ms / 1000.0, rra_per_line=args.rra_per_line,
                           echo=not args.no_echo, serial_number=args.serial, seed=args.seed,
                           **plan)
    return serve_tcp_or_pty(args, wss_connection_handler(emulator),
                            lambda: serve_pty(emulator), "wss-emulator")


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m oddl.drivers.emulators.wss_serve [options]``."""
    parser = argparse.ArgumentParser(prog="python -m oddl.drivers.emulators.wss_serve",
                                     description="Emulated Finisar/II-VI flexgrid WSS")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
