"""What a testbed wires, as text: the hosts on WSS ports, the host ports on circuit switches and
the devices. `oddl topology` draws a running controller's view with these tables, and `oddl
config show` draws a testbed file alone (`describe` is its data, ``--json``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from oddl.common.config import TestbedConfig


def wss_host_table(nodes: Iterable[Mapping[str, Any]], first_thz: float,
                   spacing_ghz: float) -> list[str]:
    """Hosts on a WSS (``id, host, transmitter, rx_channel, wss, out_port``), a line each."""
    lines = [f"{'node':<6} {'host':<15} {'transmitter':<12} {'rx ch':>5} {'rx THz':>9} "
             f"{'wss':<6} {'port':>4}"]
    for n in nodes:
        ch = int(n["rx_channel"])
        lines.append(f"{n['id']:<6} {n['host']:<15} {n['transmitter']:<12} {ch:>5} "
                     f"{first_thz + (ch - 1) * spacing_ghz / 1000:>9.4f} {n['wss']:<6} "
                     f"{int(n['out_port']):>4}")
    return lines


def device_table(devices: Iterable[Mapping[str, Any]]) -> list[str]:
    """Devices (``id, kind, resource``), a line each."""
    return [f"{'device':<8} {'kind':<11} resource"] + [
        f"{d['id']:<8} {d['kind']:<11} {d['resource']}" for d in devices]


def describe(cfg: TestbedConfig) -> dict[str, Any]:
    """A testbed file's wiring as plain data."""
    wss_hosts = [{"id": n.id, "host": n.host, "transmitter": n.transmitter,
                  "rx_channel": n.rx_channel, "wss": cfg.attachment(n.id).wss,
                  "out_port": cfg.attachment(n.id).out_port}
                 for n in cfg.nodes if n.on_wss]
    ports = [{"node": pl.node, "port": pl.port, "switch": pl.switch, "ingress": pl.ingress,
              "egress": pl.egress} for pl in cfg.port_links()]
    devices = [{"id": d.id, "kind": d.kind, "resource": d.resource,
                **({"size": d.size} if d.kind == "ocs" else {}),
                **({"ports": d.ports} if d.kind == "wss" else {})} for d in cfg.devices]
    return {"testbed": cfg.name, "hosts": [n.id for n in cfg.nodes], "link": cfg.fabric.link,
            "line_rate_gbps": cfg.fabric.line_rate_gbps, "grid_first_thz": cfg.grid.first_thz,
            "grid_spacing_ghz": cfg.grid.spacing_ghz, "wss_hosts": wss_hosts,
            "switch_ports": ports, "devices": devices}


def format_wiring(view: dict[str, Any]) -> str:
    """`describe`'s data as text tables."""
    lines = [f"testbed {view['testbed']}: {len(view['hosts'])} hosts, {view['link']} link, "
             f"{view['line_rate_gbps']:g} Gbit/s per transceiver"]
    if view["wss_hosts"]:
        lines += ["", *wss_host_table(view["wss_hosts"], view["grid_first_thz"],
                                      view["grid_spacing_ghz"])]
    if view["switch_ports"]:
        lines += ["", f"{'node':<6} {'port':<5} {'switch':<8} {'ingress':>7} {'egress':>7}"]
        lines += [f"{p['node']:<6} {'p' + str(p['port']):<5} {p['switch']:<8} "
                  f"{p['ingress']:>7} {p['egress']:>7}" for p in view["switch_ports"]]
    return "\n".join([*lines, "", *device_table(view["devices"])])
