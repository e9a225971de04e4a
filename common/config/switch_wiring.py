"""The circuit-switch side of a testbed file's wiring: hosts' fixed ports (``n0.p1.tx``,
``n0.p1.rx``) and the ports of an optical circuit switch (an N×N unit: ingress 1..N, egress
N+1..2N, as a Polatis unit numbers them; docs/reference/devices/ocs.md).

Every port end carries at most one fibre, a host port's transmitter goes into an ingress port
and its receiver hangs on an egress port, and a host port is wired both ways or not at all (a
spare). Errors name the key and the fix, like the rest of the file's checks.
"""

from __future__ import annotations

from oddl.common.config.reader import TableReader
from oddl.common.config.schema import (
    OCS,
    PORT_END,
    DeviceConfig,
    Endpoint,
    NodeConfig,
    TestbedConfig,
)


def node_port_endpoint(read: TableReader, key: str, node: NodeConfig, port: str) -> Endpoint:
    """``node.pK.tx`` / ``node.pK.rx``: a port the node has."""
    m = PORT_END.match(port)
    if m is None:
        raise read.fail(key, f"node {node.id!r} has no port {port!r}",
                        "use .tx or .rx (its tunable transmitter and receiver), or "
                        ".p<K>.tx / .p<K>.rx (its fixed ports)")
    k = int(m.group(1))
    if not 1 <= k <= node.ports:
        have = f"p1..p{node.ports}" if node.ports else "none"
        raise read.fail(key, f"node {node.id!r} has no port p{k} (its ports: {have})",
                        f"use an existing port or set ports = {k} on node {node.id}")
    return Endpoint(node.id, port)


def switch_endpoint(read: TableReader, key: str, dev: DeviceConfig, port: str) -> Endpoint:
    """``ocs.<port>``: a port of the N×N unit, 1..2N."""
    if not port.isdigit() or not 1 <= int(port) <= 2 * dev.size:
        raise read.fail(key, f"{dev.id} has no port {port!r} (a {dev.size}x{dev.size} unit: "
                        f"ingress 1..{dev.size}, egress {dev.size + 1}..{2 * dev.size})",
                        f"use a port of the unit or set size on {dev.id} to the unit's size")
    return Endpoint(dev.id, port)


def switch_fibre_problem(src: Endpoint, dst: Endpoint, devices: tuple[DeviceConfig, ...]
                         ) -> tuple[str, str] | None:
    """(problem, fix) of a fibre that touches a host port or a switch, or None when it is a
    legal one; raises nothing itself (the caller names the key)."""
    size = {d.id: d.size for d in devices if d.kind == OCS}
    if PORT_END.match(src.port) and src.port.endswith(".tx") and dst.owner in size:
        if int(dst.port) > size[dst.owner]:
            return (f"{src} goes into {dst}, an egress port",
                    f"a transmitter's fibre goes into an ingress port 1..{size[dst.owner]}")
        return None
    if src.owner in size and PORT_END.match(dst.port) and dst.port.endswith(".rx"):
        if int(src.port) <= size[src.owner]:
            return (f"{dst} hangs on {src}, an ingress port",
                    f"a receiver hangs on an egress port {size[src.owner] + 1}.."
                    f"{2 * size[src.owner]}")
        return None
    return (f"{src} → {dst} is not a fibre this testbed can have",
            "connect node.p<K>.tx → ocs.<ingress> and ocs.<egress> → node.p<K>.rx")


def touches_switch(src: Endpoint, dst: Endpoint, kinds: dict[str, str]) -> bool:
    """Whether a fibre has a host port or a circuit switch at either end."""
    return any(PORT_END.match(e.port) or kinds.get(e.owner) == OCS for e in (src, dst))


def check_port_wiring(read: TableReader, cfg: TestbedConfig) -> None:
    """Each port end and each switch port wired once; each host port both ways or not at all."""
    seen: dict[str, int] = {}
    for i, f in enumerate(cfg.fibres):
        for end in (f.src, f.dst):
            if not (PORT_END.match(end.port) or _is_switch(cfg, end.owner)):
                continue
            name = str(end)
            if name in seen:
                raise read.fail(f"fibres[{i}]", f"{name} is already wired by fibres[{seen[name]}]",
                                "a port carries one fibre; remove one of them or use another port")
            seen[name] = i
    for node in cfg.nodes:
        for k in range(1, node.ports + 1):
            tx, rx = f"{node.id}.p{k}.tx" in seen, f"{node.id}.p{k}.rx" in seen
            if tx != rx:
                have, missing = ("tx", "rx") if tx else ("rx", "tx")
                raise read.fail("fibres", f"port p{k} of {node.id} has a fibre on its {have} but "
                                f"none on its {missing}",
                                f"wire {node.id}.p{k}.{missing} too (a port is wired both ways, "
                                "or left as a spare with neither)")


def _is_switch(cfg: TestbedConfig, owner: str) -> bool:
    return any(d.id == owner and d.kind == OCS for d in cfg.devices)
