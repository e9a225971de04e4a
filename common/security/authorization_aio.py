"""The authorisation interceptor for an asyncio gRPC server (`grpc.aio`): the same table and
the same refusals as :class:`~oddl.common.security.authorization.AuthorizationInterceptor`,
checked before a coroutine handler runs (the controller serves on an event loop, ADR 0032).

A handler may be a coroutine (returning its reply, or writing a stream with
``context.write`` as the health service's ``Watch`` does) or an async generator; the wrapper
keeps its kind, so gRPC drives it as it would the handler itself.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

from oddl.common.security.authorization import (
    AUXILIARY_RULES,
    CONTROLLER_SERVICE,
    METHOD_RULES,
    AuthorizationInterceptor,
    Rule,
)

Refusal = Callable[[str, "Rule | None", Any, Any], "tuple[grpc.StatusCode, str] | None"]


class AioAuthorizationInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call against the rule table using the client certificate (see the sync
    interceptor for the refusals: UNAUTHENTICATED without a verified or with a revoked
    certificate, PERMISSION_DENIED for a wrong role or another node's request)."""

    def __init__(self, rules: Mapping[str, Rule] = METHOD_RULES, *,
                 service: str = CONTROLLER_SERVICE,
                 auxiliary: Mapping[str, Rule] = AUXILIARY_RULES,
                 service_descriptor: Any = None, revocations: Any = None) -> None:
        self._check = AuthorizationInterceptor(rules, service=service, auxiliary=auxiliary,
                                               service_descriptor=service_descriptor,
                                               revocations=revocations)

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler | None]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """The method's handler wrapped with the authorisation check (None: unknown method)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        return wrap_aio(handler, method, self._check.rule(method), self._check.refusal)


def wrap_aio(handler: grpc.RpcMethodHandler, method: str, rule: Rule | None,
             refusal: Refusal) -> grpc.RpcMethodHandler:
    """The same (asyncio) handler with `refusal` checked before the behaviour, and on every
    request of a client stream whose rule names the caller's node."""
    des, ser = handler.request_deserializer, handler.response_serializer

    async def check(request: Any, context: grpc.aio.ServicerContext) -> None:
        refused = refusal(method, rule, request, context)
        if refused is not None:
            await context.abort(*refused)

    if handler.unary_unary or handler.unary_stream:
        behaviour = handler.unary_unary or handler.unary_stream
        make = (grpc.unary_unary_rpc_method_handler if handler.unary_unary
                else grpc.unary_stream_rpc_method_handler)
        return make(_guarded(behaviour, check, lambda request, _: request), des, ser)
    streamed = handler.stream_unary or handler.stream_stream
    node_checked = rule is not None and rule.own_node_field is not None

    async def checked(requests: AsyncIterator[Any],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for r in requests:
            await check(r, context)
            yield r

    def requests_of(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        return checked(requests, context) if node_checked else requests

    make_streaming = (grpc.stream_unary_rpc_method_handler if handler.stream_unary
                      else grpc.stream_stream_rpc_method_handler)
    return make_streaming(_guarded(streamed, check, requests_of, first_is_stream=True),
                          des, ser)


def _guarded(behaviour: Callable[..., Any], check: Callable[[Any, Any], Awaitable[None]],
             argument: Callable[[Any, Any], Any], first_is_stream: bool = False
             ) -> Callable[..., Any]:
    """`behaviour` after `check` (with the request, or None for a client stream), of the same
    kind: an async generator stays one, a coroutine stays one."""
    if inspect.isasyncgenfunction(behaviour):
        async def generator(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(None if first_is_stream else request, context)
            async for reply in behaviour(argument(request, context), context):
                yield reply
        return generator

    async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(None if first_is_stream else request, context)
        result = behaviour(argument(request, context), context)
        return await result if inspect.isawaitable(result) else result
    return coroutine
