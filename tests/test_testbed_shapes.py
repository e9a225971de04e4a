"""Testbeds of more hosts: `oddl config new` writes ODDL's shape at any size, the shipped
eight-host files are its output, and on the emulated eight-host testbed two jobs of four
hosts run at once, isolated, each exact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from oddl.agents.client.every_rank import allreduce_all
from oddl.cli.main import main
from oddl.common.config import load_testbed
from oddl.common.errors import OperationRefused
from oddl.launch.shapes import MAX_WSS_HOSTS, Shape, oddl_wss
from oddl.launch.shipped import read_shipped_testbed, shipped_testbed
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
def test_a_file_of_any_size_is_valid_and_wired_as_odd_l_wires_it(
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
