"""An address a process cannot listen on, said in one line: which process, which address, where
the address comes from (the testbed file and key, or the option) and what to do.

A wrong node address (this host does not have it: EADDRNOTAVAIL) or a port another process
holds (EADDRINUSE) used to surface as a raw ``OSError`` traceback naming neither the node nor
the file. :func:`listen_error` turns the errno into a :class:`ConfigError` (exit code 2 in the
CLI); :func:`bind_errno` finds the errno when a library (gRPC) hides it.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from oddl.common.errors import ConfigError


@dataclass(frozen=True)
class ListenOrigin:
    """Who listens and where its address was set: `host_key` names the setting of the host
    (e.g. ``[[nodes]] host of node n2 in /etc/oddl/testbed.toml``), `port_key` that of the
    port (they are the same for a HOST:PORT option such as ``--metrics``)."""

    who: str
    host_key: str
    port_key: str
    where: str = ""
    """Both keys in a few words (default: the two keys)."""

    @classmethod
    def option(cls, who: str, option: str) -> ListenOrigin:
        """An address given as one HOST:PORT command-line option."""
        return cls(who, option, option)


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT``, ``[V6]:PORT`` or ``tcp://HOST:PORT``."""
    text = address.split("://", 1)[-1]
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        return host, int(port)
    except ValueError:
        raise ConfigError(f"bad address {address!r}: use HOST:PORT") from None


def listen_error(code: int | None, reason: str, address: str, origin: ListenOrigin
                 ) -> ConfigError:
    """The one-line error for a failed bind of `address` (errno `code`, text `reason`)."""
    host, port = split_address(address)
    if code == errno.EADDRNOTAVAIL:
        what = f"this host has no address {host} (EADDRNOTAVAIL)"
        fix = (f"set {origin.host_key} to an address of this host (`ip -brief address` lists "
               f"them), or run {origin.who} on the host that has {host}")
    elif code == errno.EADDRINUSE:
        what = f"port {port} on {host} is in use by another process (EADDRINUSE)"
        fix = (f"stop the process that holds it (`ss -ltnp 'sport = :{port}'` names it) or "
               f"choose another port in {origin.port_key}")
    elif code == errno.EACCES:
        what = f"port {port} needs privileges this process does not have (EACCES)"
        fix = f"choose a port from 1024 up in {origin.port_key}"
    else:
        what = reason or "the bind failed"
        fix = f"check {origin.host_key}" + ("" if origin.host_key == origin.port_key
                                             else f" and {origin.port_key}")
    where = origin.where or (origin.host_key if origin.host_key == origin.port_key
                             else f"{origin.host_key} / {origin.port_key}")
    return ConfigError(f"{origin.who}: cannot listen on {host}:{port} ({where}): {what}; {fix}")


def bind_errno(address: str) -> tuple[int | None, str]:
    """Try to bind `address` with a plain socket, to learn why a library could not: (errno,
    text), or (None, "") when it binds now."""
    host, port = split_address(address)
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return None, f"cannot resolve {host!r} ({exc.strerror})"
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
            probe.listen(1)
        except OSError as exc:
            return exc.errno, exc.strerror or str(exc)
    return None, ""
