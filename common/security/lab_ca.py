"""Issuing: the lab CA, the TLS certificates of the controller, operators and agents, and the
CURVE key pairs, written once by ``oddl certs init`` (:func:`init_lab_ca`).

The folder it writes is described in :mod:`oddl.common.security`; :mod:`oddl.common.revocation`
reissues one identity's files with the same CA (:func:`sign_leaf`, :func:`key_pem`).
Private keys are written 0600, whatever the umask (:func:`write_private_file`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zmq

from oddl.common.errors import SecurityError
from oddl.common.security.files import (
    DEFAULT_CURVE_SERVERS,
    MANIFEST,
    MANIFEST_FORMAT,
    OPERATOR_USER_PREFIX,
    ROLE_AGENT,
    ROLE_OPERATOR,
    ROLE_SERVER,
    SUBJECT_ORG,
    SecurityFiles,
)
from oddl.common.security.ownership import (
    KeyOwner,
    check_can_hand_over,
    check_reachable,
    hand_over,
    service_keys,
)

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HOST = re.compile(r"^[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})$")


def _check_name(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise SecurityError(f"bad {kind} name {name!r}: use letters, digits, '_', '.', '-' "
                            "(at most 64, starting with a letter or digit)")
    return name


def _unique(kind: str, names: Iterable[str]) -> tuple[str, ...]:
    out = tuple(_check_name(kind, n) for n in names)
    dups = sorted({n for n in out if out.count(n) > 1})
    if dups:
        raise SecurityError(f"{kind} names repeat: {', '.join(dups)}; list each once")
    return out


def write_private_file(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to `path` created with `mode` (never wider, whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def curve_file_text(public: bytes, secret: bytes | None, name: str, now: dt.datetime) -> bytes:
    """A CURVE key file in the ZeroMQ certificate format (zcert), public or secret."""
    kind = "Secret" if secret else "Public"
    lines = [f"#   ****  Generated on {now:%Y-%m-%d %H:%M:%S} by oddl certs init  ****",
             f"#   ZeroMQ CURVE {kind} Certificate for {name}"]
    if secret:
        lines.append("#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.")
    lines += ["", "metadata", f"    name = {name}", "curve",
              f'    public-key = "{public.decode("ascii")}"']
    if secret:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    return ("\n".join(lines) + "\n").encode("ascii")


def key_pem(key: Any) -> bytes:
    """A private key as unencrypted PKCS#8 PEM (the format of every ``tls/*.key``)."""
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _key_usage(*, ca: bool) -> Any:
    """Key usage of the CA (signs certificates) or of a leaf (signs handshakes)."""
    from cryptography import x509

    return x509.KeyUsage(digital_signature=not ca, content_commitment=False,
                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                         key_cert_sign=ca, crl_sign=ca, encipher_only=False,
                         decipher_only=False)


def _builder(subject: Any, issuer: Any, public_key: Any, not_before: dt.datetime,
             not_after: dt.datetime, *, ca: bool) -> Any:
    """A certificate builder with what the CA and the leaves share: names, key, validity,
    basic constraints and key usage."""
    from cryptography import x509

    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None),
                           critical=True)
            .add_extension(_key_usage(ca=ca), critical=True))


