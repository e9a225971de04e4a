"""Testbed files of a shape: `oddl config new` writes them, and the shipped files of more than
four hosts are its output (tests/top/test_testbed_shapes.py keeps them equal).

`oddl_wss(shape)` is ODDL's shape at any size (the paper's testbed has four hosts): one tunable
transmitter (ITLA) and one fixed receiver per host, every transmitter into the common port of
one 1×N WSS, out-port k to host k's receiver, a power-meter channel on every out-port. The
emulated variant sizes what a 2-core machine carries (line rate shared among the hosts) and
budgets the retune of every laser at once into ``command_ms``; the lab variant has serial
resources, LAN addresses, direct links and the security section, to edit to the bench.
With `rack` (`--rack K`) every K lasers are one device host's (`oddl.launch.racks`) and
``command_ms`` budgets one request per rack instead.

`switched(shape)` is TopoOpt's shape (its prototype: 12 hosts with four 25 Gbit/s ports each,
patched by a reconfigurable switch into the topology its search chose): every host port's
fibres go to one N×N optical circuit switch (host k's port j: ingress ``ports·k + j``, egress
``N + ports·k + j``), whose connections make the topology.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oddl.common.config.devices import MAX_OCS_SIZE
from oddl.launch.racks import check_rack, device_hosts_toml, rack_budget_ms

MAX_WSS_HOSTS = 48
"""A host's receiver owns one channel of the 48-channel 100 GHz grid."""
MAX_SWITCH_SIZE = MAX_OCS_SIZE
"""The largest switch a testbed file takes (a 384×384 Polatis unit)."""


@dataclass(frozen=True)
class Shape:
    """What `oddl config new` is asked for."""

    hosts: int
    lab: bool = False
    ports: int = 0
    """Fixed ports per host on a circuit switch (0: ODDL's shape, one laser on a WSS)."""
    named: str = ""
    """The testbed's name ("": from the shape)."""
    rack: int | None = None
    """Lasers per device host (`--rack K`, `oddl.launch.racks`; None: the controller drives
    every laser itself)."""

    @property
    def name(self) -> str:
        """The testbed's name: `named`, or ``emulated-8node``, ``lab-12node-4port``."""
        ports = f"-{self.ports}port" if self.ports else ""
        return self.named or f"{'lab' if self.lab else 'emulated'}-{self.hosts}node{ports}"


def check_shape(shape: Shape) -> str:
    """Why this shape cannot be written ("" if it can)."""
    problem = _check_hosts(shape)
    return problem or check_rack(shape.rack, shape.hosts, shape.ports)


def _check_hosts(shape: Shape) -> str:
    if shape.ports:
        if shape.hosts < 2 or shape.ports < 1 or shape.hosts * shape.ports > MAX_SWITCH_SIZE:
            return (f"--hosts {shape.hosts} --ports {shape.ports}: a switched testbed has at "
                    f"least 2 hosts of at least one port, at most {MAX_SWITCH_SIZE} ports in all "
                    f"(one {MAX_SWITCH_SIZE}x{MAX_SWITCH_SIZE} switch)")
        return ""
    if not 2 <= shape.hosts <= MAX_WSS_HOSTS:
        return (f"--hosts {shape.hosts}: an ODDL testbed with one WSS has 2 to "
                f"{MAX_WSS_HOSTS} hosts (one receive channel each on the 48-channel grid)")
    return ""


def emulated_line_rate_gbps(hosts: int) -> float:
    """The emulated line rate: about 8 Gbit/s shared by the hosts (what a loaded 2-core
    machine carries for every agent at once without falling behind), 0.25 to 3."""
    return min(3.0, max(0.25, round(8.0 / hosts, 2)))


RETUNE_MEASURED_MS = ((4, 3.8), (16, 20.4), (32, 86.5), (64, 420.0))
"""The slowest retune of N emulated lasers at once (ms), every laser on the one emulator host:
`python benchmarks/bench_retune_scale.py --sizes 4,16,32,64 --repeats 3` on the shared 2-vCPU
VM, 2026-11-28 (docs/results.md, "One controller for a thousand agents")."""


def measured_retune_ms(lasers: int) -> float:
    """`RETUNE_MEASURED_MS` at `lasers`: interpolated on a log-log scale between the measured
    sizes, and beyond the largest as N² (the emulator host answers every laser's frames in
    one process, so the wall time grows as N²; the smallest size's below it)."""
    points = RETUNE_MEASURED_MS
    n = max(lasers, points[0][0])
    for (n0, t0), (n1, t1) in zip(points, points[1:], strict=False):
        if n <= n1:
            return t0 * (t1 / t0) ** (math.log(n / n0) / math.log(n1 / n0))
    n_last, t_last = points[-1]
    return t_last * (n / n_last) ** 2


