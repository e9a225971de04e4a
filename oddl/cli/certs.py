"""`oddl certs init`: a lab CA, TLS certificates and CURVE keys for a secure testbed.

    oddl certs init --out lab-certs --nodes n0,n1,n2,n3
    oddl certs init --out lab-certs --nodes n0,n1 --operators alice,bob \\
        --hosts 10.0.0.1,ctl.lab --force
    sudo oddl certs init --out /etc/oddl/certs --nodes n0,n1,n2,n3 --owner oddl
    sudo oddl certs chown --certs /etc/oddl/certs --owner oddl    # on a host, after copying

Writes the files described in :mod:`oddl.common.security` (private keys 0600) and prints them.
Exit codes: 0 written, 1 refused or failed (an existing directory without --force, a bad
name), 2 bad command line.

Wire it into a command tree with ``register(subparsers)``; the command sets ``func``, a
function of the parsed arguments that returns the exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from oddl.cli.exit_codes import EXIT_FAILED, EXIT_OK
from oddl.cli.shared import run_command_tree
from oddl.common.errors import SecurityError
from oddl.common.security.files import DEFAULT_CURVE_SERVERS, MANIFEST
from oddl.common.security.lab_ca import init_lab_ca
from oddl.common.security.ownership import service_keys

__all__ = ["cmd_chown", "cmd_init", "cmd_revoke", "cmd_rotate", "main", "register"]


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"bad list {text!r}; use comma-separated names, "
                                         "e.g. n0,n1,n2,n3")
    return names


def register(subparsers: Any) -> Any:
    """Add ``certs`` (init, revoke, rotate) to an argparse subparsers object; return its group."""
    certs = subparsers.add_parser("certs", help="lab CA, TLS certificates and CURVE keys")
    csub = certs.add_subparsers(dest="certs_cmd", required=True)
    init = csub.add_parser(
        "init", help="create a lab CA, certificates for the controller, operators and agents, "
        "and CURVE keys for the fabric and every node",
        description="Create a lab CA and the keys of a secure testbed in one directory "
        "(private keys 0600). Refuses an existing non-empty directory unless --force.")
    init.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    init.add_argument("--nodes", required=True, type=_names, metavar="N0,N1,...",
                      help="node ids of the testbed (one agent certificate and CURVE key each)")
    init.add_argument("--operators", type=_names, default=["operator"], metavar="NAME,...",
                      help="operator names (default: operator)")
    init.add_argument("--hosts", type=_names, default=["127.0.0.1", "localhost"],
                      metavar="HOST,...", help="IP addresses and DNS names of the controller "
                      "for its certificate (default: 127.0.0.1,localhost)")
    init.add_argument("--curve-servers", type=_names, default=list(DEFAULT_CURVE_SERVERS),
                      metavar="NAME,...", help="ZeroMQ servers that get a CURVE key pair "
                      "(default: fabric)")
    init.add_argument("--days", type=int, default=3650, help="validity (default %(default)s)")
    init.add_argument("--force", action="store_true",
                      help="replace the files of an earlier run in DIR (a new CA: every host "
                      "needs the new files)")
    init.add_argument("--json", action="store_true", help="print the manifest as JSON")
    _owner_option(init)
    init.set_defaults(func=cmd_init)

    rev = _identity_command(
        csub, "revoke", cmd_revoke,
        help="revoke a node's or an operator's certificate and CURVE key",
        description="Record the certificate serial and CURVE key of one identity in "
        "DIR/revoked.json: the controller refuses it at once, the fabric and the links at "
        "their next start. Copy the file to every host. `oddl certs rotate` issues new ones.")
    rev.add_argument("--reason", default="", help="recorded with the entry")
    rot = _identity_command(
        csub, "rotate", cmd_rotate,
        help="new certificate and CURVE key for a node or an operator (old revoked)",
        description="Issue a new certificate (same lab CA, needs tls/ca.key) and CURVE key pair "
        "for one identity, written over its files, and revoke the old ones. Copy the "
        "identity's files, manifest.json and revoked.json to the hosts, then restart that "
        "agent (or give the operator the new files).")
    _owner_option(rot)
    _register_chown(csub)
    return csub


def _register_chown(csub: Any) -> None:
    own = csub.add_parser(
        "chown", help="give the keys the services read to the service user (mode 0600)",
        description="Make the private keys the services read -- tls/server.key, "
        "tls/agent-NODE.key, curve/NODE.key_secret and the CURVE servers' secrets -- that are "
        "in DIR on this host owned by USER[:GROUP], mode 0600. The CA key and the operators' "
        "keys are left alone. Run it as root on every host after copying the files there.")
    own.add_argument("--certs", required=True, metavar="DIR", help="the `certs init` folder")
    own.add_argument("--owner", required=True, metavar="USER[:GROUP]",
                     help="the user the services run as (User= in deploy/systemd/), e.g. oddl")
    own.add_argument("--login-user-too", action="store_true",
                     help="hand the service keys to a login user all the same (a service run "
                     "under a person's account); without it such an owner is refused")
    own.set_defaults(func=cmd_chown)
    out = csub.add_parser(
        "hand-out", help="give one operator (a login user) their own key and certificate",
        description="Copy operator NAME's TLS certificate and key, CURVE pair, the CA "
        "certificate and a manifest naming only that operator into DEST (default "
        "~USER/.config/oddl/certs), all owned by USER, keys 0600. Nothing of the services' "
        "goes there. The operator then runs `oddl status --certs DEST` (or sets ODDL_CERTS).")
    out.add_argument("--certs", required=True, metavar="DIR", help="the `certs init` folder")
    out.add_argument("--operator", required=True, metavar="NAME", help="the operator's name "
                     "in the folder (certs init --operators)")
    out.add_argument("--to", required=True, metavar="USER", help="the operator's login user")
    out.add_argument("--dest", metavar="DEST", help="the folder to write (default "
                     "~USER/.config/oddl/certs)")
    out.set_defaults(func=cmd_hand_out)


def _owner_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--owner", metavar="USER[:GROUP]",
                        help="give the keys the services read (the controller's and agents' "
                        "TLS keys, the nodes' and the fabric's CURVE secrets) to this user, "
                        "mode 0600: the services run as User=oddl (deploy/systemd/), so run as "
                        "root with --owner oddl. The CA key and operators' keys stay yours")


def _resolved_owner(args: argparse.Namespace) -> Any:
    from oddl.common.security.ownership import resolve_owner

    return resolve_owner(args.owner) if getattr(args, "owner", None) else None


def _root_note(args: argparse.Namespace, root: str) -> None:
    """As root without --owner: say that the services cannot read the keys, and the fix."""
    if os.geteuid() == 0 and not getattr(args, "owner", None):
        print(f"note: the private keys in {root} are root's (0600); services that run as "
              "User=oddl (deploy/systemd/) cannot read them. Hand them over on each host: "
              f"sudo oddl certs chown --certs {root} --owner oddl (docs/explanation/security.md)",
              file=sys.stderr)


def cmd_chown(args: argparse.Namespace) -> int:
    """Give the service keys present here to the service user."""
    from oddl.common.security.files import SecurityFiles
    from oddl.common.security.handout import is_login_user
    from oddl.common.security.ownership import check_reachable, hand_over, service_keys

    owner = _resolved_owner(args)
    if is_login_user(owner.user) and not args.login_user_too:
        raise SecurityError(
            f"--owner {owner.user}: that is a login user, and `certs chown` gives away the "
            "services' keys (the controller's, every agent's, the CURVE servers'). Give them "
            "to the user the services run as (User= in deploy/systemd/, normally oddl). For an "
            f"operator's own key: sudo oddl certs hand-out --certs {args.certs} --operator "
            f"NAME --to {owner.user}")
    files = SecurityFiles.load(args.certs)
    check_reachable(files.root, owner)
    changed = hand_over(files.root, service_keys(files.manifest), owner)
    if not changed:
        print(f"no service key of {files.root / MANIFEST} is on this host; copy the host's "
              "files first (docs/explanation/security.md)", file=sys.stderr)
        return EXIT_FAILED
    for path in changed:
        print(f"  0600  {owner}  {path}")
    return EXIT_OK


def cmd_hand_out(args: argparse.Namespace) -> int:
    """Write one operator's own folder for their login user."""
    from pathlib import Path

    from oddl.common.security.files import SecurityFiles
    from oddl.common.security.handout import default_destination, hand_out
    from oddl.common.security.ownership import resolve_owner

    owner = resolve_owner(args.to)
    files = SecurityFiles.load(args.certs)
    dest = Path(args.dest) if args.dest else default_destination(owner.user)
    written = hand_out(files.root, files.manifest, args.operator, owner, dest)
    for path in written:
        print(f"  {path.stat().st_mode & 0o777:04o}  {owner}  {path}")
    print(f"{owner.user} runs the operator commands with: --certs {dest} (or ODDL_CERTS={dest});"
          f" the operator is {args.operator}")
    return EXIT_OK


