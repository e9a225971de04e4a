"""Run-time authorisation of the controller's gRPC calls: which role may call which RPC, and
the interceptor that enforces it with the caller's client certificate.

The table :data:`METHOD_RULES` names the RPCs of the ``oddl.v1.Controller`` service by their
method names, so this ground floor needs no generated code; ``tests/common/test_security.py`` checks
the table against the service descriptor of ``protos/oddl.proto``, and a server that has the
descriptor may pass it to :class:`AuthorizationInterceptor` to check again at start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

import grpc

from oddl.common.errors import SecurityError
from oddl.common.security.files import ROLE_AGENT, ROLE_OPERATOR
from oddl.common.security.tls import Identity, peer_identity

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """Who may call a method: the roles, and for agent RPCs the request field that must name
    the caller's own node."""

    roles: frozenset[str]
    own_node_field: str | None = None


AGENT_RPC = Rule(frozenset({ROLE_AGENT}), own_node_field="node_id")
OPERATOR_RPC = Rule(frozenset({ROLE_OPERATOR}))
READ_RPC = Rule(frozenset({ROLE_OPERATOR, ROLE_AGENT}))

CONTROLLER_SERVICE = "oddl.v1.Controller"
METHOD_RULES: Mapping[str, Rule] = MappingProxyType({
    # agents, each only for its own node
    "RegisterAgent": AGENT_RPC,
    "Heartbeat": AGENT_RPC,
    "SyncClock": AGENT_RPC,
    "WatchSchedule": AGENT_RPC,
    "ReadyCollective": AGENT_RPC,
    "ReportCollective": AGENT_RPC,
    "ConfirmDelivery": AGENT_RPC,
    "StartStanding": AGENT_RPC,
    "RequestFlow": AGENT_RPC,
    # operators: changes
    "SubmitJob": OPERATOR_RPC,
    "CancelJob": OPERATOR_RPC,
    "Reconfigure": OPERATOR_RPC,
    "SetTrace": OPERATOR_RPC,
    # both: reads
    "ListJobs": READ_RPC,
    "GetSchedule": READ_RPC,
    "GetTopology": READ_RPC,
    "GetStatus": READ_RPC,
    "GetDeviceState": READ_RPC,
    "GetDeviceLog": READ_RPC,
})
"""The one table of the Controller service: method name → :class:`Rule`. Every RPC of the
service must have an entry (``tests/common/test_security.py`` checks it against the proto; an
:class:`AuthorizationInterceptor` checks the table it is given when it is built)."""

AUXILIARY_RULES: Mapping[str, Rule] = MappingProxyType({
    "/grpc.health.v1.Health/Check": READ_RPC,
    "/grpc.health.v1.Health/Watch": READ_RPC,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": READ_RPC,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": READ_RPC,
})
"""Other services on the controller's server (health, reflection), by full method path."""

_ROLE_PLURAL = {ROLE_OPERATOR: "operators", ROLE_AGENT: "agents"}
_TABLE = "common/security/authorization.py METHOD_RULES"


def check_rules(rules: Mapping[str, Rule], service: Any = None) -> None:
    """Raise :class:`SecurityError` unless `rules` covers exactly the service's RPCs and every
    own-node field exists in the method's request message.

    `service` is the service descriptor (``oddl_pb2.DESCRIPTOR.services_by_name["Controller"]``
    of ``protos``); without it the RPCs are those of :data:`METHOD_RULES` (which the tests
    check against the descriptor) and the request fields are not checked.
    """
    requests: dict[str, Any] = ({m.name: m.input_type for m in service.methods}
                                if service is not None else dict.fromkeys(METHOD_RULES))
    missing = sorted(set(requests) - set(rules))
    extra = sorted(set(rules) - set(requests))
    if missing or extra:
        raise SecurityError(
            f"{_TABLE} does not match the service in protos/oddl.proto: "
            + "; ".join(filter(None, [
                f"no rule for {', '.join(missing)}" if missing else "",
                f"rules for unknown methods {', '.join(extra)}" if extra else ""]))
            + " — add every RPC to the table with the roles allowed to call it")
    for name, rule in rules.items():
        f, request = rule.own_node_field, requests[name]
        if f and request is not None and f not in request.fields_by_name:
            raise SecurityError(f"{_TABLE}: {name}'s request {request.name} has no field "
                                f"{f!r}; fix the rule or the proto")


