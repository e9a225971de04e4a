"""The circuit switch as a device of a testbed file: the emulator host serves TopoOpt's 48x48
switch and the light of every host port through it (also as `oddl emulate testbed --config
topoopt-12node`), `oddl devices probe` identifies it and checks its size, and the controller's
driver for it (`open_driver`) applies a topology of four rings, one per host port, as one
verified transaction that reads back exactly."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import serving, stop_with_sigterm

from oddl.common.config import TestbedConfig, load_testbed
from oddl.common.lighttable import LightTable
from oddl.controller.device_drivers import open_driver
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed
from oddl.launch.shipped import shipped_testbed
from oddl.operator.probe import probe
from oddl.operator.probe_verdicts import MISMATCH, OK


@pytest.fixture(scope="module")
def bed() -> Iterator[EmulatedTestbed]:
    tb = start_emulated_testbed(load_testbed(shipped_testbed("topoopt-12node")))
    try:
        yield tb
    finally:
        tb.close()


def _switch(cfg: TestbedConfig, **changes: object) -> TestbedConfig:
    devices = tuple(dataclasses.replace(d, **changes) if d.kind == "ocs" else d
                    for d in cfg.devices)
    return dataclasses.replace(cfg, devices=devices)


def test_the_emulator_host_serves_the_switch_on_a_scpi_socket(bed: EmulatedTestbed) -> None:
    (ocs,) = bed.resolved.devices
    assert ocs.kind == "ocs" and ocs.resource.startswith("TCPIP0::127.0.0.1::")
    assert ocs.resource.endswith("::SOCKET")
    # the light of every host port goes through the switch: a light table row per port
    assert bed.fabric is not None and bed.light is not None and bed.light.nodes == 48
    assert bed.resolved.fabric.address == bed.fabric.address
    assert bed.resolved.fabric.light_table == str(bed.light.path)


def test_probe_identifies_the_switch_and_checks_its_size(bed: EmulatedTestbed) -> None:
    (found,) = probe(bed.resolved, scan=False).devices
    assert found.status == OK, found.message
    assert "48x48" in (found.identity or {})["model"]
    (wrong,) = probe(_switch(bed.resolved, size=24), scan=False).devices
    assert wrong.status == MISMATCH
    assert "48x48 switch, the testbed file says size = 24" in wrong.message


def test_a_topology_of_four_rings_is_applied_and_read_back(bed: EmulatedTestbed) -> None:
    cfg = bed.resolved
    links = {(pl.node, pl.port): pl for pl in cfg.port_links()}
    nodes = [n.id for n in cfg.nodes]
    # TotientPerms on 12 hosts: rings of the offsets coprime with 12, one per port
    offsets = dict(zip(range(1, 5), (1, 5, 7, 11), strict=True))
    table = {links[(nodes[k], p)].ingress: links[(nodes[(k + s) % 12], p)].egress
             for k in range(12) for p, s in offsets.items()}
    switch = open_driver(cfg.devices[0], cfg.grid)
    try:
        assert switch.apply_verified(table) == table
        assert switch.connections() == table
        emulated = bed.circuit_switches["ocs0"].switch
        assert {i: emulated.partner(i) for i in table} == table  # the unit itself holds them
    finally:
        switch.close()


def test_oddl_emulate_testbed_serves_the_port_light_of_a_shipped_name(tmp_path: Path) -> None:
    resolved = tmp_path / "resolved.toml"
    argv = [sys.executable, "-m", "oddl", "emulate", "testbed", "--config", "topoopt-12node",
            "--resolved", str(resolved)]
    with serving(argv, 60, "oddl emulate testbed") as (proc, line):
        ready = json.loads(line)
        assert ready["ready"] and ready["fabric"].startswith("tcp://127.0.0.1:")
        cfg = load_testbed(resolved)
        assert cfg.fabric.address == ready["fabric"]
        table = LightTable.open(cfg.fabric.light_table)
        try:
            assert table.nodes == 48 and table.writer == proc.pid
        finally:
            table.close()
        assert stop_with_sigterm(proc) == 0