def sign_leaf(ca_key: Any, ca_name: Any, ca_ski: Any, role: str, cn: str, sans: Any,
              not_before: dt.datetime, not_after: dt.datetime) -> tuple[Any, Any]:
    """A new P-256 key and its certificate (``O=oddl lab, OU=role, CN=cn``) signed by the lab
    CA; `sans` (a list of x509 general names) makes it a server certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, SUBJECT_ORG),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    server = sans is not None
    b = (_builder(name, ca_name, key.public_key(), not_before, not_after, ca=False)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                               else ExtendedKeyUsageOID.CLIENT_AUTH]),
                        critical=False)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                        critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
             ca_ski), critical=False))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, b.sign(ca_key, hashes.SHA256())


class _Issue:
    """One ``certs init`` run: makes the CA, the leaves and the CURVE pairs, writes them under
    `out` and records every file for the manifest."""

    def __init__(self, out: Path, days: int) -> None:
        self.out = out
        self.now = dt.datetime.now(dt.UTC)
        self.not_before = self.now - dt.timedelta(minutes=5)
        self.not_after = self.now + dt.timedelta(days=days)
        self.files: list[dict[str, str]] = []
        self.ca_key: Any = None
        self.ca_name: Any = None
        self.ca_ski: Any = None

    def put(self, rel: str, data: bytes, kind: str, private: bool) -> str:
        """Write one file (0600 if `private`, else 0644); return its relative path."""
        mode = 0o600 if private else 0o644
        write_private_file(self.out / rel, data, mode)
        self.files.append({"path": rel, "kind": kind, "mode": f"{mode:04o}"})
        return rel

    def authority(self) -> dict[str, str]:
        """Make and write the lab CA (``tls/ca.crt``, ``tls/ca.key``); its manifest entry."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, SUBJECT_ORG),
                                  x509.NameAttribute(NameOID.COMMON_NAME, "oddl lab CA")])
        self.ca_ski = x509.SubjectKeyIdentifier.from_public_key(self.ca_key.public_key())
        cert = (_builder(self.ca_name, self.ca_name, self.ca_key.public_key(), self.not_before,
                         self.not_after, ca=True)
                .add_extension(self.ca_ski, critical=False)
                .sign(self.ca_key, hashes.SHA256()))
        return {"cert": self.put("tls/ca.crt", cert.public_bytes(serialization.Encoding.PEM),
                                 "ca-cert", False),
                "key": self.put("tls/ca.key", key_pem(self.ca_key), "ca-key", True),
                "subject": cert.subject.rfc4514_string()}

    def leaf(self, stem: str, role: str, cn: str, sans: Any = None) -> dict[str, str]:
        """Make and write ``tls/STEM.crt`` and ``.key`` (a server certificate if `sans`)."""
        from cryptography.hazmat.primitives import serialization

        key, cert = sign_leaf(self.ca_key, self.ca_name, self.ca_ski, role, cn, sans,
                              self.not_before, self.not_after)
        return {"cert": self.put(f"tls/{stem}.crt", cert.public_bytes(serialization.Encoding.PEM),
                                 f"{role}-cert", False),
                "key": self.put(f"tls/{stem}.key", key_pem(key), f"{role}-key", True),
                "subject": cert.subject.rfc4514_string(),
                "not_after": cert.not_valid_after_utc.isoformat()}

    def curve(self, stem: str, label: str) -> dict[str, str]:
        """Make and write the CURVE pair ``curve/STEM.key`` and ``.key_secret``."""
        public, secret = zmq.curve_keypair()
        return {"public": self.put(f"curve/{stem}.key",
                                   curve_file_text(public, None, label, self.now),
                                   "curve-public", False),
                "secret": self.put(f"curve/{stem}.key_secret",
                                   curve_file_text(public, secret, label, self.now),
                                   "curve-secret", True),
                "public_key": public.decode("ascii")}


