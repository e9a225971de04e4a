"""The rig's hosts and links as plain data (pure: no I/O).

Every name carries the run id (the rig's pid), so a crashed run never blocks the next one,
and every host is its own network namespace joined by a veth to a bridge that lives in a
namespace of its own: the root namespace is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.77.0"            # a private /24 inside the rig's own namespaces
PREFIX_LEN = 24
CONTROLLER_OCTET = 10
FIRST_NODE_OCTET = 11
SHAPE = ("rate", "1gbit", "burst", "256kb", "latency", "20ms")
LINE_RATE_GBPS = 1.0          # what SHAPE lets through, for the benchmark's bound
DEFAULT_MTU = 1500            # the links' MTU; a lab's training network often runs 9000
ETHERNET_HEADER = 14          # what tbf counts beside the IP packet on a veth
TCP_IP_HEADERS = 52           # IPv4 20 + TCP 20 + the timestamp option 12
NAME_PREFIX = "oddl-lab-"
STATE_ROOT = Path("/var/tmp")


@dataclass(frozen=True)
class Host:
    """One machine of the lab: `ctl` (the controller host) or a training host `n0`..`n3`."""

    name: str
    netns: str
    address: str
    bridge_port: str           # its veth end in the bridge namespace
    node: str | None = None    # the testbed node id, None for the controller host

    @property
    def is_controller(self) -> bool:
        return self.node is None

    @property
    def cidr(self) -> str:
        return f"{self.address}/{PREFIX_LEN}"


@dataclass(frozen=True)
class LabPlan:
    """The whole rig of one run: its id, its folder, the bridge namespace and the hosts."""

    run_id: int
    nodes: tuple[str, ...]
    hosts: tuple[Host, ...]
    mtu: int = DEFAULT_MTU

    @property
    def tag(self) -> str:
        return f"{NAME_PREFIX}{self.run_id}"

    @property
    def bridge_netns(self) -> str:
        return f"{self.tag}-br"

    @property
    def run_dir(self) -> Path:
        return STATE_ROOT / self.tag

    @property
    def controller(self) -> Host:
        return next(h for h in self.hosts if h.is_controller)

    @property
    def training_hosts(self) -> tuple[Host, ...]:
        return tuple(h for h in self.hosts if not h.is_controller)

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name or h.node == name:
                return h
        raise KeyError(f"no host {name!r} in the rig (hosts: "
                       f"{', '.join(h.name for h in self.hosts)})")

    def host_dir(self, host: Host) -> Path:
        """The host's 'disk': its /etc/oddl and /var/lib/oddl survive a reboot there."""
        return self.run_dir / "hosts" / host.name


def plan_lab(run_id: int, nodes: tuple[str, ...] = ("n0", "n1", "n2", "n3"),
             mtu: int = DEFAULT_MTU) -> LabPlan:
    """The controller host and one training host per node, addresses in order; every link
    of `mtu` bytes (ValueError outside what a veth takes)."""
    if not 576 <= mtu <= 65535:
        raise ValueError(f"--mtu {mtu}: give 576..65535 (1500 Ethernet's, 9000 jumbo frames)")
    tag = f"{NAME_PREFIX}{run_id}"
    hosts = [Host("ctl", f"{tag}-ctl", f"{SUBNET}.{CONTROLLER_OCTET}", "p-ctl")]
    for i, node in enumerate(nodes):
        hosts.append(Host(node, f"{tag}-{node}", f"{SUBNET}.{FIRST_NODE_OCTET + i}",
                          f"p-{node}", node=node))
    return LabPlan(run_id, nodes, tuple(hosts), mtu)


def run_id_of(netns_or_dir: str) -> int | None:
    """The run id in a rig's namespace or folder name, or None for another name."""
    if not netns_or_dir.startswith(NAME_PREFIX):
        return None
    head = netns_or_dir[len(NAME_PREFIX):].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def line_rate_bound_s(nbytes: int, nodes: int, gbps: float = LINE_RATE_GBPS) -> float:
    """The all-reduce lower bound on links of `gbps`: 2(N-1)/N * S * 8 / rate."""
    return 2 * (nodes - 1) / nodes * nbytes * 8 / (gbps * 1e9)


def tcp_bound_s(nbytes: int, nodes: int, mtu: int, gbps: float = LINE_RATE_GBPS) -> float:
    """The same bound for TCP payload on the shaped links: each full packet carries
    mtu - 52 bytes of payload and costs mtu + 14 on the wire tbf shapes (its acks, on the
    other direction of a ring host's link, not counted)."""
    return line_rate_bound_s(nbytes, nodes, gbps) * (mtu + ETHERNET_HEADER) / (
        mtu - TCP_IP_HEADERS)