def retune_budget_ms(hosts: int, lab: bool) -> float:
    """``command_ms``: the hand-off and the retune of every laser at once. Emulated: twice the
    slowest retune measured for that many lasers (`measured_retune_ms`; 8 ms for four, 41 for
    16, 173 for 32, 840 for 64). Lab: on 9600-baud serial lines a round trip is ~5 ms, one
    per laser more than four (not measured here)."""
    if lab:
        return 20.0 + 5.0 * max(0, hosts - 4)
    return float(math.ceil(2.0 * measured_retune_ms(hosts)))


def oddl_wss(shape: Shape) -> str:
    """The testbed file of ODDL's shape with `shape.hosts` hosts, as TOML text."""
    problem = check_shape(shape)
    if problem:
        raise ValueError(problem)
    n, lab = shape.hosts, shape.lab
    parts = [_header(shape), _timing(n, lab, shape.rack), _fabric(n, lab), _controller(lab)]
    parts += [_node(k, lab) for k in range(n)]
    parts += [_laser(k, lab) for k in range(n)]
    if shape.rack:
        parts.append(device_hosts_toml(n, shape.rack, lab))
    parts += [_wss(n, lab), _meters(n, lab), _fibres(n)]
    return "\n".join(parts)


def _header(shape: Shape) -> str:
    n = shape.hosts
    kind = "Lab" if shape.lab else "Emulated"
    named = f" --name {shape.named}" if shape.named else ""
    channels = min(2 * n, MAX_WSS_HOSTS)
    rack = f" --rack {shape.rack}" if shape.rack else ""
    racked = _racked_header(shape.rack, shape.lab) if shape.rack else ""
    return f"""# {kind} ODDL testbed with {n} hosts, written by `oddl config new --hosts {n}{' --lab' if shape.lab else ''}{named}{rack}`.
# Topology (TT-FR, as emulated-4node): each host has a tunable transmitter (ITLA) and a fixed
# receiver that owns one channel; every transmitter enters the common port of one 1x{n} WSS,
# whose out-port k feeds host k's receiver. Jobs on disjoint hosts run at once, isolated.{racked}

[testbed]
name = "{shape.name}"
description = "{n} hosts, {n} ITLA transmitters, one 1x{n} flexgrid WSS, power meters"
{'' if shape.lab else 'seed = 1' + chr(10)}
[grid]
first_thz = 193.1
spacing_ghz = 100.0
channels = 48
# the WSS passes channels 1..{channels}: each receiver's own and as many again for
# collectives that use several wavelengths
"""


def _racked_header(rack: int, lab: bool) -> str:
    covers = ("one rack's serial round trips and the controller's fan-out, every rack on a "
              "machine\n# of its own (not measured)" if lab else
              "the hand-off and the retune of every laser through the racks: twice the "
              "slowest\n# retune measured with racks (oddl.launch.racks)")
    return (f"\n# Every {rack} transmitters are one rack on a device host ([[device_hosts]], "
            "after the lasers):\n# the controller sends one retune request per rack. "
            f"command_ms budgets\n# {covers}.")


def _command_ms(n: int, lab: bool, rack: int | None) -> str:
    """The ``command_ms`` line and the comment that says what it covers."""
    if rack and lab:
        return (f"command_ms = {rack_budget_ms(n, rack, lab)}         # one rack's 9600-baud "
                f"round trips ({rack} lasers) + the controller's fan-out")
    if rack:
        return (f"command_ms = {rack_budget_ms(n, rack, lab)}         # the hand-off and the "
                f"retune of {n} lasers, one request per rack of {rack}")
    if lab:
        return (f"command_ms = {retune_budget_ms(n, lab)}         # 9600-baud ITLA round "
                f"trips for {n} lasers")
    return (f"command_ms = {retune_budget_ms(n, lab)}         # the hand-off and the retune of "
            f"{n} lasers at once")


