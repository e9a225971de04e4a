"""Jobs on hosts whose ports go to an optical circuit switch (TopoOpt's 12 × 4-port testbed):
admission picks the network, gives each of the plan's pairs a port at both ends, and returns
the switch's cross-connects; the schedules carry the plan on those standing paths and refuse
a call that needs a path the job lacks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from oddl.common.config import TestbedConfig, load_testbed, parse_testbed
from oddl.common.errors import OperationRefused
from oddl.controller.admission import Admission
from oddl.controller.circuits import assign_ports, plan_pairs
from oddl.controller.schedules import Schedules
from oddl.controller.testbed_model import timing_from_config, topology_from_config
from oddl.launch.shapes import Shape, switched
from oddl.launch.shipped import shipped_testbed
from oddl.protos.schedule_wire import decode_schedule


def _admission(cfg: TestbedConfig) -> tuple[Admission, Schedules]:
    topology, timing = topology_from_config(cfg), timing_from_config(cfg)
    return Admission(cfg, topology, timing), Schedules(cfg, topology, timing, 1.0)


@pytest.fixture(scope="module")
def twelve() -> TestbedConfig:
    return load_testbed(shipped_testbed("topoopt-12node"))


def test_topoopt_on_twelve_hosts_gets_four_duplex_rings_one_per_port(
        twelve: TestbedConfig) -> None:
    admission, _ = _admission(twelve)
    job, target = admission.admit("train", [], "topoopt", "", {}, 0, job_id="job-1", jobs=[])
    assert job.network == "circuit"
    assert job.params == {"degree": "4", "both_directions": "true"}
    assert not target.channels and not target.wss_tables
    (switch,) = target.connections
    table = target.connections[switch]
    assert len(table) == 48 and all(e != 0 for e in table.values())  # every port lit
    assert len(set(table.values())) == 48  # each egress hears one ingress
    links = {(p.switch, p.ingress): (p.node, p.port) for p in twelve.port_links()}
    rx = {(p.switch, p.egress): (p.node, p.port) for p in twelve.port_links()}
    index = {n.id: i for i, n in enumerate(twelve.nodes)}
    for ingress, egress in table.items():
        (src, sp), (dst, dp) = links[(switch, ingress)], rx[(switch, egress)]
        jump = (index[dst] - index[src]) % 12
        assert jump == (1, 5, 7, 11)[sp - 1], f"{src}.p{sp} → {dst}"
        # duplex: the receiver hears the sender on the port it sends back to it on
        assert (index[src] - index[dst]) % 12 == (1, 5, 7, 11)[dp - 1]


def test_a_plain_ring_lights_one_port_per_host_and_darkens_the_rest(
        twelve: TestbedConfig) -> None:
    admission, _ = _admission(twelve)
    _job, target = admission.admit("ring", [], "ring", "circuit", {}, 0, job_id="job-1", jobs=[])
    (table,) = target.connections.values()
    lit = {i: e for i, e in table.items() if e}
    assert len(lit) == 12 and Counter(table.values())[0] == 36
    ports = {(p.ingress) for p in twelve.port_links() if p.port == 1}
    assert set(lit) == ports  # each host sends on its port 1


def test_the_change_frees_an_egress_an_earlier_job_still_holds(twelve: TestbedConfig) -> None:
    admission, _ = _admission(twelve)
    n11_p1 = next(p for p in twelve.port_links() if p.node == "n11" and p.port == 1)
    n1_p1 = next(p for p in twelve.port_links() if p.node == "n1" and p.port == 1)
    # n11 (not in the job) still sends into n1's port 1 from an earlier job
    current = {"ocs0": {n11_p1.ingress: n1_p1.egress}}
    _job, target = admission.admit("left", ["n0", "n1", "n2", "n3"], "ring", "circuit", {}, 0,
                                   job_id="job-1", jobs=[], connections=current)
    assert target.connections["ocs0"][n11_p1.ingress] == 0
    # and the job's own ports that carry nothing go dark
    n0_p2 = next(p for p in twelve.port_links() if p.node == "n0" and p.port == 2)
    assert target.connections["ocs0"][n0_p2.ingress] == 0


def test_networks_follow_the_hosts_optics(twelve: TestbedConfig) -> None:
    admission, _ = _admission(twelve)
    with pytest.raises(OperationRefused, match="use network circuit"):
        admission.admit("x", [], "ring", "optical", {}, 0, job_id="job-1", jobs=[])
    job, target = admission.admit("x", [], "ring", "ideal", {}, 0, job_id="job-1", jobs=[])
    assert job.network == "ideal" and not target.connections
    wss = load_testbed(shipped_testbed("emulated-8node"))
    with pytest.raises(OperationRefused, match="these hang on a WSS: use network optical"):
        _admission(wss)[0].admit("x", [], "ring", "circuit", {}, 0, job_id="job-1", jobs=[])


def test_a_host_with_fewer_ports_than_the_topology_needs_is_refused() -> None:
    cfg = parse_testbed(switched(Shape(hosts=6, ports=1)), "six.toml")
    admission, _ = _admission(cfg)
    with pytest.raises(OperationRefused,
                       match=r"host n0 has 1 port\(s\) but this job's topology needs 2 .*degree=1"):
        admission.admit("x", [], "topoopt", "circuit", {"degree": "2", "both_directions": "true"},
                        0, job_id="job-1", jobs=[])


def test_receive_ports_pair_with_transmit_ports_where_both_ways_run() -> None:
    nodes = ["a", "b", "c"]
    got = assign_ports(nodes, [("a", "b"), ("b", "c"), ("c", "a")], {n: 2 for n in nodes})
    assert got == [("a", 1, "b", 1), ("b", 1, "c", 1), ("c", 1, "a", 1)]
    duplex = assign_ports(nodes, [("a", "b"), ("b", "a"), ("a", "c"), ("c", "a")],
                          {n: 2 for n in nodes})
    assert ("a", 1, "b", 1) in duplex and ("b", 1, "a", 1) in duplex
    assert ("a", 2, "c", 1) in duplex and ("c", 1, "a", 2) in duplex


def _paths(cfg: TestbedConfig, nodes: tuple[str, ...]) -> set[tuple[str, str]]:
    from oddl.controller.scheduling import make_plan

    plan = make_plan("topoopt", len(nodes), len(nodes) * 8, degree=4, both_directions=True)
    return set(plan_pairs(plan, nodes))


def test_schedules_carry_the_plan_and_forward_what_the_links_lack(
        twelve: TestbedConfig) -> None:
    admission, schedules = _admission(twelve)
    job, _ = admission.admit("train", [], "topoopt", "", {}, 0, job_id="job-1", jobs=[])
    wire = schedules.encoded(job, 4 * 120_000, 4, "all_reduce", 0, {})
    decoded = decode_schedule(wire)
    assert decoded.collective == "topoopt" and not decoded.slots and decoded.steps
    assert wire.reconfigurations == 0 and wire.makespan_s > 0
    assert decode_schedule(schedules.encoded(job, 4 * 1200, 4, "broadcast", 0, {})).steps
    # an all-to-all needs pairs the rings lack: forwarded, with the relays' scratch past the
    # caller's 1200 elements, every hop on a light path of the job
    forwarded = schedules.encoded(job, 4 * 1200, 4, "all_to_all", 0, {})
    assert forwarded.n_elems > 1200
    index = {n: i for i, n in enumerate(job.nodes)}
    rings = {(index[s], index[d]) for s, d in _paths(twelve, job.nodes)}
    for step in decode_schedule(forwarded).steps:
        assert set(zip(step.src, step.dst, strict=True)) <= rings
    ring = admission.admit("ring", ["n0", "n1", "n2"], "ring", "circuit", {}, 0,
                           job_id="job-2", jobs=[])[0]
    # on three hosts a one-way ring reaches everyone, so even a broadcast from n1 goes round
    assert decode_schedule(schedules.encoded(ring, 4 * 300, 4, "broadcast", 1, {})).steps


def test_a_topology_oddl_topoopt_chose_becomes_rings_and_light_paths(
        twelve: TestbedConfig, tmp_path: Path) -> None:
    from oddl.cli.operator import job_params

    chosen = tmp_path / "dlrm.json"
    chosen.write_text(json.dumps({"topoopt": {"topology": {
        "nodes": 12, "jumps": [1, 11], "ring_jumps": {"1": [1, 11]},
        "matchings": [[[i, i + 6] for i in range(6)]]}}}))
    params = job_params([], str(chosen))
    assert params["jumps"] == "1,11" and params["links"].startswith("0-6,1-7")
    admission, schedules = _admission(twelve)
    job, target = admission.admit("dlrm", [], "topoopt", "", params, 0, job_id="job-1",
                                  jobs=[])
    (table,) = target.connections.values()
    lit = {i: e for i, e in table.items() if e}
    assert len(lit) == 36  # two ring ports and one matching port on each of 12 hosts
    rx = {(p.switch, p.egress): p.node for p in twelve.port_links()}
    tx = {(p.switch, p.ingress): p.node for p in twelve.port_links()}
    index = {n.id: i for i, n in enumerate(twelve.nodes)}
    jumps = sorted({(index[rx[("ocs0", e)]] - index[tx[("ocs0", i)]]) % 12
                    for i, e in lit.items()})
    assert jumps == [1, 6, 11]
    # the all-to-all rides the rings and the matching, forwarded where it must
    steps = decode_schedule(schedules.encoded(job, 4 * 2400, 4, "all_to_all", 0, {})).steps
    pairs = {(s, d) for step in steps for s, d in zip(step.src, step.dst, strict=True)}
    assert {(0, 6), (6, 0)} <= pairs and all((d - s) % 12 in (1, 6, 11) for s, d in pairs)


@pytest.mark.parametrize(("params", "message"), [
    ({"jumps": "1,4"}, r"each ring jump must be in 1..11, coprime to 12 .*bad: \[4\]"),
    ({"jumps": "one"}, "give whole numbers"),
    ({"jumps": "1", "links": "0-12"}, "'0-12' is not a pair of two ranks 0..11"),
])
def test_bad_topology_parameters_are_refused_by_name(
        twelve: TestbedConfig, params: dict[str, str], message: str) -> None:
    with pytest.raises(OperationRefused, match=message):
        _admission(twelve)[0].admit("x", [], "topoopt", "", params, 0, job_id="job-1",
                                    jobs=[])


def test_a_parameter_no_collective_takes_is_refused_not_crashed(twelve: TestbedConfig) -> None:
    with pytest.raises(OperationRefused, match=r"does not take parameters \['name'\]"):
        _admission(twelve)[0].admit("x", [], "ring", "", {"name": "x"}, 0, job_id="job-1",
                                    jobs=[])
