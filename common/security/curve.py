"""Run-time CURVE for ZeroMQ: a server socket that admits only the lab's listed client keys,
client sockets that trust a server key, and who sent a frame.

:class:`CurveServer` makes a ROUTER a CURVE server whose ZAP handler admits only the listed
client keys (and names each connection by its node: the ``User-Id`` frame property, see
:func:`sender_matches`); :func:`configure_curve_client` sets up a DEALER. The wiring of the
fabric and the direct links is described in :mod:`oddl.common.security`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import monitor as zmq_monitor
from zmq.utils import z85

from oddl.common.errors import SecurityError
from oddl.common.security.files import CurveKeys

logger = logging.getLogger(__name__)


class _SharedAuthenticator(ThreadAuthenticator):
    """One ZAP handler per context (libzmq binds it at inproc://zeromq.zap.01); each
    :class:`CurveServer` registers its own domain and allow-list on it."""

    def __init__(self, context: zmq.Context) -> None:
        super().__init__(context, log=logging.getLogger(__name__ + ".zap"))
        self.users: dict[bytes, str] = {}
        self.refs = 0

    def curve_user_id(self, client_public_key: bytes) -> str:
        """The User-Id of an admitted key: its node or ``operator:NAME``, else the key (z85)."""
        z = z85.encode(client_public_key)
        return self.users.get(z, z.decode("ascii"))


_AUTH_LOCK = threading.Lock()
_AUTHENTICATORS: dict[int, _SharedAuthenticator] = {}


def _acquire_authenticator(context: zmq.Context) -> _SharedAuthenticator:
    with _AUTH_LOCK:
        auth = _AUTHENTICATORS.get(id(context))
        if auth is None:
            auth = _SharedAuthenticator(context)
            try:
                auth.start()
            except zmq.ZMQError as exc:
                raise SecurityError(f"cannot start the ZAP authenticator ({exc}); another ZAP "
                                    "handler already runs on this ZeroMQ context — use one "
                                    "CurveServer per context or a separate context") from None
            _AUTHENTICATORS[id(context)] = auth
        auth.refs += 1
        return auth


def _release_authenticator(auth: _SharedAuthenticator) -> None:
    with _AUTH_LOCK:
        auth.refs -= 1
        if auth.refs > 0:
            return
        _AUTHENTICATORS.pop(id(auth.context), None)
    auth.stop()


class CurveServer:
    """CURVE for a server socket (a ROUTER) with an allow-list of client keys.

    A ZAP authenticator (one per ZeroMQ context, shared by the CurveServers on it) admits only
    the listed client public keys; every other key, and every plain (NULL) client, fails the
    handshake and no frame of it reaches the socket. An admitted connection's frames carry
    the key's user id (a node id, ``operator:NAME``) as the ``User-Id`` property.

    ``configure(sock)`` before ``sock.bind``; ``close()`` after the socket is closed.
    """

    def __init__(self, keys: CurveKeys, allowed: Mapping[bytes, str] | Iterable[bytes], *,
                 context: zmq.Context | None = None, name: str = "server") -> None:
        if not keys.secret:
            raise SecurityError(f"the CURVE server {name!r} needs its secret key (the "
                                ".key_secret file), not only the public key")
        self.keys = keys
        self.name = name
        self.context = context or zmq.Context.instance()
        self.domain = f"oddl.{name}.{uuid.uuid4().hex[:8]}"
        self._allowed: dict[bytes, str] = {}
        self._warned: set[bytes] = set()
        self._auth: _SharedAuthenticator | None = None
        for key, user in (allowed.items() if isinstance(allowed, Mapping)
                          else ((k, "") for k in allowed)):
            self.allow(key, user)  # validates before the authenticator starts
        self._auth = _acquire_authenticator(self.context)
        self._auth.users.update({k: u for k, u in self._allowed.items() if u})
        self._auth.configure_curve_callback(self.domain, credentials_provider=self)

    # ZAP callback (the authenticator thread)
    def callback(self, domain: str, key: bytes) -> bool:
        """True if client key `key` (z85) may connect."""
        if key in self._allowed:
            return True
        log = logger.debug if key in self._warned else logger.warning
        self._warned.add(key)
        log("%s: refused a CURVE client whose key %s is not in the allow-list; add it with "
            "`oddl certs init` (all keys of one run are allowed)", self.name,
            key.decode("ascii", "replace"))
        return False

    def allow(self, public_key: bytes, user_id: str = "") -> None:
        """Admit client key `public_key` (z85), reported as `user_id` (default: the key)."""
        if len(public_key) != 40:
            raise SecurityError(f"{self.name}: CURVE public key {public_key!r} is not 40 z85 "
                                "characters")
        self._allowed = {**self._allowed, public_key: user_id}
        if user_id and self._auth is not None:
            self._auth.users[public_key] = user_id

    def revoke(self, public_key: bytes) -> None:
        """Stop admitting `public_key` (new handshakes; open connections stay)."""
        self._allowed = {k: v for k, v in self._allowed.items() if k != public_key}

    def configure(self, socket: zmq.Socket) -> None:
        """Make `socket` a CURVE server under this authenticator; call before ``bind``."""
        assert self.keys.secret is not None
        socket.curve_secretkey = self.keys.secret
        socket.curve_publickey = self.keys.public
        socket.zap_domain = self.domain.encode("ascii")
        socket.curve_server = True

    def close(self) -> None:
        """Drop this server's allow-list; stop the authenticator when no server uses it."""
        auth, self._auth = self._auth, None
        if auth is not None:
            auth.credentials_providers.pop(self.domain, None)
            _release_authenticator(auth)

    def __enter__(self) -> CurveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def configure_curve_client(socket: zmq.Socket, client_keys: CurveKeys,
                           server_public_key: bytes) -> None:
    """Make `socket` a CURVE client with its key pair, trusting `server_public_key` (z85);
    call before ``connect``."""
    if not client_keys.secret:
        raise SecurityError("a CURVE client needs its secret key (the .key_secret file), not "
                            "only the public key")
    if len(server_public_key) != 40:
        raise SecurityError(f"CURVE server key {server_public_key!r} is not 40 z85 characters")
    socket.curve_secretkey = client_keys.secret
    socket.curve_publickey = client_keys.public
    socket.curve_serverkey = server_public_key


def authenticated_user(frame: zmq.Frame) -> str | None:
    """The User-Id the ZAP handler gave the connection `frame` came from (a node id or
    ``operator:NAME``), or None for a connection without authentication. Receive with
    ``copy=False`` to get frames."""
    try:
        user = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError):
        return None
    return str(user) if user else None


