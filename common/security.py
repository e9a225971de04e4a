"""Security building blocks: a lab CA, mutual TLS with roles for gRPC, CURVE for ZeroMQ.

Nothing here is switched on by itself: the controller, the agents, the operator client and
the fabric opt in (the emulated testbed may run without security).

Files (``oddl certs init --out DIR``, :func:`init_lab_ca`)::

    DIR/manifest.json                 what was written, subjects, CURVE public keys (z85)
    DIR/tls/ca.crt, ca.key            the lab CA (keep ca.key on the machine that issues)
    DIR/tls/server.crt, server.key    the controller (SANs = --hosts), any lab TLS server
    DIR/tls/operator-NAME.crt, .key   one client certificate per operator (role operator)
    DIR/tls/agent-NODE.crt, .key      one client certificate per node agent (role agent)
    DIR/curve/SERVER.key, .key_secret CURVE pair of a ZeroMQ server (default: "fabric")
    DIR/curve/NODE.key, .key_secret   CURVE pair of a node (client of the fabric and of its
                                      peers' direct links, server of its own direct link)
    DIR/curve/operator-NAME.key, ...  CURVE pair of an operator tool (fabric statistics)

Private keys (``*.key`` under tls/, ``*.key_secret`` under curve/) are written 0600. TLS keys
are ECDSA P-256 in unencrypted PKCS#8 PEM; CURVE files use the ``zmq.auth`` certificate format
(``zmq.auth.load_certificate`` reads them). A host needs only its own files plus ``tls/ca.crt``
and ``manifest.json`` (which carries every CURVE public key).

Certificate subjects: ``O=oddl lab, OU=<role>, CN=<name>``; the role is ``operator``,
``agent`` or ``server``; an agent's CN is its node id, an operator's CN its name.

gRPC: :func:`server_credentials` (client certificates required), :func:`channel_credentials`,
:class:`AuthorizationInterceptor` (the method → roles table :data:`METHOD_RULES`; agent RPCs
must carry the caller's own ``node_id``), :func:`peer_identity`.

ZeroMQ: :class:`CurveServer` makes a ROUTER a CURVE server whose ZAP handler admits only the
listed client keys (and names each connection by its node: the ``User-Id`` frame property,
see :func:`sender_matches`); :func:`configure_curve_client` sets up a DEALER. Wiring:

- fabric ROUTER: ``CurveServer(files.curve_keys("fabric"), files.curve_clients())`` and
  ``server.configure(sock)`` before ``bind``; drop frames for which ``sender_matches`` is False.
- agent DEALERs to the fabric (identities ``node`` and ``node/tx``):
  ``configure_curve_client(sock, files.curve_keys(node), files.curve_public("fabric"))``
  before ``connect``.
- direct links: a node's ROUTER is ``CurveServer(files.curve_keys(node),
  files.curve_clients(operators=False))``; a DEALER to peer P uses
  ``configure_curve_client(sock, files.curve_keys(node), files.curve_public(P))``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import logging
import os
import re
import stat
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import grpc
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import monitor as zmq_monitor
from zmq.utils import z85

from common.errors import OddlError

logger = logging.getLogger(__name__)

ROLE_OPERATOR = "operator"
ROLE_AGENT = "agent"
ROLE_SERVER = "server"
SUBJECT_ORG = "oddl lab"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "oddl-security/1"
DEFAULT_CURVE_SERVERS = ("fabric",)
OPERATOR_USER_PREFIX = "operator:"
"""ZeroMQ User-Id of an operator key is ``operator:NAME``; a node key's User-Id is the node id."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HOST = re.compile(r"^[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})$")
_INIT_HINT = "run `oddl certs init --out DIR --nodes ...` (or copy the files it wrote)"


class SecurityError(OddlError):
    """Keys or certificates are missing, malformed, expired or would be overwritten."""


# --------------------------------------------------------------------------- files


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files one TLS endpoint needs: the CA to trust, its certificate and key."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(ca, cert, key) as PEM bytes, checked: parseable, unexpired, issued by the CA."""
        ca, cert, key = _read(self.ca), _read(self.cert), _read(self.key, private=True)
        _check_pair(self, ca, cert, key)
        return ca, cert, key


