"""The operator's client of the controller API, and the tables the CLI prints."""

from __future__ import annotations

import math
import time
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from oddl.common.errors import ControllerUnavailable, OperationRefused
from oddl.drivers.interfaces import BLOCKED_DB, BLOCKED_PORT
from oddl.operator.wiring import device_table, wss_host_table
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

_REFUSALS = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
             grpc.StatusCode.ABORTED, grpc.StatusCode.UNAUTHENTICATED)


def _as_dict(msg: Any) -> dict[str, Any]:
    return MessageToDict(msg, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)


class OperatorClient:
    """Calls the controller and turns gRPC failures into typed errors with a fix."""

    def __init__(self, address: str, timeout_s: float = 10.0, certs: str = "",
                 operator: str = "operator"):
        """`certs`: the folder of `oddl certs init` (mutual TLS as `operator`), or ""."""
        self.address = address
        self.timeout_s = timeout_s
        if certs:
            from oddl.common.security.files import SecurityFiles
            from oddl.common.security.tls import secure_channel, tls_channel_credentials

            files = SecurityFiles.load(certs)
            self._channel = secure_channel(address,
                                           tls_channel_credentials(files.operator_tls(operator)))
        else:
            self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.ControllerStub(self._channel)

    def _call(self, name: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return getattr(self._stub, name)(request, timeout=timeout or self.timeout_s)
        except grpc.RpcError as exc:
            code, detail = exc.code(), exc.details()
            if code in _REFUSALS:
                raise OperationRefused(detail) from exc
            raise ControllerUnavailable(
                f"the controller at {self.address} did not answer ({code.name}: {detail}); "
                "check the address (--controller / ODDL_CONTROLLER) and that "
                "`oddl controller serve` is running") from exc

    def status(self) -> dict[str, Any]:
        """Agents, jobs and counters; an agent that never registered has
        ``last_heartbeat_age_s`` None (the wire's -1)."""
        return registered_ages(_as_dict(self._call("GetStatus", pb.GetStatusRequest())))

    def topology(self) -> dict[str, Any]:
        """Nodes, devices and the grid."""
        return _as_dict(self._call("GetTopology", pb.GetTopologyRequest()))

    def devices(self) -> dict[str, Any]:
        """Every device read back now."""
        return _as_dict(self._call("GetDeviceState", pb.GetDeviceStateRequest()))

    def jobs(self) -> list[dict[str, Any]]:
        """All jobs."""
        return _as_dict(self._call("ListJobs", pb.ListJobsRequest())).get("jobs", [])

    def submit(self, name: str, nodes: list[str], collective: str, network: str,
               params: dict[str, str] | None = None) -> dict[str, Any]:
        """Submit a job; returns it."""
        req = pb.SubmitJobRequest(name=name, nodes=nodes, collective=collective,
                                  network=network, params=params or {})
        return _as_dict(self._call("SubmitJob", req, timeout=60))

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job; returns it."""
        return _as_dict(self._call("CancelJob", pb.CancelJobRequest(job_id=job_id)))

    def schedule(self, job_id: str, message_bytes: int, itemsize: int = 4,
                 kind: str = "all_reduce", root: int = 0) -> pb.Schedule:
        """The schedule a job's collective `kind` gets for `message_bytes`."""
        return self._call("GetSchedule", pb.GetScheduleRequest(
            job_id=job_id, message_bytes=message_bytes, itemsize=itemsize, kind=kind,
            root=root))

    def device_log(self, limit: int = 100, device: str = "") -> list[dict[str, Any]]:
        """The newest device-log entries."""
        reply = self._call("GetDeviceLog", pb.GetDeviceLogRequest(limit=limit, device=device))
        return _as_dict(reply).get("entries", [])

    def reconfigure(self, change: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        """Apply (or preview) one operator change."""
        req = pb.ReconfigureRequest(dry_run=dry_run, **{k: v for k, v in change.items()})
        return _as_dict(self._call("Reconfigure", req, timeout=60))

    def set_trace(self, on: bool, directory: str = "", buffer_events: int = 0) -> dict[str, Any]:
        """Start (`on`) or stop recording at the controller and every agent."""
        req = pb.SetTraceRequest(on=on, dir=directory, buffer_events=buffer_events)
        return _as_dict(self._call("SetTrace", req, timeout=120))

    def close(self) -> None:
        """Release the channel."""
        self._channel.close()


NEVER_REGISTERED = "never registered"


def registered_ages(status: dict[str, Any]) -> dict[str, Any]:
    """`status` with the heartbeat age of each agent that never registered (the controller
    sends -1) as None: `--json` says null, the tables "never registered"."""
    for a in status.get("agents", []):
        if a.get("last_heartbeat_age_s", 0) < 0:
            a["last_heartbeat_age_s"] = None
    return status


def heartbeat_age(agent: dict[str, Any], digits: int = 2) -> str:
    """"0.42s", or "never registered"."""
    age = agent.get("last_heartbeat_age_s")
    return NEVER_REGISTERED if age is None else f"{age:.{digits}f}s"


def format_status(status: dict[str, Any]) -> str:
    """A table for people."""
    lines = [f"testbed {status.get('testbed', '?')}: {status.get('reconfigurations', 0)} "
             f"reconfigurations, {status.get('transactions_failed', 0)} failed transactions", "",
             f"{'node':<6} {'alive':<6} {'hb age':>16} {'offset':>10} {'± bound':>9} "
             f"{'gate p50':>10} {'gate p99':>10} {'link':>11} {'done':>6} {'failed':>6}"]
    for a in status.get("agents", []):
        lines.append(f"{a['node_id']:<6} {'yes' if a['alive'] else 'NO':<6} "
                     f"{heartbeat_age(a):>16} {a['clock_offset_s'] * 1e6:>8.1f}µs "
                     f"{clock_bound_text(a.get('clock_error_bound_s')):>9} "
                     f"{a['gate_error_p50_s'] * 1e6:>8.1f}µs {a['gate_error_p99_s'] * 1e6:>8.1f}µs "
                     f"{link_rate_text(a.get('measured_line_rate_gbps')):>11} "
                     f"{int(a['collectives_done']):>6} {int(a['collectives_failed']):>6}")
    lines += ["", format_jobs(status.get("jobs", []))]
    return "\n".join(lines)


def clock_bound_text(bound_s: Any) -> str:
    """An agent's clock error bound for people ("unknown" before its first sample)."""
    try:
        value = float(bound_s)
    except (TypeError, ValueError):
        return "unknown"
    return f"{value * 1e6:.1f}µs" if math.isfinite(value) else "unknown"


def link_rate_text(gbps: Any) -> str:
    """What an agent measured its direct links to carry ("-": not measured)."""
    value = float(gbps or 0.0)
    return f"{value:.3g} Gbit/s" if value > 0 else "-"


def format_jobs(jobs: list[dict[str, Any]]) -> str:
    """Jobs as a table."""
    if not jobs:
        return "no jobs"
    lines = [f"{'job':<8} {'state':<10} {'collective':<18} {'network':<8} {'nodes':<16} "
             f"{'done':>6} {'retunes':>8}"]
    for j in jobs:
        lines.append(f"{j['id']:<8} {j['state']:<10} {j['collective']:<18} {j['network']:<8} "
                     f"{','.join(j['nodes']):<16} {int(j['collectives_done']):>6} "
                     f"{int(j['reconfigurations']):>8}")
    return "\n".join(lines)


def clock_time(time_ns: int | str) -> str:
    """A time in ns since the epoch as local HH:MM:SS.mmm."""
    t = int(time_ns)
    return time.strftime("%H:%M:%S", time.localtime(t / 1e9)) + f".{(t // 1_000_000) % 1000:03d}"


def format_topology(topo: dict[str, Any]) -> str:
    """Nodes, devices and the grid as text."""
    first, spacing = float(topo["grid_first_thz"]), float(topo["grid_spacing_ghz"])
    on_wss = [n for n in topo.get("nodes", []) if n.get("transmitter")]
    links = topo.get("port_links", [])
    switch_ports = [f"{'node':<6} {'port':<5} {'switch':<8} {'ingress':>7} {'egress':>7}",
                    *(f"{p['node']:<6} {'p' + str(p['port']):<5} {p['switch']:<8} "
                      f"{int(p['ingress']):>7} {int(p['egress']):>7}" for p in links), ""]
    return "\n".join([f"testbed {topo['testbed']}: grid {topo['grid_first_thz']} THz + k x "
                      f"{topo['grid_spacing_ghz']} GHz, {topo['grid_channels']} channels", "",
                      *([*wss_host_table(on_wss, first, spacing), ""] if on_wss else []),
                      *(switch_ports if links else []),
                      *device_table(topo.get("devices", []))])


def format_devices(state: dict[str, Any]) -> str:
    """Every device's read-back state as text."""
    lines = [f"{'device':<8} {'kind':<11} {'ok':<4} state"]
    for d in state.get("devices", []):
        if not d["reachable"]:
            desc = f"UNREACHABLE: {d.get('error', '')}"
        elif d["kind"] == "itla":
            desc = (f"ch {int(d['channel'])} {float(d['frequency_thz']):.4f} THz "
                    f"{float(d['power_dbm']):.2f} dBm {'on' if d['output_enabled'] else 'off'}"
                    f"{', locked' if d['locked'] else ', NOT locked'}")
        elif d["kind"] == "wss":
            routes = [r for r in d.get("routes", [])
                      if int(r["port"]) not in (0, BLOCKED_PORT)
                      and float(r["attenuation_db"]) < BLOCKED_DB]
            desc = " ".join(f"{int(r['channel'])}→{int(r['port'])}"
                            + (f"({float(r['attenuation_db']):.1f}dB)"
                               if float(r["attenuation_db"]) else "") for r in routes) or "all blocked"
        elif d["kind"] == "ocs":
            desc = connections_text(d.get("connections", []))
        else:
            desc = " ".join(f"{int(m['channel'])}:"
                            + (f"{float(m['power_dbm']):.1f}dBm" if m["light"] else "dark")
                            for m in d.get("meter", []))
        verified = f" (verified {clock_time(d['verified_ns'])})" if int(d.get("verified_ns", 0)) else ""
        lines.append(f"{d['id']:<8} {d['kind']:<11} {'yes' if d['reachable'] else 'NO':<4} "
                     f"{desc}{verified}")
    return "\n".join(lines)


def connections_text(connections: list[dict[str, Any]],
                     hosts: dict[tuple[str, int], str] | None = None, switch: str = "") -> str:
    """A switch's table compactly: '1→53 2→54' (or 'no connections'); with `hosts`
    ({(switch, port): 'n0.p1'}), each pair names the host ports: '1→53 (n0.p1→n1.p1)'."""
    parts = []
    for c in connections:
        i, e = int(c["ingress"]), int(c["egress"])
        src, dst = (hosts or {}).get((switch, i)), (hosts or {}).get((switch, e))
        parts.append(f"{i}→{e}" + (f" ({src or '?'}→{dst or '?'})" if src or dst else ""))
    return " ".join(parts) or "no connections"


def host_ports(topology: dict[str, Any]) -> dict[tuple[str, int], str]:
    """{(switch, ingress or egress port): 'node.pN'} from the topology's port links."""
    out: dict[tuple[str, int], str] = {}
    for pl in topology.get("port_links", []):
        name = f"{pl['node']}.p{int(pl['port'])}"
        out[(pl["switch"], int(pl["ingress"]))] = out[(pl["switch"], int(pl["egress"]))] = name
    return out


def format_device_log(entries: list[dict[str, Any]]) -> str:
    """Device-log entries as text, oldest first."""
    if not entries:
        return "no device events"
    return "\n".join(f"{clock_time(e['time_ns'])} {e['device']:<8} {'ok ' if e['ok'] else 'ERR'} "
                     f"{e['action']}: {e['detail']}" for e in entries)


def format_schedule(sched: Any) -> str:
    """A schedule (protobuf) as a slot table."""
    lines = [f"{sched.collective} on job {sched.job_id}: {sched.n_elems:,} x {sched.itemsize} B, "
             f"{len(sched.slots)} slots, {sched.reconfigurations} retunes, guard "
             f"{sched.guard_total_s * 1e3:.3f} ms, makespan {sched.makespan_s * 1e3:.3f} ms, "
             f"efficiency {sched.efficiency:.4f}",
             f"{'slot':>4} {'step':>4} {'start ms':>9} {'data ms':>9} {'end ms':>9}  circuits"]
    for s in sched.slots:
        circuits = "  ".join(f"{c.src}->{c.dst} ch{c.channel}{'*' if c.retune else ''}"
                             for c in s.circuits)
        lines.append(f"{s.index:>4} {s.step:>4} {s.start_ns / 1e6:>9.3f} "
                     f"{s.data_start_ns / 1e6:>9.3f} {s.end_ns / 1e6:>9.3f}  {circuits}")
    lines.append("(* = the transmitter retunes in the slot's guard)")
    return "\n".join(lines)
