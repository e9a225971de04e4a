"""The optical circuit switches in the device transaction
(docs/decisions/0028-ocs-in-the-device-transaction.md).

A switch's part of a `Configuration` is its whole connection table, {ingress: egress}. A change
names some ingress ports (egress 0: disconnect); a transaction touches only those ports: it
reads the switch's table, disconnects the named ports whose egress changes
(``CONNect:SUBtract``), connects the new pairs (``CONNect:ADD``) and reads the table back.
The connections of ports it does not name (other jobs' circuits) are never sent a command.
A roll-back sets the same ports back to the last verified table the same way.

The checks made before anything is sent (`check_connections`) name the switch, the port and
the fix. The functions here are the device manager's (``oddl.controller.devices``); they take
the driver and a timing hook and hold no state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from oddl.common.config import TestbedConfig
from oddl.common.errors import ConfigError, OddlError, SafetyLimitError

__all__ = ["SwitchSteps", "check_connections", "describe_ports", "named_ports", "set_ports",
           "switch_power", "table_problems"]

Timed = Callable[[str, str, Callable[[], Any]], Any]
"""The device manager's `timed(device, op, call)`: the command's time to the metrics."""


def named_ports(change_connections: Mapping[str, Mapping[int, int]]) -> dict[str, list[int]]:
    """The ingress ports a change names, per switch (those a transaction may touch)."""
    return {s: sorted(table) for s, table in change_connections.items()}


def check_connections(cfg: TestbedConfig, connections: Mapping[str, Mapping[int, int]]) -> None:
    """Raise SafetyLimitError naming the switch, the port and the fix; nothing is sent.

    Ingress ports must be 1..N, egress ports N+1..2N (or 0 in a change: disconnect), and no
    egress port may take two connections."""
    for switch, table in connections.items():
        size = _size_of(cfg, switch)
        users: dict[int, int] = {}
        for ingress, egress in sorted(table.items()):
            _check_ingress(switch, size, ingress)
            if egress == 0:
                continue
            _check_egress(switch, size, ingress, egress)
            if egress in users:
                raise SafetyLimitError(
                    f"{switch}: egress port {egress} is asked of ingress {users[egress]} and "
                    f"ingress {ingress}; an egress port takes one connection: disconnect "
                    f"ingress {users[egress]} in the same change (--disconnect "
                    f"{users[egress]}) or pick another egress port")
            users[egress] = ingress


def _size_of(cfg: TestbedConfig, switch: str) -> int:
    try:
        dev = cfg.device(switch)
    except ConfigError:
        known = ", ".join(d.id for d in cfg.devices_of("ocs")) or "none"
        raise SafetyLimitError(f"{switch!r} is not a circuit switch of the testbed "
                               f"{cfg.name} (its circuit switches: {known}); name one of "
                               "them") from None
    if dev.kind != "ocs":
        raise SafetyLimitError(f"{switch} is a {dev.kind}, not a circuit switch (ocs)")
    return dev.size


def _check_ingress(switch: str, size: int, ingress: int) -> None:
    if 1 <= ingress <= size:
        return
    if size < ingress <= 2 * size:
        raise SafetyLimitError(f"{switch}: port {ingress} is an egress port, not an ingress "
                               f"port (a {size}x{size} unit: ingress 1..{size}, egress "
                               f"{size + 1}..{2 * size}); give the connection as IN:OUT with "
                               "the ingress port first")
    raise SafetyLimitError(f"{switch}: ingress port {ingress} does not exist (a {size}x{size} "
                           f"unit: ingress 1..{size}, egress {size + 1}..{2 * size}); use a "
                           "port of the unit or fix size in the testbed file")


def _check_egress(switch: str, size: int, ingress: int, egress: int) -> None:
    if size < egress <= 2 * size:
        return
    if 1 <= egress <= size:
        raise SafetyLimitError(f"{switch}: port {egress} asked as the egress of ingress "
                               f"{ingress} is an ingress port; an ingress connects to an "
                               f"egress port {size + 1}..{2 * size} (IN:OUT, ingress first)")
    raise SafetyLimitError(f"{switch}: egress port {egress} (for ingress {ingress}) does not "
                           f"exist (a {size}x{size} unit: egress {size + 1}..{2 * size}); use "
                           "a port of the unit or fix size in the testbed file")


class SwitchSteps:
    """What setting some ingress ports of a switch to a table takes: the ports to disconnect
    and the pairs to connect, from the table the switch holds now."""

    def __init__(self, holds: Mapping[int, int], wanted: Mapping[int, int],
                 ports: Iterable[int]) -> None:
        ports = sorted(set(ports))
        self.disconnect = [i for i in ports
                           if i in holds and holds[i] != wanted.get(i)]
        self.connect = {i: wanted[i] for i in ports
                        if i in wanted and holds.get(i) != wanted[i]}

    def __bool__(self) -> bool:
        return bool(self.disconnect or self.connect)

    def describe(self) -> str:
        """E.g. 'disconnect 3; connect 1→53 2→54' (or 'no change')."""
        parts = []
        if self.disconnect:
            parts.append("disconnect " + " ".join(map(str, self.disconnect)))
        if self.connect:
            parts.append("connect " + " ".join(f"{i}→{e}" for i, e in self.connect.items()))
        return "; ".join(parts) or "no change"


def set_ports(switch: str, drv: Any, wanted: Mapping[int, int],
              ports: Iterable[int], timed: Timed) -> tuple[SwitchSteps, dict[int, int]]:
    """Set `ports` (ingress) of `switch` as `wanted` says (absent: unconnected), leaving every
    other port; return the steps taken and the table read back afterwards. `drv` is a
    `PolatisOcs` (``connections``, ``disconnect``, ``connect``)."""
    holds: dict[int, int] = timed(switch, "read", drv.connections)
    steps = SwitchSteps(holds, wanted, ports)
    if steps.disconnect:
        timed(switch, "disconnect", lambda: drv.disconnect(steps.disconnect))
    if steps.connect:
        timed(switch, "connect", lambda: drv.connect(steps.connect))
    after: dict[int, int] = timed(switch, "read", drv.connections)
    return steps, after


def switch_power(drv: Any, table: Mapping[int, int]) -> dict[int, float]:
    """The monitors of the connected ports in one query; {} when the unit has none."""
    try:
        return dict(drv.port_power(sorted({*table, *table.values()}))) if table else {}
    except OddlError:
        return {}


def table_problems(switch: str, wanted: Mapping[int, int], reads: Mapping[int, int]
                   ) -> list[str]:
    """One line per ingress port whose read-back differs from `wanted` (the whole table)."""
    return [f"{switch} ingress {i}: wanted {_end(wanted.get(i))}, reads {_end(reads.get(i))}"
            for i in sorted(set(wanted) | set(reads)) if wanted.get(i) != reads.get(i)]


def _end(egress: int | None) -> str:
    return f"egress {egress}" if egress is not None else "unconnected"


def describe_ports(cfg: TestbedConfig, switch: str, change: Mapping[int, int],
                   before: Mapping[int, int]) -> list[str]:
    """One line per named ingress port for people, naming the host ports on both sides, e.g.
    'ocs0: ingress 1 (n0.p1) → egress 53 (n1.p1), was unconnected'."""
    hosts_in = {pl.ingress: f"{pl.node}.p{pl.port}" for pl in cfg.port_links()
                if pl.switch == switch}
    hosts_out = {pl.egress: f"{pl.node}.p{pl.port}" for pl in cfg.port_links()
                 if pl.switch == switch}

    def name(port: int | None, hosts: dict[int, str]) -> str:
        if port is None:
            return "unconnected"
        return f"{port} ({hosts[port]})" if port in hosts else str(port)

    lines = []
    for ingress, egress in sorted(change.items()):
        was = before.get(ingress)
        now = None if egress == 0 else egress
        lines.append(f"{switch}: ingress {name(ingress, hosts_in)} → "
                     f"{'egress ' + name(now, hosts_out) if now else 'disconnected'}, was "
                     f"{'egress ' + name(was, hosts_out) if was else 'unconnected'}")
    return lines
