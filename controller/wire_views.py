"""The controller's state in its wire form: jobs, the topology, device states and the log."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from oddl.common.config import NodeConfig, TestbedConfig
from oddl.controller.agent_registry import Lost
from oddl.controller.devices import DeviceManager
from oddl.controller.jobs import JobRecord
from oddl.protos import oddl_pb2 as pb


def job_pb(job: JobRecord) -> pb.Job:
    """A job as `ListJobs`, `GetStatus` and `JobAssigned` carry it."""
    return pb.Job(id=job.id, name=job.name, nodes=job.nodes, collective=job.collective,
                  network=job.network, state=job.state, reason=job.reason,
                  collectives_done=job.collectives_done,
                  reconfigurations=job.reconfigurations, guard_time_s=job.guard_time_s,
                  submitted_ns=job.submitted_ns, params=job.params)


def status_pb(testbed: str, agents: list[pb.AgentStatus], jobs: Iterable[JobRecord],
              devices: DeviceManager) -> pb.Status:
    """`GetStatus`: the agents, the jobs and the devices' counters."""
    return pb.Status(testbed=testbed, controller_time_ns=time.time_ns(), agents=agents,
                     jobs=[job_pb(j) for j in jobs], reconfigurations=devices.reconfigurations,
                     transactions_failed=devices.transactions_failed)


class Assignments:
    """`JobAssigned` events for many nodes at once: the job and its peers' addresses built
    once and copied per node (in C) with its rank, not built again per node in Python; the
    addresses kept until a registration changes them. A thousand nodes' announcement took
    0.7 s under the core's lock, each stream opened after a controller restart 0.8 ms
    (decision record 0034)."""

    def __init__(self) -> None:
        self._peers: dict[str, tuple[int, pb.JobAssigned]] = {}
        """Per job: the registry's version and the peers' addresses it had then."""

    def events(self, job: JobRecord, nodes: Iterable[str], version: int,
               addresses: Callable[[], dict[str, str]]) -> dict[str, pb.ScheduleEvent]:
        """Each of `nodes`' assignment to `job`; `addresses()` gives its peers' data
        addresses, called again only when the registry's `version` changed."""
        kept = self._peers.get(job.id)
        if kept is None or kept[0] != version:
            if len(self._peers) >= 64:  # jobs that ended
                self._peers.clear()
            kept = self._peers[job.id] = (version, pb.JobAssigned(peers=addresses()))
        template = pb.ScheduleEvent(assigned=pb.JobAssigned(job=job_pb(job),
                                                            next_seq=job.last_seq + 1))
        template.assigned.MergeFrom(kept[1])
        ranks = {n: r for r, n in enumerate(job.nodes)}
        out = {}
        for n in nodes:
            out[n] = event = pb.ScheduleEvent()
            event.CopyFrom(template)
            event.assigned.rank = ranks[n]
        return out


def go_events(go: pb.CollectiveGo, parts: Mapping[str, pb.Schedule]
              ) -> dict[str, pb.ScheduleEvent]:
    """Each node's go: the same start, with its own part of the schedule (`node_parts`), so
    a go to N nodes carries one schedule's bytes in all, not N schedules."""
    events = {}
    for n, part in parts.items():
        events[n] = event = pb.ScheduleEvent()
        event.go.job_id, event.go.seq, event.go.t0_ns = go.job_id, go.seq, go.t0_ns
        event.go.schedule.CopyFrom(part)
    return events


def peer_lost_pb(job_id: str, lost: Sequence[Lost]) -> pb.ScheduleEvent:
    """One `PeerLost` for all of a job's participants lost at once (the first, the rest in
    `also`)."""
    first, *more = lost
    return pb.ScheduleEvent(peer_lost=pb.PeerLost(
        job_id=job_id, node_id=first.node_id, reason=first.reason,
        also={x.node_id: x.reason for x in more}))


def topology_pb(cfg: TestbedConfig) -> pb.Topology:
    """The testbed's grid, nodes and devices."""
    return pb.Topology(
        testbed=cfg.name, grid_first_thz=cfg.grid.first_thz,
        grid_spacing_ghz=cfg.grid.spacing_ghz, grid_channels=cfg.grid.channels,
        nodes=[_node_pb(cfg, n) for n in cfg.nodes],
        devices=[*(pb.Device(id=d.id, kind=d.kind, resource=d.resource) for d in cfg.devices),
                 *(pb.Device(id=d.id, kind=d.kind, resource=d.resource) for d in cfg.optinc)],
        port_links=[pb.PortLink(node=pl.node, port=pl.port, switch=pl.switch,
                                ingress=pl.ingress, egress=pl.egress)
                    for pl in cfg.port_links()])


def _node_pb(cfg: TestbedConfig, n: NodeConfig) -> pb.Node:
    """A node; one without a transmitter (its ports on circuit switches) has no WSS."""
    att = cfg.attachment(n.id) if n.on_wss else None
    return pb.Node(id=n.id, host=n.host, transmitter=n.transmitter, rx_channel=n.rx_channel,
                   wss=att.wss if att else "", out_port=att.out_port if att else 0)


def device_states_pb(devices: DeviceManager) -> pb.DeviceStateList:
    """What every device reads back now (state, routes, meter, connections), or why it
    cannot."""
    out = pb.DeviceStateList()
    for dev_id, entry in devices.read_states().items():
        ds = out.devices.add(id=dev_id, kind=entry["kind"], reachable=entry["reachable"],
                             error=entry.get("error", ""), verified_ns=entry["verified_ns"])
        st = entry.get("state")
        if st is not None:
            ds.channel, ds.frequency_thz, ds.power_dbm = st.channel, st.frequency_thz, st.power_dbm
            ds.output_enabled, ds.locked = st.output_enabled, st.locked
        for ch, route in sorted(entry.get("routes", {}).items()):
            ds.routes.add(channel=ch, port=route.port, attenuation_db=route.attenuation_db)
        for ch, dbm in sorted(entry.get("meter", {}).items()):
            ds.meter.add(channel=ch, power_dbm=dbm if dbm is not None else 0.0,
                         light=dbm is not None)
        power = entry.get("power", {})
        for ingress, egress in sorted(entry.get("connections", {}).items()):
            ds.connections.add(ingress=ingress, egress=egress,
                               power=ingress in power and egress in power,
                               ingress_dbm=power.get(ingress, 0.0),
                               egress_dbm=power.get(egress, 0.0))
    return out


def device_log_pb(devices: DeviceManager, device: str, limit: int) -> pb.DeviceLog:
    """The newest `limit` (0: 100) events of `device` (empty: every device)."""
    events = [e for e in list(devices.events) if not device or e.device in (device, "*")]
    newest = events[-(limit or 100):]
    return pb.DeviceLog(entries=[pb.DeviceLogEntry(time_ns=e.time_ns, device=e.device,
                                                   action=e.action, ok=e.ok, detail=e.detail)
                                 for e in newest])
