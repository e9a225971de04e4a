"""Revoking an agent's or an operator's credentials (issuing side: revoke, rotate).

`oddl certs revoke --certs DIR --node n2` (or `--operator alice`) writes the certificate's
serial number and the CURVE public key of that identity to ``DIR/revoked.json``. From then on:

- the controller refuses the certificate on every call (it rereads the file when it changes,
  so a running controller needs no restart);
- the fabric and the nodes' links refuse the key at the next handshake of a process that
  starts, and the authenticated streams check it at every new stream;
- a new certificate and key for the same name come from `oddl certs rotate` (same CA).

Copy the updated ``revoked.json`` to every host, as the rest of the folder. Reading it (what is
revoked, at run time) is :mod:`oddl.common.security.revoked`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from pathlib import Path

from oddl.common.errors import SecurityError
from oddl.common.security.files import (
    MANIFEST,
    OPERATOR_USER_PREFIX,
    ROLE_AGENT,
    ROLE_OPERATOR,
    SecurityFiles,
)
from oddl.common.security.lab_ca import curve_file_text, key_pem, sign_leaf, write_private_file
from oddl.common.security.ownership import KeyOwner, check_can_hand_over, hand_over, service_keys
from oddl.common.security.revoked import REVOKED, read_revocation_document

logger = logging.getLogger(__name__)


def identity_entry(files: SecurityFiles, node: str | None = None,
                   operator: str | None = None) -> dict[str, str]:
    """The certificate serial and CURVE public key of a node or an operator, by name."""
    from cryptography import x509

    if (node is None) == (operator is None):
        raise SecurityError("name exactly one identity: --node ID or --operator NAME")
    if node is not None:
        if node not in files.nodes:
            raise SecurityError(f"no node {node!r} in {files.root}; the nodes are "
                                f"{', '.join(files.nodes)}")
        cert_rel = files.manifest["agent_certs"][node]["cert"]
        curve_name, kind, name = node, "agent", node
    else:
        assert operator is not None
        if operator not in files.operators:
            raise SecurityError(f"no operator {operator!r} in {files.root}; the operators are "
                                f"{', '.join(files.operators)}")
        cert_rel = files.manifest["operator_certs"][operator]["cert"]
        curve_name, kind, name = OPERATOR_USER_PREFIX + operator, "operator", operator
    cert = x509.load_pem_x509_certificate((files.root / cert_rel).read_bytes())
    return {"kind": kind, "name": name, "serial": f"{cert.serial_number:x}",
            "subject": cert.subject.rfc4514_string(),
            "curve_public": files.curve_public(curve_name).decode("ascii")}


def revoke(root: str | os.PathLike[str], *, node: str | None = None,
           operator: str | None = None, reason: str = "") -> dict[str, str]:
    """Record the current credentials of a node or an operator as revoked; return the entry."""
    files = SecurityFiles.load(root)
    return _record(files.root, identity_entry(files, node=node, operator=operator), reason)


def _record(root: Path, entry: dict[str, str], reason: str) -> dict[str, str]:
    entry = {**entry, "revoked_at": dt.datetime.now(dt.UTC).isoformat(), "reason": reason}
    path = root / REVOKED
    doc = read_revocation_document(path)
    if any(e.get("serial") == entry["serial"] for e in doc["entries"]):
        return entry  # already revoked: nothing changes
    doc["entries"].append(entry)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    logger.warning("revoked %s %s (certificate %s)", entry["kind"], entry["name"],
                   entry["serial"])
    return entry


def rotate(root: str | os.PathLike[str], *, node: str | None = None,
           operator: str | None = None, owner: KeyOwner | None = None) -> dict[str, str]:
    """New certificate and CURVE key pair for one node or operator, signed by the same lab CA
    (needs ``tls/ca.key``), written over the old files; the old ones are revoked. Returns the
    revoked entry. Copy the identity's new files, the manifest and revoked.json to the hosts.
    With `owner`, a node's new keys become that (service) user's, mode 0600."""
    import zmq
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    if owner is not None:
        if node is None:
            raise SecurityError(f"--owner {owner}: an operator's keys are the operator's, not "
                                "a service's; leave --owner out and give the operator the files")
        check_can_hand_over(owner)
    files = SecurityFiles.load(root)
    old = identity_entry(files, node=node, operator=operator)
    manifest = json.loads(json.dumps(files.manifest))
    ca_key_path = files.root / manifest["ca"]["key"]
    if not ca_key_path.exists():
        raise SecurityError(f"{ca_key_path}: the lab CA's key is not on this host; rotate on "
                            "the host where `oddl certs init` ran")
    ca_cert = x509.load_pem_x509_certificate((files.root / manifest["ca"]["cert"]).read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    now = dt.datetime.now(dt.UTC)
    if node is not None:
        certs, role, name, curve = manifest["agent_certs"][node], ROLE_AGENT, node, \
            manifest["curve"]["nodes"][node]
        label = node
    else:
        assert operator is not None
        certs, role, name, curve = manifest["operator_certs"][operator], ROLE_OPERATOR, \
            operator, manifest["curve"]["operators"][operator]
        label = OPERATOR_USER_PREFIX + operator
    key, cert = sign_leaf(ca_key, ca_cert.subject, ca_ski, role, name, None,
                          now - dt.timedelta(minutes=5), ca_cert.not_valid_after_utc)
    write_private_file(files.root / certs["key"], key_pem(key), 0o600)
    write_private_file(files.root / certs["cert"],
                       cert.public_bytes(serialization.Encoding.PEM), 0o644)
    certs["not_after"] = cert.not_valid_after_utc.isoformat()
    public, secret = zmq.curve_keypair()
    write_private_file(files.root / curve["secret"],
                       curve_file_text(public, secret, label, now), 0o600)
    write_private_file(files.root / curve["public"], curve_file_text(public, None, label, now),
                       0o644)
    curve["public_key"] = public.decode("ascii")
    tmp = files.root / f"{MANIFEST}.tmp"
    write_private_file(tmp, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"), 0o644)
    os.replace(tmp, files.root / MANIFEST)
    if owner is not None and node is not None:
        hand_over(files.root, service_keys(manifest, nodes=[node], server=False,
                                           curve_servers=False), owner)
    logger.warning("rotated %s %s: new certificate %x and CURVE key", old["kind"], name,
                   cert.serial_number)
    return _record(files.root, old, "rotated")
