"""An operator's own credentials, handed to their login user and nothing of the services'.

security.md says the operators' keys are handed to each operator; this is the command that
does it (`oddl certs hand-out`). From the lab's certs folder it writes a folder of the
operator's own: the CA certificate (to check the controller), the operator's TLS certificate
and key and CURVE pair, and a manifest that names only that operator — so `oddl status`
with ``--certs`` (or ODDL_CERTS) pointing at it picks that operator by itself. Every file is
the user's; the keys are 0600, the folder 0700. The controller's key, the agents' keys, the
CURVE servers' secrets and the CA key never go there.

`operator_kit` is the plan (pure: manifest in, manifest and file list out); `hand_out` the
shell that copies and changes owners.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oddl.common.errors import SecurityError
from oddl.common.security.ownership import KeyOwner

MANIFEST = "manifest.json"


def operator_kit(manifest: Mapping[str, Any], name: str) -> tuple[dict[str, Any],
                                                                  list[tuple[str, bool]]]:
    """The operator's manifest (only `name` among the operators) and the files to copy,
    (relative path, private) each; SecurityError for an operator the folder does not have."""
    if name not in manifest.get("operator_certs", {}):
        known = ", ".join(sorted(manifest.get("operator_certs", {}))) or "none"
        raise SecurityError(f"no operator {name!r} in this certs folder (operators: {known}); "
                            f"issue one with `oddl certs init ... --operators {name}` or "
                            "`oddl certs rotate --operator NAME`")
    kit = copy.deepcopy(dict(manifest))
    kit["operators"] = [name]
    kit["operator_certs"] = {name: manifest["operator_certs"][name]}
    curve = dict(kit.get("curve", {}))
    operators = curve.get("operators", {})
    curve["operators"] = {name: operators[name]} if name in operators else {}
    kit["curve"] = curve
    tls = manifest["operator_certs"][name]
    files = [(manifest["ca"]["cert"], False), (tls["cert"], False), (tls["key"], True)]
    if name in operators:
        files += [(operators[name]["public"], False), (operators[name]["secret"], True)]
    wanted = {rel for rel, _ in files}
    kit["files"] = [f for f in manifest.get("files", []) if f.get("path") in wanted]
    return kit, files


def is_login_user(user: str) -> bool:
    """True for a person's account (a login shell and a uid of the regular range), not a
    service user such as ``oddl`` (``useradd --system --shell /usr/sbin/nologin``)."""
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return False
    no_login = os.path.basename(entry.pw_shell) in ("nologin", "false", "")
    return entry.pw_uid >= 1000 and not no_login


def default_destination(user: str) -> Path:
    """Where an operator's folder goes by default: ~USER/.config/oddl/certs."""
    import pwd

    try:
        home = pwd.getpwnam(user).pw_dir
    except KeyError:
        raise SecurityError(f"no user {user!r} on this host; name the operator's login "
                            "user") from None
    return Path(home) / ".config" / "oddl" / "certs"


def hand_out(root: Path, manifest: Mapping[str, Any], name: str, owner: KeyOwner,
             destination: Path) -> list[Path]:
    """Write operator `name`'s kit into `destination`, owned by `owner`; return the paths
    written. Needs root unless `owner` is the caller."""
    kit, files = operator_kit(manifest, name)
    missing = [rel for rel, _ in files if not (root / rel).exists()]
    if missing:
        raise SecurityError(f"{root}: {', '.join(missing)} not here; hand out from the folder "
                            "`oddl certs init` wrote (on the controller host)")
    if os.geteuid() not in (0, owner.uid):
        raise SecurityError(f"only root can give files to {owner.user}; run it with sudo")
    written: list[Path] = []
    try:
        for folder in [destination, *{(destination / rel).parent for rel, _ in files}]:
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, owner.uid, owner.gid)
            folder.chmod(0o700)
        for rel, private in files:
            target = destination / rel
            shutil.copyfile(root / rel, target)
            os.chown(target, owner.uid, owner.gid)
            target.chmod(0o600 if private else 0o644)
            written.append(target)
        target = destination / MANIFEST
        target.write_text(json.dumps(kit, indent=2) + "\n", encoding="utf-8")
        os.chown(target, owner.uid, owner.gid)
        target.chmod(0o644)
        written.append(target)
    except OSError as exc:
        raise SecurityError(f"{destination}: cannot write the operator's folder "
                            f"({exc.strerror or exc}); run it as root (sudo)") from None
    return written
