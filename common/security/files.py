"""The lab's security files as written by ``oddl certs init``: the manifest, the TLS PEM files
of each endpoint and the CURVE key files, read only when used and checked on reading.

The layout of the folder is described in :mod:`oddl.common.security`. Subjects are
``O=oddl lab, OU=<role>, CN=<name>``; the role is ``operator``, ``agent`` or ``server``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq.auth

from oddl.common.errors import SecurityError
from oddl.common.security.ownership import unreadable_key_message
from oddl.common.security.revoked import read_revoked

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
_INIT_HINT = "run `oddl certs init --out DIR --nodes ...` (or copy the files it wrote)"


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files one TLS endpoint needs: the CA to trust, its certificate and key."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(ca, cert, key) as PEM bytes, checked: parseable, unexpired, issued by the CA."""
        ca, cert, key = _read(self.ca), _read(self.cert), _read(self.key, private=True)
        check_tls_pair(self, ca, cert, key)
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
        try:
            folder = p.is_dir()
        except PermissionError:  # a folder above it is closed: reading names it
            folder = p.suffix != ".json"
        mpath = p / MANIFEST if folder else p
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SecurityError(f"{mpath}: no such manifest; {_INIT_HINT}") from None
        except PermissionError as exc:
            raise SecurityError(unreadable_key_message(mpath, exc.strerror or "", private=False)
                                ) from None
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
        is not revoked (``revoked.json``, common/security/revoked.py)."""
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
    except PermissionError as exc:
        raise SecurityError(unreadable_key_message(Path(path), exc.strerror or "",
                                                   private=private)) from None
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


def as_pem(value: bytes | str | os.PathLike[str], *, private: bool = False) -> bytes:
    """PEM bytes as given, or read from a path."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode("ascii")
    return _read(Path(value), private=private)


def load_curve_keys(path: str | os.PathLike[str]) -> CurveKeys:
    """Read a ``zmq.auth`` certificate file (``.key`` public only, ``.key_secret`` both)."""
    p = Path(path)
    try:
        p.stat()
    except FileNotFoundError:
        raise SecurityError(f"{p}: no such CURVE key file; {_INIT_HINT}") from None
    except OSError:
        pass  # _read names the folder that stops this process
    _read(p, private=p.suffix == ".key_secret")  # readable, or a clear error
    try:
        public, secret = zmq.auth.load_certificate(p)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{p}: not a ZeroMQ CURVE certificate ({exc}); "
                            f"{_INIT_HINT}") from None
    if secret is not None and p.suffix != ".key_secret":  # else warned on reading
        _warn_if_shared(p)
    for k in (public, secret):
        if k is not None and len(k) != 40:
            raise SecurityError(f"{p}: a CURVE key is not 40 z85 characters; the file is "
                                f"damaged — {_INIT_HINT}")
    return CurveKeys(public=public, secret=secret)


def check_tls_pair(files: TlsFiles, ca_pem: bytes, cert_pem: bytes, key_pem: bytes
                   ) -> None:
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

