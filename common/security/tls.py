"""Run-time TLS for gRPC: the credentials of the controller's server and of its clients, and
who called (the identity a client certificate encodes).

:func:`server_credentials` requires client certificates from the lab CA;
:func:`channel_credentials` / :func:`tls_channel_credentials` present one;
:func:`peer_identity` reads the caller's role and node in a servicer or an interceptor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import grpc

from oddl.common.security.files import ROLE_AGENT, SecurityFiles, TlsFiles, as_pem, check_tls_pair


def _tls_files(files_or_paths: SecurityFiles | TlsFiles | str | os.PathLike[str]) -> TlsFiles:
    if isinstance(files_or_paths, TlsFiles):
        return files_or_paths
    if isinstance(files_or_paths, SecurityFiles):
        return files_or_paths.server_tls()
    return SecurityFiles.load(files_or_paths).server_tls()


def server_credentials(files_or_paths: SecurityFiles | TlsFiles | str | os.PathLike[str]
                       ) -> grpc.ServerCredentials:
    """Mutual-TLS server credentials: the server certificate, client certificates required
    and verified against the lab CA. Accepts a ``certs init`` directory or manifest path,
    :class:`SecurityFiles` or explicit :class:`TlsFiles`."""
    ca, cert, key = _tls_files(files_or_paths).read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=True)


def channel_credentials(ca: bytes | str | os.PathLike[str], cert: bytes | str | os.PathLike[str],
                        key: bytes | str | os.PathLike[str]) -> grpc.ChannelCredentials:
    """Client credentials: trust the lab CA, present `cert` / `key` (PEM bytes or paths)."""
    files = TlsFiles(Path(str(ca)) if not isinstance(ca, bytes) else Path("<ca bytes>"),
                     Path(str(cert)) if not isinstance(cert, bytes) else Path("<cert bytes>"),
                     Path(str(key)) if not isinstance(key, bytes) else Path("<key bytes>"))
    ca_pem, cert_pem, key_pem = as_pem(ca), as_pem(cert), as_pem(key, private=True)
    check_tls_pair(files, ca_pem, cert_pem, key_pem)
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem,
                                        certificate_chain=cert_pem)


def tls_channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """:func:`channel_credentials` from a :class:`TlsFiles` (e.g. ``files.agent_tls("n0")``)."""
    return channel_credentials(files.ca, files.cert, files.key)


def secure_channel(address: str, credentials: grpc.ChannelCredentials, *,
                   server_name: str | None = None,
                   options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """``grpc.secure_channel``; `server_name` overrides the name checked against the server
    certificate's SANs (when `address` is not one of the hosts given to ``certs init``)."""
    opts = list(options)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(address, credentials, options=opts)


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class Identity:
    """Who called: the role (OU) and, for an agent, its node (CN); `name` is the CN."""

    role: str
    node: str | None = None
    name: str = ""
    serial: int = field(default=0, compare=False)

    def describe(self) -> str:
        """``agent n0``, ``operator alice``, ``server oddl-controller``."""
        return f"{self.role or 'certificate without role'} {self.node or self.name}".strip()


@lru_cache(maxsize=256)
def identity_from_pem(pem: bytes) -> Identity:
    """The identity a certificate's subject encodes (``OU=<role>, CN=<node or name>``)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    ous = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    role = str(ous[0].value) if len(ous) == 1 else ""
    name = str(cns[0].value) if len(cns) == 1 else ""
    return Identity(role=role, node=name if role == ROLE_AGENT and name else None, name=name,
                    serial=cert.serial_number)


def peer_identity(context: grpc.ServicerContext) -> Identity | None:
    """The authenticated client certificate's identity, or None (no TLS, no client cert)."""
    auth = context.auth_context() or {}
    if b"ssl" not in auth.get("transport_security_type", []):
        return None
    pems = auth.get("x509_pem_cert") or []
    if not pems:
        return None
    try:
        return identity_from_pem(bytes(pems[0]))
    except ValueError:
        return None