def _timing(n: int, lab: bool, rack: int | None = None) -> str:
    if lab:
        return f"""[timing]
laser_tune_ms = 50.0      # measure the module's time-to-lock (oddl logs it per tune)
wss_settle_ms = 150.0
clock_skew_us = 50.0      # chrony on the lab LAN; use PTP for less
cdr_lock_us = 100.0
{_command_ms(n, lab, rack)}
slot_margin_us = 1000.0
launch_margin_ms = 20.0
receive_timeout_ms = 5000.0
"""
    return f"""[timing]
laser_tune_ms = 2.0
wss_settle_ms = 100.0
clock_skew_us = 100.0
cdr_lock_us = 10.0
{_command_ms(n, lab, rack)}
slot_margin_us = 600.0
launch_margin_ms = 5.0
receive_timeout_ms = 2000.0
standing_margin_ms = 3.0
"""


def _fabric(n: int, lab: bool) -> str:
    if lab:
        return """[fabric]
line_rate_gbps = 25.0     # the transceivers' rate
link = "direct"           # data goes host to host; the optical circuit is the link
"""
    return f"""[fabric]
line_rate_gbps = {emulated_line_rate_gbps(n)}     # what a 2-core machine carries for {n} agents at once
link = "fabric"
"""


def _controller(lab: bool) -> str:
    if lab:
        return """[controller]
listen = "0.0.0.0:50051"
address = "10.0.0.10:50051"   # where the agents reach the controller
heartbeat_s = 1.0
state = "/var/lib/oddl/controller.sqlite"

[security]
# mutual TLS for the controller, CURVE for the data links: docs/explanation/security.md
certs = "/etc/oddl/certs"
"""
    return """[controller]
listen = "127.0.0.1:0"
heartbeat_s = 1.0
"""


def _rx_thz(k: int) -> str:
    return f"{193.1 + 0.1 * k:.1f}"


def _node(k: int, lab: bool) -> str:
    host = f"10.0.0.{11 + k}" if lab else "127.0.0.1"
    port = "\ndata_port = 5600" if lab else ""
    return f"""[[nodes]]
id = "n{k}"
host = "{host}"
transmitter = "laser{k}"
rx_thz = {_rx_thz(k)}{port}
"""


def _laser(k: int, lab: bool) -> str:
    resource = f"/dev/serial/by-id/usb-FTDI_ITLA_{k}-if00-port0" if lab else "emulated"
    baud = "\nbaud = 9600" if lab else ""
    return f"""[[devices]]
id = "laser{k}"
kind = "itla"
resource = "{resource}"{baud}
power_dbm = 10.0
power_range_dbm = [7.0, 13.0]
"""


def _wss(n: int, lab: bool) -> str:
    resource = "/dev/serial/by-id/usb-Finisar_WSS-if00-port0" if lab else "emulated"
    serial = "\nbaud = 115200\ntimeout_s = 2.0" if lab else ""
    return f"""[[devices]]
id = "wss0"
kind = "wss"
resource = "{resource}"{serial}
ports = {n}
attenuation_range_db = [0.0, 15.0]
channels_allowed = [1, {min(2 * n, MAX_WSS_HOSTS)}]
"""


METER_CHANNELS = 8
"""Channels per power meter (a Keysight N7745A has 8); more hosts, more meters."""


