"""The Controller gRPC service on an event loop: a thin asyncio shell over `ControllerService`.

A thousand agents each hold a `WatchSchedule` stream for their whole life; on a thread-pool
server every stream pins a thread. Here a stream is a coroutine parked on its node's
`EventQueue` (no thread), the cheap calls run on the loop itself, and every call that takes
the core's lock or may wait on a device runs in a bounded thread pool, so a slow device
transaction never stalls the loop (ADR 0032).

- on the loop: `SyncClock`, `Heartbeat` (the registry's own short lock; a dead agent back is
  announced in the pool), `GetTopology` (built once), and the stream's waiting;
- in the pool: everything else, by calling the sync `ControllerService` method with a small
  context whose `abort` raises `AbortCall`, turned here into the call's gRPC status.

An event pushed to many nodes is one message object in each node's queue; its stream
serializes it once for all of them (`WireCache`), not once per stream.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Any, NoReturn

import grpc

from oddl.controller.servicer import ControllerService
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

INLINE = ("SyncClock", "GetTopology")
"""The RPCs answered on the event loop: no device, no wait on the core's lock."""
STREAMED = ("WatchSchedule",)
"""The server streams: coroutines on the loop."""
OWN = ("Heartbeat", *STREAMED)
"""The RPCs this shell writes itself."""


class AbortCall(Exception):
    """A sync method's `context.abort`, off the loop: its status and details."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class OffLoopContext:
    """What the sync servicer uses of a context, for a call run in the pool."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise AbortCall(code, details)

    def is_active(self) -> bool:
        return True


class AsyncControllerService(pb_grpc.ControllerServicer):
    """The `ControllerService`'s RPCs as coroutines (see the module docstring)."""

    def __init__(self, service: ControllerService, pool: Executor):
        self.service = service
        self.pool = pool

    async def _inline(self, name: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return getattr(self.service, name)(request, OffLoopContext())
        except AbortCall as exc:
            await context.abort(exc.code, exc.details)

    async def _in_pool(self, name: str, request: Any,
                       context: grpc.aio.ServicerContext) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.pool, getattr(self.service, name), request,
                                              OffLoopContext())
        except AbortCall as exc:
            await context.abort(exc.code, exc.details)

    async def Heartbeat(self, request: pb.HeartbeatRequest,  # noqa: N802 (gRPC)
                        context: grpc.aio.ServicerContext) -> pb.HeartbeatReply:
        """On the loop: the registry's short lock only. An agent back from the dead has its
        jobs announced in the pool (that takes the core's lock)."""
        core = self.service.core
        heard = core.registry.heartbeat(request)
        if heard.back:
            await asyncio.get_running_loop().run_in_executor(self.pool, core.agent_back,
                                                             request.node_id)
        return pb.HeartbeatReply(controller_time_ns=time.time_ns(), reregister=not heard.known)

    async def WatchSchedule(self, request: pb.WatchScheduleRequest,  # noqa: N802 (gRPC)
                            context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[pb.ScheduleEvent]:
        core = self.service.core
        loop = asyncio.get_running_loop()
        opened = await loop.run_in_executor(self.pool, core.open_stream, request.node_id)
        if opened is None:
            await context.abort(*self.service.not_streaming(request.node_id))
            return
        async for event in core.registry.stream(*opened, self.service.stopped):
            yield event


def _method(name: str, run: str) -> Callable[..., Any]:
    async def call(self: AsyncControllerService, request: Any,
                   context: grpc.aio.ServicerContext) -> Any:
        return await getattr(self, run)(name, request, context)
    call.__name__ = call.__qualname__ = name
    return call


for _rpc in pb.DESCRIPTOR.services_by_name["Controller"].methods:
    if _rpc.name not in OWN:
        setattr(AsyncControllerService, _rpc.name,
                _method(_rpc.name, "_inline" if _rpc.name in INLINE else "_in_pool"))


class WireCache:
    """The serialized form of the last events sent, by identity: a go to a thousand nodes is
    serialized once. Holds the events it serialized (their ids stay theirs)."""

    def __init__(self, size: int = 256):
        self._size = size
        self._cache: OrderedDict[int, tuple[pb.ScheduleEvent, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, event: pb.ScheduleEvent) -> bytes:
        with self._lock:
            hit = self._cache.get(id(event))
            if hit is not None and hit[0] is event:
                return hit[1]
        data = event.SerializeToString()
        with self._lock:
            self._cache[id(event)] = (event, data)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return data


class _Handlers:
    """Stands in for a server to take the generated code's method handlers."""

    handlers: dict[str, grpc.RpcMethodHandler]

    def add_generic_rpc_handlers(self, _: object) -> None:
        pass

    def add_registered_method_handlers(self, _: str, handlers: dict[str, Any]) -> None:
        self.handlers = dict(handlers)


def add_to_server(servicer: AsyncControllerService, server: grpc.aio.Server) -> None:
    """Serve `servicer` on `server` as the generated code would, but for the schedule stream,
    whose events are serialized once for every node they go to (`WireCache`)."""
    taken = _Handlers()
    pb_grpc.add_ControllerServicer_to_server(servicer, taken)
    handlers = taken.handlers
    handlers["WatchSchedule"] = grpc.unary_stream_rpc_method_handler(
        servicer.WatchSchedule, request_deserializer=pb.WatchScheduleRequest.FromString,
        response_serializer=WireCache())
    service = pb.DESCRIPTOR.services_by_name["Controller"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)
