"""A pseudo-terminal for a device emulator, so serial-only clients open it as a port."""

from __future__ import annotations

import os
import select
import threading
import tty
from collections.abc import Callable


class Pty:
    """A raw pseudo-terminal pair: clients open `path` (the slave side) with any serial-port
    software, the emulator reads and writes `master`; the baud rate is ignored."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.path = os.ttyname(self.slave)
        self.stop = threading.Event()
        self._closed = threading.Lock()

    def send(self, reply: bytes) -> None:
        """Write all of `reply` to the client."""
        view = memoryview(reply)
        while view:
            written = os.write(self.master, view)
            view = view[written:]

    def start(self, loop: Callable[[], None], name: str) -> Callable[[], None]:
        """Run `loop` (which returns once `stop` is set) on a daemon thread; return the
        function that stops it and closes the terminal (safe to call twice)."""
        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()

        def stop_serving() -> None:
            self.stop.set()
            thread.join(timeout=2)
            if self._closed.acquire(blocking=False):
                for fd in (self.master, self.slave):
                    try:
                        os.close(fd)
                    except OSError:
                        pass

        return stop_serving

    def serve(self, on_data: Callable[[bytes], bool], name: str,
              chunk: int = 4096) -> Callable[[], None]:
        """Hand what the client writes, a chunk at a time, to `on_data` (which returns False to
        stop serving) on a daemon thread; return the stop function of ``start``.

        A read error (the terminal closed under us, or no reader on the slave side) is waited
        out, not fatal.
        """

        def loop() -> None:
            while not self.stop.is_set():
                try:
                    ready, _, _ = select.select([self.master], [], [], 0.1)
                    if not ready:
                        continue
                    data = os.read(self.master, chunk)
                except OSError:
                    if self.stop.wait(0.05):
                        return
                    continue
                if data and not on_data(data):
                    return

        return self.start(loop, name)