def init_lab_ca(out_dir: str | os.PathLike[str], nodes: Iterable[str], *,
                operators: Iterable[str] = ("operator",),
                hosts: Iterable[str] = ("127.0.0.1", "localhost"), days: int = 3650,
                curve_servers: Iterable[str] = DEFAULT_CURVE_SERVERS,
                force: bool = False, owner: KeyOwner | None = None) -> SecurityFiles:
    """Create a lab CA, TLS certificates and CURVE keys under `out_dir`; see
    :mod:`oddl.common.security`.

    Refuses a directory that already holds files unless `force` (which first removes the
    files an earlier manifest there lists, so no stale key survives). With `owner`, the keys
    the services read become that user's (:mod:`oddl.common.security.ownership`); the CA key and
    the operators' keys stay the caller's.
    """
    out = Path(out_dir)
    node_ids, operator_names, server_names = _check_names(nodes, operators, curve_servers)
    host_list, sans = _server_names(hosts)
    if days <= 0:
        raise SecurityError(f"bad validity {days} days; use a positive number")
    if owner is not None:
        check_can_hand_over(owner)
        check_reachable(out, owner)
    _prepare_folder(out, force)
    run = _Issue(out, days)
    ca = run.authority()
    server = run.leaf("server", ROLE_SERVER, "oddl-controller", sans)
    operator_certs = {o: run.leaf(f"operator-{o}", ROLE_OPERATOR, o) for o in operator_names}
    agent_certs = {n: run.leaf(f"agent-{n}", ROLE_AGENT, n) for n in node_ids}
    curve = {"servers": {s: run.curve(s, s) for s in server_names},
             "nodes": {n: run.curve(n, n) for n in node_ids},
             "operators": {o: run.curve(f"operator-{o}", OPERATOR_USER_PREFIX + o)
                           for o in operator_names}}
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "created": run.now.isoformat(),
        "not_after": run.not_after.isoformat(),
        "hosts": list(host_list),
        "nodes": list(node_ids),
        "operators": list(operator_names),
        "subject_format": f"O={SUBJECT_ORG}, OU=<role: operator|agent|server>, "
                          "CN=<operator name | node id>",
        "ca": ca,
        "server": server,
        "operator_certs": operator_certs,
        "agent_certs": agent_certs,
        "curve": curve,
        "files": run.files,
    }
    write_private_file(out / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"),
                       0o644)
    if owner is not None:
        hand_over(out, service_keys(manifest), owner)
    logger.info("lab CA and keys for %d nodes, %d operators written to %s", len(node_ids),
                len(operator_names), out)
    return SecurityFiles.load(out)


def _check_names(nodes: Iterable[str], operators: Iterable[str], curve_servers: Iterable[str]
                 ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(node ids, operator names, CURVE server names), each valid and listed once."""
    node_ids = _unique("node", nodes)
    operator_names = _unique("operator", operators)
    server_names = _unique("CURVE server", curve_servers)
    if not node_ids:
        raise SecurityError("no nodes given; pass the node ids of the testbed, e.g. "
                            "--nodes n0,n1,n2,n3")
    clash = set(server_names) & set(node_ids)
    if clash:
        raise SecurityError(f"CURVE server names {', '.join(sorted(clash))} are also node ids; "
                            "rename the server")
    return node_ids, operator_names, server_names


def _server_names(hosts: Iterable[str]) -> tuple[tuple[str, ...], list[Any]]:
    """The hosts of the server certificate and its subject alternative names."""
    from cryptography import x509

    host_list = tuple(h.strip() for h in hosts if h.strip())
    if not host_list:
        raise SecurityError("no hosts given; the server certificate needs at least one "
                            "(e.g. --hosts 127.0.0.1,localhost)")
    sans: list[x509.GeneralName] = []
    for h in host_list:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            if not _HOST.match(h):
                raise SecurityError(f"bad host {h!r} for the server certificate; use an IP "
                                    "address or a DNS name") from None
            sans.append(x509.DNSName(h))
    return host_list, sans


def _prepare_folder(out: Path, force: bool) -> None:
    """Make `out`, ``out/tls`` and ``out/curve``; refuse a non-empty `out` unless `force`."""
    if out.exists() and not out.is_dir():
        raise SecurityError(f"{out}: exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise SecurityError(f"{out}: already exists and is not empty; refusing to overwrite "
                                "keys — choose another --out, or pass --force (force=True) to "
                                "replace the lab CA and every key")
        _remove_previous(out)
    missing = [d for d in (*reversed(out.absolute().parents), out.absolute())
               if not d.is_dir()]
    for d in (*missing, out / "tls", out / "curve"):
        if not d.is_dir():
            d.mkdir()
            d.chmod(0o755)  # the service user must reach its keys, whatever the umask


def _remove_previous(out: Path) -> None:
    """Remove the files an earlier manifest in `out` lists (nothing else)."""
    mpath = out / MANIFEST
    if not mpath.exists():
        return
    try:
        previous = SecurityFiles.load(out)
    except SecurityError:
        logger.warning("%s is not readable; files it listed are not removed", mpath)
        return
    for p in previous.written():
        try:
            if p.resolve().is_relative_to(out.resolve()):
                p.unlink(missing_ok=True)
        except OSError as exc:
            raise SecurityError(f"{p}: cannot remove the old file ({exc.strerror}); remove it "
                                "by hand") from None
    mpath.unlink(missing_ok=True)