def sender_matches(routing_id: bytes, frame: zmq.Frame) -> bool:
    """True if a ROUTER routing id (``node`` or ``node/tx``) names the node whose key
    authenticated the connection — a node cannot send under another node's identity."""
    node = routing_id.decode("utf-8", "replace").split("/", 1)[0]
    return authenticated_user(frame) == node


def wait_handshake(socket: zmq.Socket, connect: Callable[[], None], timeout_s: float,
                   *, what: str = "the server") -> None:
    """Run `connect` and wait for the CURVE handshake; raise :class:`SecurityError` naming
    the cause when the server refuses the key or the handshake does not complete in time."""
    mon = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    try:
        connect()
        deadline = timeout_s * 1000
        while mon.poll(max(1, int(deadline))):
            ev = zmq_monitor.recv_monitor_message(mon)
            event = ev["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise SecurityError(f"{what} refused this CURVE key (ZAP status {ev['value']}): "
                                    "it is not in the server's allow-list; use keys from the "
                                    "same `oddl certs init` run as the server")
            try:
                name = zmq.Event(event).name
            except ValueError:
                name = str(event)
            raise SecurityError(f"the CURVE handshake with {what} failed ({name}): wrong "
                                "server public key, or the server does not use CURVE; check "
                                "both sides use the same `oddl certs init` files")
        raise SecurityError(f"no CURVE handshake with {what} within {timeout_s:g} s; is it "
                            "running and reachable?")
    finally:
        socket.disable_monitor()
        mon.close(0)