@dataclass(frozen=True)
class CurveKeys:
    """A CURVE key pair in z85 (40 bytes each); ``secret`` is None for a public key only."""

    public: bytes
    secret: bytes | None = None


@dataclass(frozen=True)
class SecurityFiles:
    """Where the files of one ``certs init`` run are, read from its manifest.

    Files are only read when used, so a host may hold a subset (its own keys, ``tls/ca.crt``
    and ``manifest.json``).
    """

    root: Path
    hosts: tuple[str, ...]
    nodes: tuple[str, ...]
    operators: tuple[str, ...]
    curve_servers: tuple[str, ...]
    manifest: Mapping[str, Any] = field(repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SecurityFiles:
        """Read the manifest in directory `path` (or the manifest file `path` itself)."""
        p = Path(path)
        mpath = p / MANIFEST if p.is_dir() else p
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SecurityError(f"{mpath}: no such manifest; {_INIT_HINT}") from None
        except (OSError, ValueError) as exc:
            raise SecurityError(f"{mpath}: cannot read the security manifest ({exc}); "
                                f"{_INIT_HINT}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise SecurityError(f"{mpath}: not an oddl security manifest (format "
                                f"{MANIFEST_FORMAT!r} expected); {_INIT_HINT}")
        missing = [k for k in ("hosts", "nodes", "operators", "ca", "server", "operator_certs",
                               "agent_certs", "curve", "files") if k not in manifest]
        if missing:
            raise SecurityError(f"{mpath}: the manifest lacks {', '.join(missing)}; it was "
                                f"edited or damaged — {_INIT_HINT}")
        return cls(root=mpath.parent, hosts=tuple(manifest["hosts"]),
                   nodes=tuple(manifest["nodes"]), operators=tuple(manifest["operators"]),
                   curve_servers=tuple(manifest["curve"].get("servers", {})),
                   manifest=manifest)

    def _path(self, rel: str) -> Path:
        return self.root / rel

    def _entry(self, section: str, name: str, what: str) -> Mapping[str, Any]:
        entries = self.manifest[section]
        if name not in entries:
            known = ", ".join(sorted(entries)) or "none"
            raise SecurityError(f"{self.root / MANIFEST}: no {what} {name!r} (known: {known}); "
                                f"re-run `oddl certs init` with it")
        return entries[name]

    # ---- TLS
    def server_tls(self) -> TlsFiles:
        """The controller's server certificate (SANs = the hosts given to ``certs init``)."""
        e = self.manifest["server"]
        return TlsFiles(self._path(self.manifest["ca"]["cert"]), self._path(e["cert"]),
                        self._path(e["key"]))

    def operator_tls(self, name: str = "operator") -> TlsFiles:
        """Client certificate of operator `name` (role operator)."""
        e = self._entry("operator_certs", name, "operator")
        return TlsFiles(self._path(self.manifest["ca"]["cert"]), self._path(e["cert"]),
                        self._path(e["key"]))

    def agent_tls(self, node: str) -> TlsFiles:
        """Client certificate of the agent of `node` (role agent, CN = node)."""
        e = self._entry("agent_certs", node, "node")
        return TlsFiles(self._path(self.manifest["ca"]["cert"]), self._path(e["cert"]),
                        self._path(e["key"]))

    # ---- CURVE
    def _curve_entry(self, name: str) -> Mapping[str, Any]:
        curve = self.manifest["curve"]
        if name.startswith(OPERATOR_USER_PREFIX):
            entry = curve["operators"].get(name[len(OPERATOR_USER_PREFIX):])
        else:
            entry = curve["servers"].get(name) or curve["nodes"].get(name)
        if entry is not None:
            return entry
        known = sorted([*curve["servers"], *curve["nodes"],
                        *(OPERATOR_USER_PREFIX + o for o in curve["operators"])])
        raise SecurityError(f"{self.root / MANIFEST}: no CURVE key {name!r} (known: "
                            f"{', '.join(known)}); re-run `oddl certs init` with it")

    def curve_public(self, name: str) -> bytes:
        """Public key (z85) of a server (``fabric``), a node, or ``operator:NAME``."""
        return self._curve_entry(name)["public_key"].encode("ascii")

    def curve_keys(self, name: str) -> CurveKeys:
        """Key pair of a server, a node or ``operator:NAME``, read from its secret file."""
        e = self._curve_entry(name)
        keys = load_curve_keys(self._path(e["secret"]))
        if keys.public != e["public_key"].encode("ascii"):
            raise SecurityError(f"{self._path(e['secret'])}: its public key differs from the "
                                f"one in {self.root / MANIFEST}; the files come from different "
                                "`oddl certs init` runs — copy the whole set again")
        return keys

    def curve_clients(self, *, operators: bool = True) -> dict[bytes, str]:
        """The allow-list: public key (z85) → User-Id for every node (and operator) key that
        is not revoked (``revoked.json``, common/revocation.py)."""
        from common.revocation import read_revoked

        curve = self.manifest["curve"]
        allowed = {e["public_key"].encode("ascii"): node for node, e in curve["nodes"].items()}
        if operators:
            allowed.update({e["public_key"].encode("ascii"): OPERATOR_USER_PREFIX + name
                            for name, e in curve["operators"].items()})
        revoked = read_revoked(self.root).keys
        return {k: u for k, u in allowed.items() if k not in revoked}

    def written(self) -> list[Path]:
        """Every file the manifest lists (the manifest itself excluded)."""
        return [self._path(f["path"]) for f in self.manifest["files"]]


def _read(path: Path, *, private: bool = False) -> bytes:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise SecurityError(f"{path}: no such file; {_INIT_HINT}") from None
    except OSError as exc:
        raise SecurityError(f"{path}: cannot read ({exc.strerror}); check its owner and "
                            "permissions") from None
    if private:
        _warn_if_shared(Path(path))
    return data


def _warn_if_shared(path: Path) -> None:
    try:
        if os.name == "posix" and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            logger.warning("%s holds a private key and is readable by other users; run "
                           "`chmod 600 %s`", path, path)
    except OSError:
        pass


def _as_pem(value: bytes | str | os.PathLike[str], *, private: bool = False) -> bytes:
    """PEM bytes as given, or read from a path."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode("ascii")
    return _read(Path(value), private=private)


def load_curve_keys(path: str | os.PathLike[str]) -> CurveKeys:
    """Read a ``zmq.auth`` certificate file (``.key`` public only, ``.key_secret`` both)."""
    p = Path(path)
    if not p.exists():
        raise SecurityError(f"{p}: no such CURVE key file; {_INIT_HINT}")
    _read(p)  # readable, or a clear error
    try:
        public, secret = zmq.auth.load_certificate(p)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{p}: not a ZeroMQ CURVE certificate ({exc}); "
                            f"{_INIT_HINT}") from None
    if secret is not None:
        _warn_if_shared(p)
    for k in (public, secret):
        if k is not None and len(k) != 40:
            raise SecurityError(f"{p}: a CURVE key is not 40 z85 characters; the file is "
                                f"damaged — {_INIT_HINT}")
    return CurveKeys(public=public, secret=secret)


# --------------------------------------------------------------------------- lab CA


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


def init_lab_ca(out_dir: str | os.PathLike[str], nodes: Iterable[str], *,
                operators: Iterable[str] = ("operator",),
                hosts: Iterable[str] = ("127.0.0.1", "localhost"), days: int = 3650,
                curve_servers: Iterable[str] = DEFAULT_CURVE_SERVERS,
                force: bool = False) -> SecurityFiles:
    """Create a lab CA, TLS certificates and CURVE keys under `out_dir`; see the module doc.

    Refuses a directory that already holds files unless `force` (which first removes the
    files an earlier manifest there lists, so no stale key survives).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out = Path(out_dir)
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
    if days <= 0:
        raise SecurityError(f"bad validity {days} days; use a positive number")

    if out.exists() and not out.is_dir():
        raise SecurityError(f"{out}: exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise SecurityError(f"{out}: already exists and is not empty; refusing to overwrite "
                                "keys — choose another --out, or pass --force (force=True) to "
                                "replace the lab CA and every key")
        _remove_previous(out)
    tls_dir, curve_dir = out / "tls", out / "curve"
    for d in (out, tls_dir, curve_dir):
        d.mkdir(parents=True, exist_ok=True)

    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)
    files: list[dict[str, str]] = []

    def put(rel: str, data: bytes, kind: str, private: bool) -> str:
        mode = 0o600 if private else 0o644
        write_private_file(out / rel, data, mode)
        files.append({"path": rel, "kind": kind, "mode": f"{mode:04o}"})
        return rel

    def new_key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM,
                                 serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = new_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, SUBJECT_ORG),
                         x509.NameAttribute(NameOID.COMMON_NAME, "oddl lab CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(not_before).not_valid_after(not_after)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=True,
                                            crl_sign=True, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(ca_ski, critical=False)
               .sign(ca_key, hashes.SHA256()))
    ca_rel = put("tls/ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM), "ca-cert",
                 False)
    ca_key_rel = put("tls/ca.key", key_pem(ca_key), "ca-key", True)

    def leaf(stem: str, role: str, cn: str, server: bool) -> dict[str, str]:
        key, cert = sign_leaf(ca_key, ca_name, ca_ski, role, cn, sans if server else None,
                              not_before, not_after)
        return {"cert": put(f"tls/{stem}.crt", cert.public_bytes(serialization.Encoding.PEM),
                            f"{role}-cert", False),
                "key": put(f"tls/{stem}.key", key_pem(key), f"{role}-key", True),
                "subject": cert.subject.rfc4514_string(),
                "not_after": cert.not_valid_after_utc.isoformat()}

    server = leaf("server", ROLE_SERVER, "oddl-controller", server=True)
    operator_certs = {o: leaf(f"operator-{o}", ROLE_OPERATOR, o, False) for o in operator_names}
    agent_certs = {n: leaf(f"agent-{n}", ROLE_AGENT, n, False) for n in node_ids}

    def curve(stem: str, label: str) -> dict[str, str]:
        public, secret = zmq.curve_keypair()
        return {"public": put(f"curve/{stem}.key", curve_file_text(public, None, label, now),
                              "curve-public", False),
                "secret": put(f"curve/{stem}.key_secret", curve_file_text(public, secret, label, now),
                              "curve-secret", True),
                "public_key": public.decode("ascii")}

    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "created": now.isoformat(),
        "not_after": not_after.isoformat(),
        "hosts": list(host_list),
        "nodes": list(node_ids),
        "operators": list(operator_names),
        "subject_format": f"O={SUBJECT_ORG}, OU=<role: operator|agent|server>, "
                          "CN=<operator name | node id>",
        "ca": {"cert": ca_rel, "key": ca_key_rel, "subject": ca_cert.subject.rfc4514_string()},
        "server": server,
        "operator_certs": operator_certs,
        "agent_certs": agent_certs,
        "curve": {"servers": {s: curve(s, s) for s in server_names},
                  "nodes": {n: curve(n, n) for n in node_ids},
                  "operators": {o: curve(f"operator-{o}", OPERATOR_USER_PREFIX + o)
                                for o in operator_names}},
        "files": files,
    }
    write_private_file(out / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"), 0o644)
    logger.info("lab CA and keys for %d nodes, %d operators written to %s", len(node_ids),
                len(operator_names), out)
    return SecurityFiles.load(out)


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
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(not_before).not_valid_after(not_after)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                      key_encipherment=False, data_encipherment=False,
                                      key_agreement=False, key_cert_sign=False,
                                      crl_sign=False, encipher_only=False,
                                      decipher_only=False), critical=True)
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


