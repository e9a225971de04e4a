"""TopoOpt on its own testbed (issue 32): 12 emulated hosts × 4 ports through a 48x48 optical
circuit switch. A `topoopt` job's admission sets the switch to TopoOpt's four duplex rings (the
controller reads the table back), every all-reduce equals the exact sum while all four ports
carry data, an all-to-all the rings do not connect is forwarded through the hosts on the way,
and a plain ring then lights one port per host on the same switch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from oddl.agents.client.every_rank import allreduce_all, collective_all
from oddl.launch.shipped import shipped_testbed
from oddl.launch.testbed import RunningTestbed, fabric_stats

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def twelve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTestbed]:
    with RunningTestbed(tmp_path_factory.mktemp("topoopt"), shipped_testbed("topoopt-12node"),
                        agent_timeout_s=180) as tb:
        yield tb


def _table(tb: RunningTestbed) -> dict[int, int]:
    (ocs,) = [d for d in tb.operator.devices()["devices"] if d["kind"] == "ocs"]
    return {int(c["ingress"]): int(c["egress"]) for c in ocs.get("connections", [])}


def _exact(tb: RunningTestbed, sizes: tuple[int, ...], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in sizes:
        arrays = [rng.integers(-2**40, 2**40, n) for _ in tb.clients]
        _wall, outs = allreduce_all(tb.clients, arrays)
        expect = np.sum(arrays, axis=0)
        for rank, out in enumerate(outs):
            assert isinstance(out, np.ndarray), f"rank {rank}: {out!r}"
            assert np.array_equal(out, expect), f"rank {rank}, {n} elements"


def test_topoopt_sets_the_switch_to_four_rings_and_reduces_exactly(
        twelve: RunningTestbed) -> None:
    before = fabric_stats(twelve.launched.fabric).get("streams", {})
    job = twelve.operator.submit("topoopt", [], "topoopt", "")
    try:
        assert job["network"] == "circuit"
        table = _table(twelve)
        assert len(table) == 48 and len(set(table.values())) == 48  # every port lit, once
        # host k's port p is ingress 4k+p and egress 48+4k+p: port p carries jump 1, 5, 7, 11
        for ingress, egress in table.items():
            k, p = divmod(ingress - 1, 4)
            assert divmod(egress - 49, 4)[0] == (k + (1, 5, 7, 11)[p]) % 12
        _exact(twelve, (5, 12_345, 300_000), seed=12)
        # an all-to-all needs pairs the rings do not join: the hosts on the way forward it
        blocks = [np.arange(12 * 3, dtype=np.int64).reshape(12, 3) + 1000 * r for r in range(12)]
        _wall, outs = collective_all(
            twelve.clients, lambda c, r: c.all_to_all(blocks[r], job=job["id"]))
        for r, out in enumerate(outs):
            assert isinstance(out, np.ndarray), f"rank {r}: {out!r}"
            assert np.array_equal(out, np.stack([blocks[s][r] for s in range(12)])), f"rank {r}"
    finally:
        twelve.operator.cancel(job["id"])
    after = fabric_stats(twelve.launched.fabric).get("streams", {})
    assert after.get("lost", 0) == before.get("lost", 0)  # nothing went where no light was


def test_a_plain_ring_then_lights_one_port_per_host(twelve: RunningTestbed) -> None:
    job = twelve.operator.submit("ring", [], "ring", "circuit")
    try:
        table = _table(twelve)
        assert sorted(table) == [4 * k + 1 for k in range(12)]  # each host's port 1 only
        _exact(twelve, (7, 100_003), seed=13)
    finally:
        twelve.operator.cancel(job["id"])


def test_the_topology_oddl_topoopt_chose_runs_with_its_matching(
        twelve: RunningTestbed, tmp_path: Path) -> None:
    from oddl.cli.operator import job_params

    chosen = tmp_path / "chosen.json"  # two rings and a matching: i <-> i+6
    chosen.write_text(json.dumps({"topoopt": {"topology": {
        "nodes": 12, "jumps": [1, 11], "ring_jumps": {"1": [1, 11]},
        "matchings": [[[i, i + 6] for i in range(6)]]}}}))
    job = twelve.operator.submit("chosen", [], "topoopt", "", job_params([], str(chosen)))
    try:
        assert len(_table(twelve)) == 36  # three ports a host
        _exact(twelve, (11, 200_000), seed=14)
        blocks = [np.arange(12 * 2, dtype=np.int64).reshape(12, 2) + 100 * r
                  for r in range(12)]
        _wall, outs = collective_all(
            twelve.clients, lambda c, r: c.all_to_all(blocks[r], job=job["id"]))
        for r, out in enumerate(outs):
            assert isinstance(out, np.ndarray), f"rank {r}: {out!r}"
            assert np.array_equal(out, np.stack([blocks[s][r] for s in range(12)]))
    finally:
        twelve.operator.cancel(job["id"])
