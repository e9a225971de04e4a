"""Testbeds of more hosts and other shapes: `oddl config new` writes ODDL's shape at any size
and TopoOpt's (hosts of several ports on an optical circuit switch), the shipped eight-host
and TopoOpt files are its output, a miswired switch is refused with the fix, and on the
emulated eight-host testbed two jobs of four hosts run at once, isolated, each exact."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from oddl.agents.client.every_rank import allreduce_all
from oddl.cli.main import main
from oddl.common.config import dump_testbed, load_testbed
from oddl.common.errors import ConfigError, OperationRefused
from oddl.controller.testbed_model import topology_from_config
from oddl.launch.shapes import MAX_WSS_HOSTS, Shape, oddl_wss, switched
from oddl.launch.shipped import find_testbed, read_shipped_testbed, shipped_testbed
from oddl.launch.testbed import RunningTestbed


@pytest.mark.parametrize("name", ["emulated-8node", "lab-8node"])
def test_the_shipped_eight_host_files_are_what_config_new_writes(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["config", "new", "--hosts", "8"] + (["--lab"] if name.startswith("lab") else [])
    assert main(args) == 0
    assert capsys.readouterr().out == read_shipped_testbed(name), \
        f"regenerate: oddl {' '.join(args)} > oddl/testbeds/{name}.toml"


@pytest.mark.parametrize("hosts", [2, 3, 8, 16, 40, MAX_WSS_HOSTS])
@pytest.mark.parametrize("lab", [False, True])
def test_a_file_of_any_size_is_valid_and_wired_as_oddl_wires_it(
        hosts: int, lab: bool, tmp_path: Path) -> None:
    path = tmp_path / "testbed.toml"
    path.write_text(oddl_wss(Shape(hosts, lab)))
    cfg = load_testbed(path)
    assert [n.id for n in cfg.nodes] == [f"n{k}" for k in range(hosts)]
    assert cfg.fabric.link == ("direct" if lab else "fabric")
    assert len({n.transmitter for n in cfg.nodes}) == hosts
    for k, node in enumerate(cfg.nodes):  # host k hears WSS out-port k on its own channel
        assert cfg.attachment(node.id).wss == "wss0"
        assert cfg.attachment(node.id).out_port == k + 1
    assert len({n.rx_channel for n in cfg.nodes}) == hosts


@pytest.mark.parametrize("hosts", [1, MAX_WSS_HOSTS + 1])
def test_a_size_oddl_cannot_wire_is_refused_with_the_range(
        hosts: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "new", "--hosts", str(hosts)]) == 2
    assert f"2 to {MAX_WSS_HOSTS} hosts" in capsys.readouterr().err


@pytest.fixture(scope="module")
def eight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTestbed]:
    with RunningTestbed(tmp_path_factory.mktemp("eight"), shipped_testbed("emulated-8node"),
                        agent_timeout_s=120) as tb:
        yield tb


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_two_jobs_of_four_hosts_run_at_once_isolated_and_exact(eight: RunningTestbed) -> None:
    op = eight.operator
    first = op.submit("left", ["n0", "n1", "n2", "n3"], "ring", "optical")
    second = op.submit("right", ["n4", "n5", "n6", "n7"], "halving-doubling", "optical")
    try:
        with pytest.raises(OperationRefused, match="already run job"):
            op.submit("overlap", ["n3", "n4"], "ring", "optical")
        rng = np.random.default_rng(8)
        for n in (3, 10_007, 250_000):
            arrays = [rng.integers(-2**40, 2**40, n) for _ in range(8)]
            left, right = np.sum(arrays[:4], axis=0), np.sum(arrays[4:], axis=0)
            _wall, outs = allreduce_all(eight.clients, arrays)
            for rank, out in enumerate(outs):
                assert isinstance(out, np.ndarray), f"rank {rank}: {out!r}"
                assert np.array_equal(out, left if rank < 4 else right), f"rank {rank}"
        jobs = {j["id"]: j for j in op.jobs()}
        # halving-doubling retunes its own four lasers; the ring beside it never moves one
        assert int(jobs[second["id"]]["reconfigurations"]) > 0
        assert int(jobs[first["id"]]["reconfigurations"]) == 0
        assert int(jobs[first["id"]]["collectives_done"]) >= 3
    finally:
        op.cancel(first["id"])
        op.cancel(second["id"])


# --------------------------------------------------------------------------- TopoOpt's shape

TOPOOPT = ["config", "new", "--hosts", "12", "--ports", "4"]


@pytest.mark.parametrize(("name", "args"), [
    ("topoopt-12node", TOPOOPT + ["--name", "topoopt-12node"]),
    ("lab-topoopt-12node", TOPOOPT + ["--lab", "--name", "lab-topoopt-12node"])])
def test_the_shipped_topoopt_files_are_what_config_new_writes(
        name: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 0
    assert capsys.readouterr().out == read_shipped_testbed(name), \
        f"regenerate: oddl {' '.join(args)} > oddl/testbeds/{name}.toml"


def test_twelve_hosts_of_four_ports_hang_on_one_48_port_switch() -> None:
    cfg = load_testbed(shipped_testbed("topoopt-12node"))
    assert [(d.id, d.kind, d.size) for d in cfg.devices] == [("ocs0", "ocs", 48)]
    assert all(n.ports == 4 and not n.on_wss for n in cfg.nodes)
    links = cfg.port_links()
    assert len(links) == 48
    assert {(pl.node, pl.port): (pl.ingress, pl.egress) for pl in links}[("n2", 3)] == (11, 59)
    assert len({pl.ingress for pl in links}) == len({pl.egress for pl in links}) == 48


def _switched(tmp_path: Path, edit: Callable[[str], str]) -> Path:
    path = tmp_path / "switched.toml"
    path.write_text(edit(switched(Shape(3, ports=2))))
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace('to = "ocs0.3"', 'to = "ocs0.1"'),
     "ocs0.1 is already wired by fibres[0]"),
    (lambda t: t.replace('to = "ocs0.3"', 'to = "ocs0.13"'), "ocs0 has no port '13'"),
    (lambda t: t.replace('to = "ocs0.3"', 'to = "ocs0.9"'), "goes into ocs0.9, an egress port"),
    (lambda t: t.replace('from = "ocs0.9"', 'from = "ocs0.4"', 1),
     "hangs on ocs0.4, an ingress port"),
    (lambda t: t.replace('from = "n1.p1.tx"', 'from = "n1.p3.tx"'),
     "node 'n1' has no port p3 (its ports: p1..p2)"),
    (lambda t: t.replace('[[fibres]]\nfrom = "ocs0.9"\nto = "n1.p1.rx"\n', ''),
     "port p1 of n1 has a fibre on its tx but none on its rx"),
    (lambda t: t.replace('ports = 2', 'ports = 0', 1), "has neither a transmitter nor ports"),
    (lambda t: t.replace('from = "n0.p1.tx"', 'from = "n0.tx"'), "no tunable transmitter"),
    (lambda t: t.replace('size = 6', 'size = 4'), "ocs0 has no port"),
])
def test_a_miswired_switch_is_refused_naming_the_key_and_the_fix(
        tmp_path: Path, edit: Callable[[str], str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_testbed(_switched(tmp_path, edit))
    assert ";" in str(err.value)  # the fix follows the problem


def test_switch_only_hosts_are_not_in_the_slot_schedulers_topology() -> None:
    cfg = load_testbed(shipped_testbed("topoopt-12node"))
    topology = topology_from_config(cfg)  # circuit jobs run on standing paths instead
    assert topology.nodes == () and topology.wss == ()


def test_a_resolved_switched_file_reads_back_the_same(tmp_path: Path) -> None:
    cfg = load_testbed(shipped_testbed("topoopt-12node"))
    again = tmp_path / "resolved.toml"
    again.write_text(dump_testbed(cfg))
    back = load_testbed(again)
    assert back.nodes == cfg.nodes and back.port_links() == cfg.port_links()


def test_a_shipped_name_is_a_config(tmp_path: Path) -> None:
    assert find_testbed("emulated-8node") == shipped_testbed("emulated-8node")
    own = tmp_path / "mine.toml"
    assert find_testbed(str(own)) == own  # a path stays a path, even before it exists
    with pytest.raises(ConfigError, match="no shipped testbed of that name .*emulated-8node"):
        find_testbed("emulated-9node")


def test_config_show_draws_hosts_ports_and_the_switch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "topoopt-12node", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["wss_hosts"] == [] and len(view["switch_ports"]) == 48
    assert {"node": "n2", "port": 3, "switch": "ocs0", "ingress": 11, "egress": 59} \
        in view["switch_ports"]
    assert main(["config", "show", "emulated-8node"]) == 0
    text = capsys.readouterr().out
    assert "testbed emulated-8node: 8 hosts" in text
    assert re.search(r"n7\s+127\.0\.0\.1\s+laser7\s+8\s+193\.8000\s+wss0\s+8", text)


def test_the_emulated_retune_budget_comes_from_the_measured_retunes() -> None:
    # command_ms of a generated emulated file: twice the slowest retune measured for that
    # many lasers on the emulator host (ADR 0034), never less than the measurement
    from oddl.launch.shapes import RETUNE_MEASURED_MS, measured_retune_ms, retune_budget_ms

    for lasers, worst_ms in RETUNE_MEASURED_MS:
        assert abs(measured_retune_ms(lasers) - worst_ms) < 1e-9
        assert retune_budget_ms(lasers, lab=False) >= 2 * worst_ms
    budgets = [retune_budget_ms(n, lab=False) for n in range(2, 129)]
    assert budgets == sorted(budgets) and budgets[0] == 8.0
    assert retune_budget_ms(128, lab=False) >= 4 * retune_budget_ms(64, lab=False) - 1