def cmd_rotate(args: argparse.Namespace) -> int:
    """Rotate one identity's credentials; print what changed."""
    from oddl.common.revocation import rotate

    old = rotate(args.certs, node=args.node, operator=args.operator,
                 owner=_resolved_owner(args))
    print(f"rotated {old['kind']} {old['name']}: new certificate and CURVE key written to "
          f"{args.certs}; the old certificate {old['serial']} is revoked")
    if args.node:
        _root_note(args, args.certs)
    return EXIT_OK


def _identity_command(csub: Any, name: str, func: Callable[[argparse.Namespace], int], *,
                      help: str, description: str) -> argparse.ArgumentParser:
    """A ``certs`` subcommand about one identity: --certs DIR and exactly one of --node /
    --operator."""
    parser: argparse.ArgumentParser = csub.add_parser(name, help=help, description=description)
    parser.add_argument("--certs", required=True, metavar="DIR", help="the `certs init` folder")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--node", help="node id (its agent certificate and node key)")
    who.add_argument("--operator", help="operator name")
    parser.set_defaults(func=func)
    return parser


def cmd_revoke(args: argparse.Namespace) -> int:
    """Revoke one identity; print what was revoked."""
    from oddl.common.revocation import REVOKED, revoke

    entry = revoke(args.certs, node=args.node, operator=args.operator, reason=args.reason)
    print(f"revoked {entry['kind']} {entry['name']}: certificate {entry['serial']} and CURVE "
          f"key {entry['curve_public']} (in {args.certs}/{REVOKED}; copy it to every host)")
    return EXIT_OK


