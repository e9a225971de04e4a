"""The hello that opens a chunk stream: the sender names its job and itself; in secure mode
both ends prove who they are with the lab's certificates (`oddl.agents.links.stream_auth`)."""

from __future__ import annotations

import json
import socket
import struct

from oddl.agents.links.stream_auth import MAC_BYTES, NONCE_BYTES, REPLY, AuthError, PairAuth
from oddl.agents.links.stream_wire import HELLO, recv_exact_blocking


def announce(sock: socket.socket, auth: PairAuth | None, node_id: str, job: str,
             dst: str) -> None:
    """The sender's side: announce the stream; in secure mode, prove who we are and check
    who answers."""
    msg: dict[str, str] = {"job": job, "src": node_id}
    if auth is None:
        raw = json.dumps(msg).encode()
        sock.sendall(HELLO + struct.pack("<H", len(raw)) + raw)
        return
    cn = auth.nonce()
    msg["nonce"] = cn.hex()
    raw = json.dumps(msg).encode()
    sock.sendall(HELLO + struct.pack("<H", len(raw)) + raw)
    reply = recv_exact_blocking(sock, len(REPLY) + NONCE_BYTES + MAC_BYTES)
    if reply[:len(REPLY)] != REPLY:
        raise AuthError("the peer does not run secure mode")
    sn = reply[len(REPLY):len(REPLY) + NONCE_BYTES]
    auth.check_server(dst, job, cn, sn, reply[-MAC_BYTES:])
    sock.sendall(auth.client_proof(dst, job, cn, sn))


def prove_to_client(sock: socket.socket, auth: PairAuth, hello: dict,
                    key: tuple[str, str]) -> None:
    """The receiver's side of the secure hello: prove this node, check the sender's proof."""
    job, src = key
    if "nonce" not in hello:
        raise AuthError(f"a stream from {src!r} came without authentication; start its "
                        "agent with the lab's [security] certs")
    cn = bytes.fromhex(str(hello["nonce"]))
    if len(cn) != NONCE_BYTES:
        raise AuthError(f"a stream from {src!r} sent a malformed nonce")
    sn = auth.nonce()
    sock.sendall(REPLY + sn + auth.server_proof(src, job, cn, sn))
    auth.check_client(src, job, cn, sn, recv_exact_blocking(sock, MAC_BYTES))