# --------------------------------------------------------------------------- TLS checks


def _check_pair(files: TlsFiles, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> None:
    """Fail early, naming the file, for what the TLS handshake would only report vaguely."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        raise SecurityError(f"{files.ca}: not a PEM certificate; {_INIT_HINT}") from None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise SecurityError(f"{files.cert}: not a PEM certificate; {_INIT_HINT}") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise SecurityError(f"{files.key}: not an unencrypted PEM private key; "
                            f"{_INIT_HINT}") from None
    now = dt.datetime.now(dt.UTC)
    for path, c in ((files.ca, ca), (files.cert, cert)):
        if c.not_valid_after_utc < now:
            raise SecurityError(f"{path}: expired on {c.not_valid_after_utc:%Y-%m-%d}; issue "
                                "new files with `oddl certs init --force`")
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*fmt) != key.public_key().public_bytes(*fmt):
        raise SecurityError(f"{files.key}: does not belong to {files.cert}; copy the matching "
                            "pair from one `oddl certs init` run")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise SecurityError(f"{files.cert}: not issued by the CA in {files.ca}; the files come "
                            "from different `oddl certs init` runs") from None


# --------------------------------------------------------------------------- gRPC credentials


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
    ca_pem, cert_pem, key_pem = _as_pem(ca), _as_pem(cert), _as_pem(key, private=True)
    _check_pair(files, ca_pem, cert_pem, key_pem)
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


# --------------------------------------------------------------------------- authorization


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
    # operators: changes
    "SubmitJob": OPERATOR_RPC,
    "CancelJob": OPERATOR_RPC,
    "Reconfigure": OPERATOR_RPC,
    # both: reads
    "ListJobs": READ_RPC,
    "GetSchedule": READ_RPC,
    "GetTopology": READ_RPC,
    "GetStatus": READ_RPC,
    "GetDeviceState": READ_RPC,
    "GetDeviceLog": READ_RPC,
})
"""The one table of the Controller service: method name → :class:`Rule`. Every RPC of the
service must have an entry (checked when an :class:`AuthorizationInterceptor` is built)."""

AUXILIARY_RULES: Mapping[str, Rule] = MappingProxyType({
    "/grpc.health.v1.Health/Check": READ_RPC,
    "/grpc.health.v1.Health/Watch": READ_RPC,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": READ_RPC,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": READ_RPC,
})
"""Other services on the controller's server (health, reflection), by full method path."""

_ROLE_PLURAL = {ROLE_OPERATOR: "operators", ROLE_AGENT: "agents"}


def _service_descriptor() -> Any:
    from protos import oddl_pb2

    return oddl_pb2.DESCRIPTOR.services_by_name[CONTROLLER_SERVICE.rsplit(".", 1)[1]]


def check_rules(rules: Mapping[str, Rule], service: Any = None) -> None:
    """Raise :class:`SecurityError` unless `rules` covers exactly the service's RPCs and every
    own-node field exists in the method's request message."""
    service = service or _service_descriptor()
    methods = {m.name: m for m in service.methods}
    missing = sorted(set(methods) - set(rules))
    extra = sorted(set(rules) - set(methods))
    if missing or extra:
        raise SecurityError(
            "common/security.py METHOD_RULES does not match the service in protos/oddl.proto: "
            + "; ".join(filter(None, [
                f"no rule for {', '.join(missing)}" if missing else "",
                f"rules for unknown methods {', '.join(extra)}" if extra else ""]))
            + " — add every RPC to the table with the roles allowed to call it")
    for name, rule in rules.items():
        f = rule.own_node_field
        if f and f not in methods[name].input_type.fields_by_name:
            raise SecurityError(f"common/security.py METHOD_RULES: {name}'s request "
                                f"{methods[name].input_type.name} has no field {f!r}; fix the "
                                "rule or the proto")


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
        self._revocations = revocations  # a RevocationList (common/revocation.py) or None
        self._rules: dict[str, Rule] = {f"/{service}/{m}": r for m, r in rules.items()}
        self._rules.update(auxiliary)

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                       grpc.RpcMethodHandler | None],
                          handler_call_details: grpc.HandlerCallDetails
                          ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        return _wrap(handler, method, self._rules.get(method), self._authorize)

    def _authorize(self, method: str, rule: Rule | None, request: Any,
                   context: grpc.ServicerContext) -> None:
        short = method.rsplit("/", 1)[-1]
        who = peer_identity(context)
        if who is None:
            logger.warning("refused %s from %s: no client certificate", short, context.peer())
            _abort(context, grpc.StatusCode.UNAUTHENTICATED,
                   f"{short} needs a client certificate from the lab CA: connect over TLS "
                   "with a certificate from `oddl certs init`")
        if self._revocations is not None and who.serial in self._revocations.current().serials:
            logger.warning("refused %s from %s: %s's certificate %x is revoked", short,
                           context.peer(), who.describe(), who.serial)
            _abort(context, grpc.StatusCode.UNAUTHENTICATED,
                   f"the certificate of {who.describe()} (serial {who.serial:x}) is revoked; "
                   "get a new one with `oddl certs rotate`")
        if rule is None:
            self._deny(context, who, short, f"{method} is not in the authorization table "
                       "(common/security.py); add it with the roles allowed to call it")
        if who.role not in rule.roles:
            allowed = " and ".join(sorted(_ROLE_PLURAL.get(r, r) for r in rule.roles))
            if rule.roles == {ROLE_OPERATOR}:
                fix = "use an operator certificate"
            elif rule.roles == {ROLE_AGENT}:
                fix = "it is called by a node's agent with that node's agent certificate"
            else:
                fix = f"use a certificate with role {' or '.join(sorted(rule.roles))}"
            self._deny(context, who, short, f"only {allowed} may {short}; {fix}")
        if rule.own_node_field and request is not None:
            claimed = getattr(request, rule.own_node_field, None)
            if claimed != who.node:
                self._deny(context, who, short,
                           f"{rule.own_node_field} is {claimed!r}: an agent acts only for its "
                           f"own node ({who.node}); use the agent certificate of {claimed!r}")

    @staticmethod
    def _deny(context: grpc.ServicerContext, who: Identity, method: str, why: str) -> NoReturn:
        message = f"{who.describe()} may not call {method}: {why}"
        logger.warning("refused: %s (peer %s)", message, context.peer())
        _abort(context, grpc.StatusCode.PERMISSION_DENIED, message)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("grpc context.abort returned")  # abort always raises