class AuthorizationInterceptor(grpc.ServerInterceptor):
    """Checks every call against :data:`METHOD_RULES` using the client certificate.

    No verified client certificate: UNAUTHENTICATED. Wrong role, a method outside the
    table, or an agent acting for another node: PERMISSION_DENIED with a message naming the
    role, the method and the fix.
    """

    def __init__(self, rules: Mapping[str, Rule] = METHOD_RULES, *,
                 service: str = CONTROLLER_SERVICE,
                 auxiliary: Mapping[str, Rule] = AUXILIARY_RULES,
                 service_descriptor: Any = None, revocations: Any = None) -> None:
        check_rules(rules, service_descriptor)
        self._revocations = revocations  # a RevocationList (common/security/revoked.py) or None
        self._rules: dict[str, Rule] = {f"/{service}/{m}": r for m, r in rules.items()}
        self._rules.update(auxiliary)

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                       grpc.RpcMethodHandler | None],
                          handler_call_details: grpc.HandlerCallDetails
                          ) -> grpc.RpcMethodHandler | None:
        """The method's handler wrapped with the authorisation check (None: unknown method)."""
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        return _wrap(handler, method, self.rule(method), self._authorize)

    def rule(self, method: str) -> Rule | None:
        """The rule of a method by its full path (None: not in the table)."""
        return self._rules.get(method)

    def _authorize(self, method: str, rule: Rule | None, request: Any,
                   context: grpc.ServicerContext) -> None:
        refused = self.refusal(method, rule, request, context)
        if refused is not None:
            _abort(context, *refused)

    def refusal(self, method: str, rule: Rule | None, request: Any,
                context: Any) -> tuple[grpc.StatusCode, str] | None:
        """Why the call is refused (its status and message, logged), or None when allowed.
        `context` is a sync or an asyncio servicer context: only its certificate and peer
        are read."""
        short = method.rsplit("/", 1)[-1]
        who = peer_identity(context)
        if who is None:
            logger.warning("refused %s from %s: no client certificate", short, context.peer())
            return (grpc.StatusCode.UNAUTHENTICATED,
                    f"{short} needs a client certificate from the lab CA: connect over TLS "
                    "with a certificate from `oddl certs init`")
        if self._revocations is not None and who.serial in self._revocations.current().serials:
            logger.warning("refused %s from %s: %s's certificate %x is revoked", short,
                           context.peer(), who.describe(), who.serial)
            return (grpc.StatusCode.UNAUTHENTICATED,
                    f"the certificate of {who.describe()} (serial {who.serial:x}) is revoked; "
                    "get a new one with `oddl certs rotate`")
        if rule is None:
            return _denied(context, who, short, f"{method} is not in the authorization table "
                           "(common/security/authorization.py); add it with the roles allowed "
                           "to call it")
        if who.role not in rule.roles:
            allowed = " and ".join(sorted(_ROLE_PLURAL.get(r, r) for r in rule.roles))
            if rule.roles == {ROLE_OPERATOR}:
                fix = "use an operator certificate"
            elif rule.roles == {ROLE_AGENT}:
                fix = "it is called by a node's agent with that node's agent certificate"
            else:
                fix = f"use a certificate with role {' or '.join(sorted(rule.roles))}"
            return _denied(context, who, short, f"only {allowed} may {short}; {fix}")
        if rule.own_node_field and request is not None:
            claimed = getattr(request, rule.own_node_field, None)
            if claimed != who.node:
                return _denied(context, who, short,
                               f"{rule.own_node_field} is {claimed!r}: an agent acts only for "
                               f"its own node ({who.node}); use the agent certificate of "
                               f"{claimed!r}")
        return None


def _denied(context: Any, who: Identity, method: str,
            why: str) -> tuple[grpc.StatusCode, str]:
    message = f"{who.describe()} may not call {method}: {why}"
    logger.warning("refused: %s (peer %s)", message, context.peer())
    return grpc.StatusCode.PERMISSION_DENIED, message


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("grpc context.abort returned")  # abort always raises


def _wrap(handler: grpc.RpcMethodHandler, method: str, rule: Rule | None,
          authorize: Callable[[str, Rule | None, Any, grpc.ServicerContext], None]
          ) -> grpc.RpcMethodHandler:
    """The same handler with `authorize` run before the behaviour (and on every request of a
    client stream)."""
    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary or handler.unary_stream:
        behaviour = handler.unary_unary or handler.unary_stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            authorize(method, rule, request, context)
            return behaviour(request, context)

        make = (grpc.unary_unary_rpc_method_handler if handler.unary_unary
                else grpc.unary_stream_rpc_method_handler)
        return make(unary, des, ser)
    streamed = handler.stream_unary or handler.stream_stream
    node_checked = rule is not None and rule.own_node_field is not None

    def checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        for r in requests:
            authorize(method, rule, r, context)
            yield r

    def streaming(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        authorize(method, rule, None, context)
        return streamed(checked(requests, context) if node_checked else requests, context)

    make_streaming = (grpc.stream_unary_rpc_method_handler if handler.stream_unary
                      else grpc.stream_stream_rpc_method_handler)
    return make_streaming(streaming, des, ser)
