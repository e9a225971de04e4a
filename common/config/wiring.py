"""The ``[[nodes]]`` and ``[[fibres]]`` of a testbed file: each node's transmitter and receive
channel, the fibres between nodes, WSSs and meters, and the attachments they imply (one WSS
per node, one port per receiver, one receive channel per WSS). Hosts' fixed ports and the
circuit switches they hang on: `oddl.common.config.switch_wiring`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oddl.common.config import switch_wiring
from oddl.common.config.reader import REQUIRED, TableReader
from oddl.common.config.schema import (
    DeviceConfig,
    Endpoint,
    FibreConfig,
    GridConfig,
    NodeConfig,
    OptincDeviceConfig,
    TestbedConfig,
)


class WiringSections:
    """Reads ``[[nodes]]`` and ``[[fibres]]`` with `read`, against the devices already read."""

    def __init__(self, read: TableReader):
        self.read = read

    def nodes(self, raw: Any, grid: GridConfig, devices: tuple[DeviceConfig, ...]
              ) -> tuple[NodeConfig, ...]:
        """The nodes, each with its own transmitter (an itla) and receive channel."""
        out: list[NodeConfig] = []
        entries = self.read.array(raw, "nodes")
        if not entries:
            raise self.read.fail("nodes", "no nodes", "add at least two [[nodes]] entries")
        for i, entry in enumerate(entries):
            key = self.read.entry_key("nodes", i, entry)
            values = self.read.table(entry, key, {
                "id": (self.read.text(), REQUIRED), "host": (self.read.text(), "127.0.0.1"),
                "transmitter": (self.read.text(), ""),
                "rx_thz": (self.read.num(180.0, 200.0), None),
                "rx_channel": (self.read.integer(1), None),
                "data_port": (self.read.integer(0, 65535), 0),
                "ports": (self.read.integer(0, 64), 0)})
            if any(n.id == values["id"] for n in out):
                raise self.read.fail(f"{key}.id", f"duplicate node id {values['id']!r}",
                                     "give every node its own id")
            if not values["transmitter"]:
                out.append(self.switch_only_node(values, key))
                continue
            tx = values["transmitter"]
            match = [d for d in devices if d.id == tx]
            if not match:
                raise self.read.fail(f"{key}.transmitter",
                                     f"names device {tx!r}, which is not defined",
                                     "add a [[devices]] entry with that id and kind = \"itla\", "
                                     "or fix the name")
            if match[0].kind != "itla":
                raise self.read.fail(f"{key}.transmitter", f"{tx!r} is a {match[0].kind}, not a "
                                     "tunable transmitter", "name an itla device")
            channel = self.rx_channel(values, key, grid)
            out.append(NodeConfig(values["id"], values["host"], tx, channel, values["data_port"],
                                  values["ports"]))
        used: dict[str, str] = {}
        for n in out:
            if not n.transmitter:
                continue
            if n.transmitter in used:
                raise self.read.fail(f"nodes ({n.id}).transmitter",
                                     f"{n.transmitter!r} is already the "
                                     f"transmitter of {used[n.transmitter]}",
                                     "give every node its own transmitter")
            used[n.transmitter] = n.id
        return tuple(out)

    def switch_only_node(self, values: dict[str, Any], key: str) -> NodeConfig:
        """A host with fixed ports on circuit switches only (no tunable transmitter)."""
        if not values["ports"]:
            raise self.read.fail(key, "has neither a transmitter nor ports",
                                 'name its tunable transmitter (transmitter = "laser0", on a '
                                 "WSS) or give its fixed ports on a circuit switch (ports = 4)")
        if values["rx_thz"] is not None or values["rx_channel"] is not None:
            raise self.read.fail(key, "has a receive channel but no transmitter",
                                 "remove rx_thz/rx_channel (its ports' wavelengths are fixed) "
                                 "or name its tunable transmitter")
        return NodeConfig(values["id"], values["host"], "", 0, values["data_port"],
                          values["ports"])

    def rx_channel(self, values: dict[str, Any], key: str, grid: GridConfig) -> int:
        """A node's receive channel, from exactly one of rx_thz or rx_channel."""
        thz, ch = values["rx_thz"], values["rx_channel"]
        if (thz is None) == (ch is None):
            raise self.read.fail(key, "needs exactly one of rx_thz or rx_channel",
                                 "give the receiver's wavelength, e.g. rx_thz = 193.1")
        if ch is not None:
            if ch > grid.channels:
                raise self.read.fail(f"{key}.rx_channel", f"channel {ch} is off the grid "
                                     f"(1..{grid.channels})", "use a channel of the [grid]")
            return ch
        found = grid.channel_of(thz)
        if found is None:
            n = min(max(round((thz - grid.first_thz) * 1000 / grid.spacing_ghz) + 1, 1),
                    grid.channels)
            raise self.read.fail(f"{key}.rx_thz",
                                 f"{thz} THz is off the grid ({grid.first_thz} THz + "
                                 f"k × {grid.spacing_ghz} GHz, {grid.channels} channels)",
                                 f"use a grid frequency, e.g. {grid.frequency_thz(n):.4f} THz "
                                 f"(channel {n})")
        return found

    def endpoint(self, raw: Any, key: str, nodes: tuple[NodeConfig, ...],
                 devices: tuple[DeviceConfig, ...], optinc: Sequence[OptincDeviceConfig]
                 ) -> Endpoint:
        """One end of a fibre: a node's tx/rx, a WSS port or a meter channel (never one of
        the `optinc` devices, which hang on the emulated fabric)."""
        if not isinstance(raw, str) or "." not in raw:
            raise self.read.fail(key, f"{raw!r} is not an endpoint",
                                 'write "node.tx", "node.rx", "wss.in", "wss.<port>" or "meter.<channel>"')
        owner, _, port = raw.partition(".")
        node = next((n for n in nodes if n.id == owner), None)
        if node is not None:
            if port in ("tx", "rx"):
                if not node.transmitter:
                    raise self.read.fail(key, f"node {owner!r} has no tunable transmitter, so no "
                                         f".{port}", f"use one of its ports ({owner}.p1.{port})")
                return Endpoint(owner, port)
            return switch_wiring.node_port_endpoint(self.read, key, node, port)
        if "." in port and not any(d.id == owner for d in devices):
            owner, _, port = raw.rpartition(".")
        dev = next((d for d in devices if d.id == owner), None)
        if dev is None and any(d.id == owner for d in optinc):
            raise self.read.fail(key, f"{owner!r} is an OptINC device; it hangs on the emulated "
                                 "fabric, not on a fibre of this file", f"remove the fibre {raw!r}")
        if dev is None:
            raise self.read.fail(key, f"{owner!r} is neither a node nor a device",
                                 "name a node or device defined in this file")
        if dev.kind == "itla":
            raise self.read.fail(key, f"{owner!r} is a transmitter; fibres start at its node",
                                 f"write the node's .tx endpoint instead of {raw!r}")
        if dev.kind == "ocs":
            return switch_wiring.switch_endpoint(self.read, key, dev, port)
        if dev.kind == "wss":
            if port == "in" or (port.isdigit() and 1 <= int(port) <= dev.ports):
                return Endpoint(owner, port)
            raise self.read.fail(key, f"{dev.id} has no port {port!r} (ports: in, 1..{dev.ports})",
                                 "use an existing port or raise ports")
        if port.isdigit() and 1 <= int(port) <= dev.channels:
            return Endpoint(owner, port)
        raise self.read.fail(key, f"{dev.id} has no channel {port!r} (1..{dev.channels})",
                             "use an existing meter channel")

    def fibres(self, raw: Any, nodes: tuple[NodeConfig, ...], devices: tuple[DeviceConfig, ...],
               optinc: Sequence[OptincDeviceConfig] = ()) -> tuple[FibreConfig, ...]:
        """The fibres: node.tx → wss.in, wss.<port> → node.rx or meter.<channel>."""
        out: list[FibreConfig] = []
        for i, entry in enumerate(self.read.array(raw, "fibres")):
            key = f"fibres[{i}]"
            values = self.read.table(entry, key, {"from": (self.read.text(), REQUIRED),
                                                  "to": (self.read.text(), REQUIRED)})
            src = self.endpoint(values["from"], f"{key}.from", nodes, devices, optinc)
            dst = self.endpoint(values["to"], f"{key}.to", nodes, devices, optinc)
            kinds = {d.id: d.kind for d in devices}
            if switch_wiring.touches_switch(src, dst, kinds):
                problem = switch_wiring.switch_fibre_problem(src, dst, devices)
                if problem is not None:
                    raise self.read.fail(key, *problem)
                out.append(FibreConfig(src, dst))
                continue
            sk, dk = kinds.get(src.owner, "node"), kinds.get(dst.owner, "node")
            ok = ((sk == "node" and src.port == "tx" and dk == "wss" and dst.port == "in")
                  or (sk == "wss" and src.port != "in"
                      and ((dk == "node" and dst.port == "rx") or dk == "powermeter")))
            if not ok:
                raise self.read.fail(key, f"{src} → {dst} is not a fibre this testbed can have",
                                     "connect node.tx → wss.in, wss.<port> → node.rx, or "
                                     "wss.<port> → meter.<channel> (a monitor tap)")
            out.append(FibreConfig(src, dst))
        return tuple(out)

    def check_attachments(self, cfg: TestbedConfig) -> None:
        """Every node on one WSS (in and out), with its own port and channel on it."""
        tx_to: dict[str, str] = {}
        rx_from: dict[str, tuple[str, int]] = {}
        port_used: dict[tuple[str, int], str] = {}
        switch_wiring.check_port_wiring(self.read, cfg)
        for i, f in enumerate(cfg.fibres):
            if f.src.port == "tx":
                if f.src.owner in tx_to:
                    raise self.read.fail(f"fibres[{i}]", f"{f.src} already has a fibre",
                                         "a transmitter has one fibre; remove one of them")
                tx_to[f.src.owner] = f.dst.owner
            elif f.dst.port == "rx":
                if f.dst.owner in rx_from:
                    raise self.read.fail(f"fibres[{i}]", f"{f.dst} already has a fibre",
                                         "a receiver has one fibre; remove one of them")
                where = (f.src.owner, int(f.src.port))
                if where in port_used:
                    raise self.read.fail(f"fibres[{i}]",
                                         f"{f.src} already feeds {port_used[where]}.rx",
                                         "give every receiver its own WSS port")
                port_used[where] = f.dst.owner
                rx_from[f.dst.owner] = where
        wss_nodes = [n for n in cfg.nodes if n.on_wss]
        for n in wss_nodes:
            if n.id not in tx_to:
                raise self.read.fail("fibres", f"node {n.id} has no fibre from its transmitter",
                                     f'add [[fibres]] from = "{n.id}.tx", to = "<wss>.in"')
            if n.id not in rx_from:
                raise self.read.fail("fibres", f"node {n.id} has no fibre to its receiver",
                                     f'add [[fibres]] from = "<wss>.<port>", to = "{n.id}.rx"')
            if tx_to[n.id] != rx_from[n.id][0]:
                raise self.read.fail("fibres",
                                     f"node {n.id} transmits into {tx_to[n.id]} but receives "
                                     f"from {rx_from[n.id][0]}", "attach both to the same WSS")
        by_wss: dict[tuple[str, int], str] = {}
        for n in wss_nodes:
            key = (rx_from[n.id][0], n.rx_channel)
            if key in by_wss:
                raise self.read.fail(f"nodes ({n.id}).rx_channel",
                                     f"channel {n.rx_channel} is also "
                                     f"the receive channel of {by_wss[key]} on {key[0]}",
                                     "give every receiver on a WSS its own channel")
            by_wss[key] = n.id
            wss = cfg.device(rx_from[n.id][0])
            lo, hi = wss.channels_allowed
            if not lo <= n.rx_channel <= hi:
                raise self.read.fail(f"nodes ({n.id}).rx_channel",
                                     f"channel {n.rx_channel} is outside "
                                     f"{wss.id}.channels_allowed [{lo}, {hi}]",
                                     "pick an allowed channel or widen channels_allowed")