def _wrap(handler: grpc.RpcMethodHandler, method: str, rule: Rule | None,
          authorize: Callable[[str, Rule | None, Any, grpc.ServicerContext], None]
          ) -> grpc.RpcMethodHandler:
    """The same handler with `authorize` run before the behaviour (and on every request of a
    client stream)."""
    des, ser = handler.request_deserializer, handler.response_serializer
    node_checked = rule is not None and rule.own_node_field is not None

    def checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        for r in requests:
            authorize(method, rule, r, context)
            yield r

    if handler.unary_unary:
        uu = handler.unary_unary

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            authorize(method, rule, request, context)
            return uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, des, ser)
    if handler.unary_stream:
        us = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
            authorize(method, rule, request, context)
            return us(request, context)

        return grpc.unary_stream_rpc_method_handler(unary_stream, des, ser)
    if handler.stream_unary:
        su = handler.stream_unary

        def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            authorize(method, rule, None, context)
            return su(checked(requests, context) if node_checked else requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, des, ser)
    ss = handler.stream_stream

    def stream_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        authorize(method, rule, None, context)
        return ss(checked(requests, context) if node_checked else requests, context)

    return grpc.stream_stream_rpc_method_handler(stream_stream, des, ser)


# --------------------------------------------------------------------------- ZeroMQ CURVE


class _SharedAuthenticator(ThreadAuthenticator):
    """One ZAP handler per context (libzmq binds it at inproc://zeromq.zap.01); each
    :class:`CurveServer` registers its own domain and allow-list on it."""

    def __init__(self, context: zmq.Context) -> None:
        super().__init__(context, log=logging.getLogger(__name__ + ".zap"))
        self.users: dict[bytes, str] = {}
        self.refs = 0

    def curve_user_id(self, client_public_key: bytes) -> str:
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
