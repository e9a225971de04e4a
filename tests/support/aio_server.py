"""An asyncio gRPC server (`grpc.aio`) on a loop in a thread of its own, as the controller runs
one (decision record 0032): for tests of what sits on such a server, such as the
authorisation interceptor."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import grpc

from oddl.common.security.tls import server_credentials
from oddl.protos import oddl_pb2_grpc as pb_grpc


class AioServer:
    """`servicer` (coroutine methods) on 127.0.0.1 with `interceptor`: TLS from the lab CA at
    `root`, or plaintext when `root` is None. `stop()` it."""

    def __init__(self, servicer: pb_grpc.ControllerServicer, interceptor: Any,
                 root: Path | None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def build() -> tuple[grpc.aio.Server, int]:
            server = grpc.aio.server(interceptors=[interceptor])
            pb_grpc.add_ControllerServicer_to_server(servicer, server)
            port = (server.add_secure_port("127.0.0.1:0", server_credentials(root)) if root
                    else server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            return server, port

        self.server, self.port = self._run(build())

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self) -> None:
        self._run(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            # closed now, not by the garbage collector later: an unclosed loop's finalizer
            # runs Python code wherever the collection happens (once inside ast.parse of
            # the house rules, which CPython 3.11.7 reports as a SystemError)
            self.loop.close()
