"""A small threaded TCP server that exposes a device emulator as a byte stream.

Each accepted connection is handed to `handler(conn)` on its own thread; the emulator state is
shared, so handlers must lock it. `address` is the (host, port) actually bound, so port 0 works.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

ConnectionHandler = Callable[[socket.socket], None]


def parse_listen(listen: str) -> tuple[str, int]:
    """Split 'HOST:PORT' (port may be 0) into a tuple; raise ValueError naming the fix."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT, for example 127.0.0.1:0")
    return host, int(port)


class TcpEmulatorServer:
    """Accepts TCP connections and serves each one with `handler` until closed."""

    def __init__(self, handler: ConnectionHandler, host: str = "127.0.0.1", port: int = 0,
                 name: str = "emulator"):
        self.name = name
        self._handler = handler
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(0.2)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The pyserial URL a driver opens to reach this emulator."""
        return f"socket://{self.address[0]}:{self.address[1]}"

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(conn)
            logger.debug("%s: connection from %s", self.name, peer)
            threading.Thread(target=self._serve, args=(conn,), name=f"{self.name}-conn",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._handler(conn)
        except OSError:
            pass
        except Exception:  # an emulator bug must not kill the server; it is logged loudly
            logger.exception("%s: connection handler failed", self.name)
        finally:
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        """Stop accepting, close every connection and wait for the accept thread."""
        self._stop.set()
        try:  # wakes the accept thread now rather than at its next timeout (Linux)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        self._thread.join(timeout=2)  # first: a connection it accepted last is closed too
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def __enter__(self) -> TcpEmulatorServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
