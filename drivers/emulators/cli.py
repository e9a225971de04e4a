"""What every stand-alone emulator command shares: argument types and serving until a signal.

`oddl emulate itla|wss|powermeter` each build an emulator, serve it with `serve_until_signal`
(which prints the one line a caller waits for) and return 0 on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable
from typing import TypeVar

from oddl.common.errors import ConfigError
from oddl.common.signals import StopSignals
from oddl.drivers.emulators.tcpserve import ConnectionHandler, TcpEmulatorServer, parse_listen

logger = logging.getLogger(__name__)

T = TypeVar("T")


def listen_arg(text: str) -> str:
    """argparse type: HOST:PORT (port 0 allowed)."""
    try:
        parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def checked_arg(text: str, convert: Callable[[str], T], accept: Callable[[T], bool],
                expected: str) -> T:
    """The body of an argparse type: `convert(text)`, refused with "expected `expected`" when
    it does not convert or `accept` says no."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}") from None
    if not accept(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return value


def milliseconds_arg(text: str) -> float:
    """argparse type: a finite time in ms, >= 0."""
    return checked_arg(text, float, lambda v: math.isfinite(v) and v >= 0, "milliseconds >= 0")


def positive_int_arg(text: str) -> int:
    """argparse type: a whole number >= 1."""
    return checked_arg(text, int, lambda v: v >= 1, "a whole number >= 1")


def non_negative_int_arg(text: str) -> int:
    """argparse type: a whole number >= 0."""
    return checked_arg(text, int, lambda v: v >= 0, "a whole number >= 0")


def start_server(handler: ConnectionHandler, listen: str, name: str) -> TcpEmulatorServer:
    """Bind an emulator's TCP server; a busy or bad address is a ConfigError naming the fix."""
    host, port = parse_listen(listen)
    try:
        return TcpEmulatorServer(handler, host, port, name=name)
    except OSError as exc:
        raise ConfigError(f"--listen {listen}: cannot listen ({exc}); choose a free port, or 0 "
                          "for any") from exc


def serve_until_signal(server: TcpEmulatorServer, announce: Callable[[TcpEmulatorServer], str]
                       ) -> int:
    """Print `announce(server)` once (the line callers wait for), serve until SIGINT/SIGTERM."""
    with StopSignals() as stop, server:
        print(announce(server), flush=True)
        stop.wait()
    return 0


def serve_pty_until_signal(start: Callable[[], tuple[str, Callable[[], None]]]) -> int:
    """Start a pseudo-terminal server (`start()` returns its path and its stop function),
    print the path once (the line callers wait for), serve until SIGINT/SIGTERM."""
    with StopSignals() as stop:
        path, stop_pty = start()
        try:
            print(path, flush=True)
            stop.wait()
        finally:
            stop_pty()
    return 0


def serve_tcp_or_pty(args: argparse.Namespace, handler: ConnectionHandler,
                     start_pty: Callable[[], tuple[str, Callable[[], None]]], name: str) -> int:
    """Serve an emulator over TCP at ``args.listen``, or on a pseudo-terminal with
    ``args.pty``; print its URL or path once and serve until SIGINT/SIGTERM."""
    if args.pty:
        return serve_pty_until_signal(start_pty)
    server = start_server(handler, args.listen, name)
    logger.info("%s (serial %s) serving on %s", name, args.serial, server.url)
    return serve_until_signal(server, lambda s: s.url)