def cmd_init(args: argparse.Namespace) -> int:
    """Write the CA and keys; print what was written."""
    owner = _resolved_owner(args)
    files = init_lab_ca(args.out, args.nodes, operators=args.operators, hosts=args.hosts,
                        days=args.days, curve_servers=args.curve_servers, force=args.force,
                        owner=owner)
    _root_note(args, str(files.root))
    if args.json:
        print(json.dumps(dict(files.manifest), indent=2))
        return EXIT_OK
    m = files.manifest
    print(f"wrote a lab CA and keys to {files.root} (valid until {m['not_after'][:10]}):")
    handed = set(service_keys(m)) if owner is not None else set()
    for f in m["files"]:
        who = f"  (owner {owner})" if f["path"] in handed else ""
        print(f"  {f['mode']}  {f['path']:<36} {f['kind']}{who}")
    print(f"  0644  {MANIFEST:<36} manifest (subjects, CURVE public keys)")
    print(f"subjects: {m['subject_format']}; server certificate for {', '.join(files.hosts)}")
    print("copy to each host only what it needs: tls/ca.crt, manifest.json and its own "
          "certificate, key and CURVE pair; keep tls/ca.key off the testbed hosts")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``certs ...`` on its own (for tests and ``python -m oddl.cli.certs``)."""
    return run_command_tree(register, argv)


if __name__ == "__main__":
    sys.exit(main())
