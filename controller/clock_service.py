"""The controller's clock service: answers the agents' clock probes over UDP
(`oddl.common.clock_wire`), so their offset estimate rests on a ~10 µs exchange rather than a
~200 µs gRPC call.

It listens on the controller's gRPC port number (UDP) when that is free, else on a port the
kernel picks, and tells each agent the port in its registration reply; an agent that gets no
answer (a firewall, say) falls back to the `SyncClock` RPC and says so.
"""

from __future__ import annotations

import logging
import socket
import threading

from oddl.common.clock_wire import enable_kernel_stamps, recv_stamped, reply_to

logger = logging.getLogger(__name__)


class ClockService:
    """A UDP socket and the thread that answers clock probes on it; `close()` it."""

    def __init__(self, host: str, port: int):
        host = host.strip("[]") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.bind((host, 0))  # the gRPC port number is taken for UDP: any port
        enable_kernel_stamps(self.sock)
        self.port: int = self.sock.getsockname()[1]
        self.answered = 0
        self._thread = threading.Thread(target=self._serve, name="clock-service", daemon=True)

    def start(self) -> None:
        """Answer probes until `close`."""
        self._thread.start()
        logger.info("clock service on UDP port %d", self.port)

    def _serve(self) -> None:
        while True:
            try:
                data, sender, received = recv_stamped(self.sock)
            except OSError:
                return  # closed
            reply = reply_to(data, received)
            if reply is None:
                continue
            try:
                self.sock.sendto(reply, sender)
                self.answered += 1
            except OSError as exc:
                logger.debug("clock service: cannot answer %s: %s", sender, exc)

    def close(self) -> None:
        """Stop answering."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
