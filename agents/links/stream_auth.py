"""Mutual authentication of a data stream with the nodes' CURVE keys (secure lab mode).

When a node opens a stream to a peer, both prove that they hold the secret key of the node
they claim to be, with the key pairs that `oddl certs init` made for every node (Curve25519,
the keys the ZeroMQ CURVE links use):

1. the client's hello carries its node id, the job and a fresh 16-byte nonce;
2. the server answers with its own nonce and HMAC-SHA256(K, "server" | nonces | job | src |
   dst), where K is the X25519 shared secret of the server's secret key and the client's
   public key;
3. the client checks that MAC (only the real destination node can compute K) and answers
   with HMAC(K, "client" | …), which the server checks (only the real source can).

Nonces on both sides rule out replays; a public key that is not in the lab's manifest or is
revoked is refused. The chunks that follow are authenticated by the connection, not
encrypted: gradients cross the lab's own fibre at line rate (the ZeroMQ CURVE link,
`[fabric] transport = "curve"`, encrypts them at a fraction of the rate).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from zmq.utils import z85

NONCE_BYTES = 16
MAC_BYTES = 32
REPLY = b"ODA1"


class AuthError(ValueError):
    """A stream whose peer could not prove who it is (the message says which check failed)."""


class PairAuth(ABC):
    """The proofs of a stream's two ends (the module docstring) from the key each pair of
    nodes shares (`_shared`): `StreamAuth` computes it from the nodes' key pairs, `JobKeys`
    holds the keys derived for one job's rank path."""

    node_id: str

    @abstractmethod
    def _shared(self, peer: str) -> bytes:
        """The key this node shares with `peer` (AuthError when there is none)."""

    @staticmethod
    def nonce() -> bytes:
        return os.urandom(NONCE_BYTES)

    def server_proof(self, src: str, job: str, client_nonce: bytes, server_nonce: bytes
                     ) -> bytes:
        """What this node (the destination) sends to prove itself to `src`."""
        return _mac(self._shared(src), b"server", client_nonce, server_nonce, job, src,
                    self.node_id)

    def check_server(self, dst: str, job: str, client_nonce: bytes, server_nonce: bytes,
                     proof: bytes) -> None:
        """Raise AuthError unless `proof` came from the holder of `dst`'s secret key."""
        want = _mac(self._shared(dst), b"server", client_nonce, server_nonce, job,
                    self.node_id, dst)
        if not hmac.compare_digest(want, proof):
            raise AuthError(f"{dst} did not prove its identity (wrong key for this lab, or "
                            "another process answers at its address)")

    def client_proof(self, dst: str, job: str, client_nonce: bytes, server_nonce: bytes
                     ) -> bytes:
        """What this node (the source) sends to prove itself to `dst`."""
        return _mac(self._shared(dst), b"client", client_nonce, server_nonce, job,
                    self.node_id, dst)

    def check_client(self, src: str, job: str, client_nonce: bytes, server_nonce: bytes,
                     proof: bytes) -> None:
        """Raise AuthError unless `proof` came from the holder of `src`'s secret key."""
        want = _mac(self._shared(src), b"client", client_nonce, server_nonce, job, src,
                    self.node_id)
        if not hmac.compare_digest(want, proof):
            raise AuthError(f"a stream claiming to come from {src} did not prove it (wrong "
                            "key: a host outside the lab, or a revoked node)")


@dataclass
class StreamAuth(PairAuth):
    """This node's key pair and the public keys of the lab's nodes (z85, from the manifest)."""

    node_id: str
    secret_z85: bytes
    peers: Mapping[str, bytes]
    revoked: set[bytes] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._secret = X25519PrivateKey.from_private_bytes(z85.decode(self.secret_z85))

    def _shared(self, peer: str) -> bytes:
        key = self.peers.get(peer)
        if key is None:
            raise AuthError(f"node {peer!r} has no key in the lab's certificates; run "
                            "`oddl certs init` with every node id and copy the folder to "
                            "every host")
        if key in self.revoked:
            raise AuthError(f"the key of node {peer!r} is revoked; issue it a new one "
                            "(`oddl certs rotate`)")
        return self._secret.exchange(X25519PublicKey.from_public_bytes(z85.decode(key)))

    def job_keys(self, job: str, nodes: Iterable[str]) -> dict[str, bytes]:
        """The keys of `job`'s rank path (decision record 0042), per peer among `nodes`:
        HMAC-SHA256(K, "oddl-rank-path-v1" | job). Both ends of a pair derive the same key
        from their shared secret K; it proves only that pair, only on that job, and reveals
        neither node's secret key. AuthError for a peer without a key or with a revoked one."""
        label = b"oddl-rank-path-v1\0" + job.encode()
        return {peer: hmac.new(self._shared(peer), label, hashlib.sha256).digest()
                for peer in nodes if peer != self.node_id}


class JobKeys(PairAuth):
    """A training process's proofs on its job's rank path: the keys its agent derived for it
    (`StreamAuth.job_keys`), not the node's secret key."""

    def __init__(self, node_id: str, keys: Mapping[str, bytes]):
        self.node_id = node_id
        self._keys = dict(keys)

    def _shared(self, peer: str) -> bytes:
        key = self._keys.get(peer)
        if key is None:
            raise AuthError(f"node {peer!r} is not a peer of this job's rank path (its agent "
                            "handed no key for it)")
        return key


def _mac(key: bytes, role: bytes, cn: bytes, sn: bytes, job: str, src: str, dst: str) -> bytes:
    msg = b"\0".join((b"oddl-stream-v1", role, cn, sn, job.encode(), src.encode(), dst.encode()))
    return hmac.new(key, msg, hashlib.sha256).digest()
