"""`oddl config show`: what a testbed file wires, read from the file alone (no controller):
each host's transmitter and receiver on a WSS, each host port's ingress and egress on a
circuit switch, and the devices. `describe` is the data (``--json``), `format_wiring` the text."""

from __future__ import annotations

from typing import Any

from oddl.common.config import TestbedConfig


def describe(cfg: TestbedConfig) -> dict[str, Any]:
    """The file's wiring as plain data."""
    wss_hosts = [{"node": n.id, "host": n.host, "transmitter": n.transmitter,
                  "rx_channel": n.rx_channel,
                  "rx_thz": round(cfg.grid.frequency_thz(n.rx_channel), 4),
                  "wss": cfg.attachment(n.id).wss, "out_port": cfg.attachment(n.id).out_port}
                 for n in cfg.nodes if n.on_wss]
    ports = [{"node": pl.node, "port": pl.port, "switch": pl.switch, "ingress": pl.ingress,
              "egress": pl.egress} for pl in cfg.port_links()]
    devices = [{"id": d.id, "kind": d.kind, "resource": d.resource,
                **({"size": d.size} if d.kind == "ocs" else {}),
                **({"ports": d.ports} if d.kind == "wss" else {})} for d in cfg.devices]
    return {"testbed": cfg.name, "hosts": [n.id for n in cfg.nodes], "link": cfg.fabric.link,
            "line_rate_gbps": cfg.fabric.line_rate_gbps, "wss_hosts": wss_hosts,
            "switch_ports": ports, "devices": devices}


def format_wiring(view: dict[str, Any]) -> str:
    """The wiring as text tables."""
    lines = [f"testbed {view['testbed']}: {len(view['hosts'])} hosts, {view['link']} link, "
             f"{view['line_rate_gbps']:g} Gbit/s per transceiver"]
    if view["wss_hosts"]:
        lines += ["", f"{'host':<6} {'address':<15} {'transmitter':<12} {'rx ch':>5} "
                      f"{'rx THz':>9} {'wss':<6} {'port':>4}"]
        lines += [f"{h['node']:<6} {h['host']:<15} {h['transmitter']:<12} {h['rx_channel']:>5} "
                  f"{h['rx_thz']:>9.4f} {h['wss']:<6} {h['out_port']:>4}"
                  for h in view["wss_hosts"]]
    if view["switch_ports"]:
        lines += ["", f"{'host':<6} {'port':<5} {'switch':<8} {'ingress':>7} {'egress':>7}"]
        lines += [f"{p['node']:<6} {'p' + str(p['port']):<5} {p['switch']:<8} "
                  f"{p['ingress']:>7} {p['egress']:>7}" for p in view["switch_ports"]]
    lines += ["", f"{'device':<8} {'kind':<11} resource"]
    lines += [f"{d['id']:<8} {d['kind']:<11} {d['resource']}" for d in view["devices"]]
    return "\n".join(lines)