def _meters(n: int, lab: bool) -> str:
    out = []
    for m in range((n + METER_CHANNELS - 1) // METER_CHANNELS):
        resource = f"TCPIP0::10.0.0.{20 + m}::5025::SOCKET" if lab else "emulated"
        out.append(f"""[[devices]]
id = "pm{m}"
kind = "powermeter"
resource = "{resource}"
channels = {min(METER_CHANNELS, n - m * METER_CHANNELS)}
""")
    return "\n".join(out)


def _fibres(n: int) -> str:
    out = [f'[[fibres]]\nfrom = "n{k}.tx"\nto = "wss0.in"\n' for k in range(n)]
    out += [f'[[fibres]]\nfrom = "wss0.{k + 1}"\nto = "n{k}.rx"\n' for k in range(n)]
    out.append(f"# monitor taps: WSS out-port k to a meter channel, {METER_CHANNELS} per meter")
    out += [f'[[fibres]]\nfrom = "wss0.{k + 1}"\n'
            f'to = "pm{k // METER_CHANNELS}.{k % METER_CHANNELS + 1}"\n' for k in range(n)]
    return "\n".join(out)


def switched(shape: Shape) -> str:
    """The testbed file of TopoOpt's shape: `shape.hosts` hosts of `shape.ports` fixed ports,
    every port on one optical circuit switch, as TOML text."""
    problem = check_shape(shape)
    if problem or not shape.ports:
        raise ValueError(problem or "a switched testbed needs ports per host")
    n, d, lab = shape.hosts, shape.ports, shape.lab
    size = n * d
    named = f" --name {shape.named}" if shape.named else ""
    head = f"""# {'Lab' if lab else 'Emulated'} testbed of TopoOpt's shape with {n} hosts of {d} ports, written by
# `oddl config new --hosts {n} --ports {d}{' --lab' if lab else ''}{named}`. Every port's fibres go to one {size}x{size}
# optical circuit switch (host k's port j: ingress {d}*k + j, egress {size} + {d}*k + j); the
# switch's connections make the direct-connect topology a job's search chose.

[testbed]
name = "{shape.name}"
description = "{n} hosts x {d} ports on one {size}x{size} optical circuit switch"
{'' if lab else 'seed = 1' + chr(10)}"""
    switch_resource = "TCPIP0::10.0.0.30::5025::SOCKET" if lab else "emulated"
    parts = [head, _timing(n, lab), _switched_fabric(n, d, lab), _controller(lab)]
    for k in range(n):
        host = f"10.0.0.{11 + k}" if lab else "127.0.0.1"
        port = "\ndata_port = 5600" if lab else ""
        parts.append(f'[[nodes]]\nid = "n{k}"\nhost = "{host}"\nports = {d}{port}\n')
    parts.append(f"""[[devices]]
id = "ocs0"
kind = "ocs"
resource = "{switch_resource}"
size = {size}
switch_ms = 25.0          # per connection (a Polatis unit: 25-50 ms)
timeout_s = 5.0
""")
    fibres = []
    for k in range(n):
        for j in range(1, d + 1):
            ingress = d * k + j
            fibres.append(f'[[fibres]]\nfrom = "n{k}.p{j}.tx"\nto = "ocs0.{ingress}"\n')
            fibres.append(f'[[fibres]]\nfrom = "ocs0.{size + ingress}"\nto = "n{k}.p{j}.rx"\n')
    return "\n".join(parts + fibres)


def _switched_fabric(n: int, d: int, lab: bool) -> str:
    if lab:
        return """[fabric]
line_rate_gbps = 25.0     # each port's rate (TopoOpt's prototype: 4 x 25 Gbit/s per host)
link = "direct"
"""
    return f"""[fabric]
line_rate_gbps = {emulated_line_rate_gbps(n * d // 2)}     # per port: what a 2-core machine carries for {n}x{d} ports
link = "fabric"
"""


def control_plane(hosts: int, heartbeat_s: float = 1.0) -> str:
    """A testbed file for the control plane at scale (benchmarks/bench_control_plane.py): `hosts`
    emulated hosts of one port each, on as many circuit switches as they need
    (``MAX_SWITCH_SIZE`` ports each). A job on hosts of different switches runs on network
    ``ideal`` (no circuit spans two switches); the controller, its streams, barriers and
    schedules are as on any testbed. `heartbeat_s`: the agents' heartbeat interval (an agent
    silent for three is declared dead)."""
    if hosts < 2:
        raise ValueError(f"--hosts {hosts}: a testbed has at least 2 hosts")
    switches = -(-hosts // MAX_SWITCH_SIZE)
    head = f"""# Emulated control-plane testbed: {hosts} hosts of one port on {switches} circuit switch(es).
[testbed]
name = "control-plane-{hosts}node"
description = "{hosts} hosts x 1 port on {switches} optical circuit switch(es)"
seed = 1
"""
    parts = [head, _timing(min(hosts, MAX_WSS_HOSTS), False),
             _switched_fabric(min(hosts, MAX_WSS_HOSTS), 1, False),
             _controller(False).replace("heartbeat_s = 1.0", f"heartbeat_s = {heartbeat_s}")]
    parts += [f'[[nodes]]\nid = "n{k}"\nhost = "127.0.0.1"\nports = 1\n' for k in range(hosts)]
    fibres = []
    for s in range(switches):
        members = range(s * MAX_SWITCH_SIZE, min(hosts, (s + 1) * MAX_SWITCH_SIZE))
        size = len(members)
        parts.append(f'[[devices]]\nid = "ocs{s}"\nkind = "ocs"\nresource = "emulated"\n'
                     f'size = {size}\nswitch_ms = 25.0\ntimeout_s = 5.0\n')
        for i, k in enumerate(members, start=1):
            fibres.append(f'[[fibres]]\nfrom = "n{k}.p1.tx"\nto = "ocs{s}.{i}"\n')
            fibres.append(f'[[fibres]]\nfrom = "ocs{s}.{size + i}"\nto = "n{k}.p1.rx"\n')
    return "\n".join(parts + fibres)
