"""The agent's data plane links, chosen from the testbed file.

`[fabric] link = "direct"`: host-to-host TCP streams (`StreamLink`, authenticated in secure
mode) or, with `transport = "curve"`, encrypted ZeroMQ (`DirectLink`). `link = "fabric"` (the
emulated testbed): frames relayed through the fabric process (`FabricLink`), which also
carries the OptINC device's traffic, or TCP streams on the emulator host's light table
(`LightPhy`) when it publishes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oddl.agents.links.light_phy import LightPhy
from oddl.agents.links.stream_auth import StreamAuth
from oddl.agents.links.streams import StreamLink
from oddl.agents.links.zeromq import DirectLink, FabricLink
from oddl.common.config import TestbedConfig
from oddl.common.errors import ConfigError, OddlError
from oddl.common.lighttable import LightTable, rows_of
from oddl.common.security.revoked import read_revoked

DataLink = StreamLink | DirectLink | FabricLink


@dataclass
class DataLinks:
    """The link collectives move over, and the fabric link to devices (OptINC), if any."""

    link: DataLink
    device_link: FabricLink | None = None

    @property
    def phy(self) -> LightPhy | None:
        """The emulated physical layer the streams run on, if any."""
        return getattr(self.link, "phy", None)

    @property
    def address(self) -> str:
        """The address peers reach this agent at (direct links), else empty."""
        return getattr(self.link, "address", "")

    @property
    def data_path(self) -> str:
        """How this agent's collective data moves, in words."""
        if isinstance(self.link, StreamLink):
            where = "tcp streams on the emulated light" if self.phy else "tcp streams"
            return f"{where}, authenticated" if self.link.auth is not None else where
        if isinstance(self.link, FabricLink):
            return "relay through the fabric process"
        return "zeromq with curve"

    @property
    def misrouted(self) -> int:
        """Frames or chunks that arrived here although meant for another node."""
        if isinstance(self.link, StreamLink):
            return self.link.misrouted
        return self.link.inbox.misrouted

    def set_peers(self, peers: dict[str, str]) -> None:
        """The peers' data addresses (direct links; the fabric knows its own)."""
        if hasattr(self.link, "set_peers"):
            self.link.set_peers(peers)

    def forget(self, job_id: str, seq: int | None = None) -> None:
        """Drop what the links hold for a job: one collective's frames (`seq`), or the whole
        job's streams, threads and buffers once it ended."""
        if seq is None:
            if isinstance(self.link, StreamLink):
                self.link.forget_job(job_id)
            return
        for link in {id(self.link): self.link, id(self.device_link): self.device_link}.values():
            if isinstance(link, DirectLink | FabricLink):
                link.inbox.discard(job_id, seq)

    def reset_peer(self, peer: str) -> None:
        """Drop the streams to a peer that came back (`StreamLink.reset_peer`); the other
        links reconnect by themselves."""
        if isinstance(self.link, StreamLink):
            self.link.reset_peer(peer)

    def close(self) -> None:
        """Close the links."""
        self.link.close()
        if self.device_link is not None and self.device_link is not self.link:
            self.device_link.close()


def open_links(cfg: TestbedConfig, node_id: str, bind: str, security: Any) -> DataLinks:
    """The links the testbed file asks for (see the module docstring)."""
    if cfg.fabric.link == "direct" and cfg.fabric.transport == "curve":
        if security is None:
            raise ConfigError('[fabric] transport = "curve" encrypts the direct links '
                              "with the lab's CURVE keys: set [security] certs, or use "
                              'transport = "streams"')
        return DataLinks(DirectLink(node_id, bind, security=security))  # encrypted, ZeroMQ
    if cfg.fabric.link == "direct":
        return DataLinks(StreamLink(node_id, bind, auth=stream_auth(cfg, node_id, security)))
    if not cfg.fabric.address:
        raise OddlError("the testbed file has no [fabric] address; start the emulated "
                        "testbed with `oddl emulate testbed` and use its resolved file")
    curve = None if security is None else (security.curve_keys(node_id),
                                           security.curve_public("fabric"))
    fabric = FabricLink(node_id, cfg.fabric.address, curve=curve)
    phy = light_phy(cfg, node_id) if security is None else None
    if phy is not None:
        return DataLinks(StreamLink(node_id, bind, phy=phy), fabric)
    return DataLinks(fabric, fabric)


def stream_auth(cfg: TestbedConfig, node_id: str, security: Any) -> StreamAuth | None:
    """The nodes' CURVE keys for authenticated streams (secure mode), else None."""
    if security is None:
        return None
    peers = {n.id: security.curve_public(n.id) for n in cfg.nodes}
    keys = security.curve_keys(node_id)
    return StreamAuth(node_id, keys.secret, peers, revoked=set(read_revoked(security.root).keys))


def light_phy(cfg: TestbedConfig, node_id: str) -> LightPhy | None:
    """The emulated physical layer on the emulator host's light table, or None when the
    frames go through the fabric process (`transport = "relay"`, or an emulator host that
    publishes no table). Every agent of a testbed must take the same path, so a table that
    cannot be opened is an error, not a quiet fallback."""
    if cfg.fabric.transport != "streams" or not cfg.fabric.light_table:
        return None
    try:
        table = LightTable.open(cfg.fabric.light_table)
    except (OSError, ValueError) as exc:
        raise OddlError(f"{node_id}: cannot open the emulator host's light table "
                        f"{cfg.fabric.light_table} ({exc}); run the agents on the emulator "
                        "host's machine with its resolved testbed file, or set [fabric] "
                        'transport = "relay" for agents elsewhere') from exc
    try:
        return LightPhy(table, [n.id for n in cfg.nodes], node_id,
                        cfg.fabric.line_rate_gbps * 1e9, rows=rows_of(cfg))
    except ValueError as exc:
        table.close()
        raise OddlError(str(exc)) from exc
