"""`oddl watch`: a live terminal view of the testbed — agents, jobs, circuits, devices.

Refreshes from the controller every `--interval` seconds with rich; `--once` prints one frame
(for scripts, logs and tests).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, ConsoleRenderable, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from oddl.common.errors import ControllerUnavailable
from oddl.operator.client import (
    OperatorClient,
    clock_bound_text,
    clock_time,
    connections_text,
    heartbeat_age,
    host_ports,
)


def _agents(status: dict[str, Any]) -> Table:
    t = Table(title="agents", expand=True)
    for col in ("node", "alive", "heartbeat", "clock offset", "± bound", "gate p50", "gate p99",
                "done", "failed"):
        t.add_column(col, justify="right" if col not in ("node", "alive") else "left")
    for a in status.get("agents", []):
        alive = Text("yes", style="green") if a["alive"] else Text("NO", style="bold red")
        t.add_row(a["node_id"], alive, heartbeat_age(a, digits=1),
                  f"{a['clock_offset_s'] * 1e6:.1f} µs",
                  clock_bound_text(a.get("clock_error_bound_s")),
                  f"{a['gate_error_p50_s'] * 1e6:.1f} µs",
                  f"{a['gate_error_p99_s'] * 1e6:.1f} µs", str(int(a["collectives_done"])),
                  str(int(a["collectives_failed"])))
    return t


def _jobs(status: dict[str, Any]) -> Table:
    t = Table(title="jobs", expand=True)
    for col in ("job", "state", "collective", "network", "nodes", "done", "retunes", "guard"):
        t.add_column(col)
    for j in status.get("jobs", [])[-6:]:
        style = "green" if j["state"] == "running" else "dim"
        t.add_row(j["id"], Text(j["state"], style=style), j["collective"], j["network"],
                  ",".join(j["nodes"]), str(int(j["collectives_done"])),
                  str(int(j["reconfigurations"])), f"{float(j['guard_time_s']) * 1e3:.2f} ms")
    return t


def _circuits(topology: dict[str, Any], devices: dict[str, Any]) -> Table:
    """Where each transmitter's light goes now, from the read-back device state."""
    t = Table(title="circuits (from device read-back)", expand=True)
    for col in ("transmitter", "node", "channel", "THz", "dBm", "lock", "→ WSS port", "→ node"):
        t.add_column(col)
    by_id = {d["id"]: d for d in devices.get("devices", [])}
    nodes = topology.get("nodes", [])
    port_node = {(n["wss"], int(n["out_port"])): n["id"] for n in nodes}
    for n in (n for n in nodes if n.get("transmitter")):  # hosts with a tunable laser
        d = by_id.get(n["transmitter"], {})
        if not d.get("reachable"):
            t.add_row(n["transmitter"], n["id"], "?", "", "", Text("unreachable", style="red"),
                      "", "")
            continue
        ch = int(d["channel"])
        routes = {int(r["channel"]): r for r in by_id.get(n["wss"], {}).get("routes", [])}
        r = routes.get(ch)
        port = int(r["port"]) if r and float(r["attenuation_db"]) < 99 else 0
        dst = port_node.get((n["wss"], port), "—") if port and d["output_enabled"] else "—"
        lock = Text("locked", style="green") if d["locked"] else Text("no lock", style="red")
        t.add_row(n["transmitter"], n["id"], str(ch), f"{float(d['frequency_thz']):.4f}",
                  f"{float(d['power_dbm']):.1f}", lock, str(port or "blocked"), dst)
    return t


def _switches(topology: dict[str, Any], devices: dict[str, Any]) -> Table:
    """Each circuit switch's connections as read back, naming the host port on each side."""
    t = Table(title="circuit switches (from device read-back)", expand=True)
    t.add_column("switch")
    t.add_column("connections", overflow="fold")
    hosts = host_ports(topology)
    for d in devices.get("devices", []):
        if d["kind"] != "ocs":
            continue
        if not d["reachable"]:
            t.add_row(d["id"], Text(f"unreachable: {d.get('error', '')}", style="red"))
            continue
        conns = d.get("connections", [])
        t.add_row(f"{d['id']} ({len(conns)})", connections_text(conns, hosts, d["id"]))
    return t


def _meters(devices: dict[str, Any]) -> Table:
    t = Table(title="power meters", expand=True)
    t.add_column("meter")
    t.add_column("readings")
    for d in devices.get("devices", []):
        if d["kind"] == "powermeter":
            t.add_row(d["id"], "  ".join(
                f"{int(m['channel'])}: " + (f"{float(m['power_dbm']):.1f} dBm" if m["light"]
                                            else "dark") for m in d.get("meter", [])))
    return t


def _log(entries: list[dict[str, Any]]) -> Table:
    t = Table(title="device log", expand=True)
    for col in ("time", "device", "ok", "action", "detail"):
        t.add_column(col, overflow="fold")
    for e in entries:
        t.add_row(clock_time(e["time_ns"]), e["device"], Text("ok", style="green") if e["ok"]
                  else Text("ERR", style="bold red"), e["action"], e["detail"][:80])
    return t


def frame(client: OperatorClient) -> Group:
    """One screen of the live view."""
    try:
        status, topology = client.status(), client.topology()
        devices, log = client.devices(), client.device_log(limit=8)
    except ControllerUnavailable as exc:
        return Group(Panel(Text(str(exc), style="bold red"), title="oddl watch"))
    head = Text(f"oddl watch — testbed {status.get('testbed')} at {client.address} — "
                f"{time.strftime('%H:%M:%S')} — {int(status.get('reconfigurations', 0))} retunes, "
                f"{int(status.get('transactions_failed', 0))} failed transactions", style="bold")
    parts: list[ConsoleRenderable] = [head, _agents(status), _jobs(status)]
    if any(n.get("transmitter") for n in topology.get("nodes", [])):
        parts.append(_circuits(topology, devices))
    if any(d["kind"] == "ocs" for d in devices.get("devices", [])):
        parts.append(_switches(topology, devices))
    if any(d["kind"] == "powermeter" for d in devices.get("devices", [])):
        parts.append(_meters(devices))
    return Group(*parts, _log(log))


def watch(client: OperatorClient, interval: float = 1.0, once: bool = False,
          console: Console | None = None) -> int:
    """Show the live view until Ctrl-C (or one frame with `once`)."""
    console = console or Console()
    if once:
        console.print(frame(client))
        return 0
    try:
        with Live(frame(client), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(frame(client))
    except KeyboardInterrupt:
        return 0
