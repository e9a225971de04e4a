"""Byte-stream servers for the emulated ITLA (TCP and pseudo-terminal) and ``oddl emulate itla``.

Frames are cut from the byte stream by count only, as on the module's UART; replies go out at
their due time (``ItlaEmulator.respond`` says how late).
"""

from __future__ import annotations

import argparse
import logging
import socket
import threading
import time
from collections.abc import Callable

from oddl.drivers.emulators.cli import listen_arg, milliseconds_arg, serve_tcp_or_pty
from oddl.drivers.emulators.itla import ItlaEmulator
from oddl.drivers.emulators.ptyserve import Pty

logger = logging.getLogger(__name__)

__all__ = ["add_arguments", "itla_connection_handler", "main", "run", "serve_pty"]

IDLE_POLL_S = 0.5
"""How long the TCP handler blocks in one recv before it loops (framing never times out)."""


class _FrameServer:
    """Cuts a byte stream into 4-byte frames and sends the emulator's replies on time.

    Framing is by byte count only, as on the module's UART: there is no inter-byte timeout, so
    a byte lost on the way in shifts every later frame until the host resynchronises by sending
    single NOP (0x00) bytes until a 4-byte reply comes back (see docs/reference/devices/itla.md).
    """

    def __init__(self, emulator: ItlaEmulator, send: Callable[[bytes], None]) -> None:
        self._emulator = emulator
        self._send = send
        self._buf = bytearray()

    def feed(self, data: bytes, stop: threading.Event | None = None) -> None:
        self._buf += self._emulator.lose_bytes(data)
        while len(self._buf) >= 4:
            frame = bytes(self._buf[:4])
            del self._buf[:4]
            reply, delay = self._emulator.respond(frame)
            if delay > 0:
                if stop is not None:
                    if stop.wait(delay):
                        return
                else:
                    time.sleep(delay)
            if reply:
                self._send(reply)


def itla_connection_handler(emulator: ItlaEmulator) -> Callable[[socket.socket], None]:
    """A TcpEmulatorServer handler: 4-byte requests in, 4-byte replies out, delays honoured."""

    def handle(conn: socket.socket) -> None:
        conn.settimeout(IDLE_POLL_S)
        frames = _FrameServer(emulator, conn.sendall)
        while True:
            try:
                data = conn.recv(256)
            except TimeoutError:
                continue
            if not data:
                return
            frames.feed(data)

    return handle


def serve_pty(emulator: ItlaEmulator) -> tuple[str, Callable[[], None]]:
    """Serve `emulator` on a new pseudo-terminal; return (slave device path, stop function).

    Open the path with any serial-port software (pyserial: ``serial.Serial(path)``); the baud
    rate is ignored. The stop function ends the server thread and closes the terminal.
    """
    pty = Pty()
    frames = _FrameServer(emulator, pty.send)

    def on_data(data: bytes) -> bool:
        frames.feed(data, pty.stop)
        return True

    stop_serving = pty.serve(on_data, f"itla-pty-{emulator.serial_number}", chunk=256)
    logger.info("ITLA emulator %s serving on %s", emulator.serial_number, pty.path)
    return pty.path, stop_serving


# --- command line --------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``oddl emulate itla`` options to `parser`."""
    parser.add_argument("--listen", default="127.0.0.1:0", type=listen_arg,
                        metavar="HOST:PORT", help="TCP address to serve on (port 0: any free "
                        "port; default 127.0.0.1:0)")
    parser.add_argument("--pty", action="store_true",
                        help="serve on a pseudo-terminal instead of TCP and print its path")
    parser.add_argument("--time-to-lock-ms", default=1.0, type=milliseconds_arg,
                        help="time from a channel write (output on) to lock, in ms (default 1; "
                        "real modules: seconds)")
    parser.add_argument("--enable-ms", default=None, type=milliseconds_arg,
                        help="time from output enable to stable, locked light, in ms (default: "
                        "the time to lock; real modules: seconds)")
    parser.add_argument("--startup-ms", default=0.0, type=milliseconds_arg,
                        help="initialisation window after power-up or a module reset, in ms: "
                        "commands other than NOP get XE / CII meanwhile (default 0)")
    parser.add_argument("--jitter-ms", default=0.0, type=milliseconds_arg,
                        help="extra uniform random time added to each lock / enable, in ms "
                        "(default 0)")
    parser.add_argument("--serial", default="EMU-0001", help="serial number SerNo reports")
    parser.add_argument("--seed", default=0, type=int, help="seed for jitter and random faults")


def run(args: argparse.Namespace) -> int:
    """Serve one emulated ITLA; print its address (URL or pty path) once; stop on SIGINT/SIGTERM."""
    enable_ms = args.enable_ms
    emulator = ItlaEmulator(serial_number=args.serial, time_to_lock_s=args.time_to_lock_ms / 1000,
                            enable_time_s=None if enable_ms is None else enable_ms / 1000,
                            startup_s=args.startup_ms / 1000,
                            lock_jitter_s=args.jitter_ms / 1000, seed=args.seed)
    return serve_tcp_or_pty(args, itla_connection_handler(emulator),
                            lambda: serve_pty(emulator), "itla-emulator")


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m oddl.drivers.emulators.itla_serve [options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m oddl.drivers.emulators.itla_serve",
        description="Emulator of an OIF-ITLA-MSA tunable laser, byte for byte the protocol of "
                    "``oddl.drivers.itla``.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
