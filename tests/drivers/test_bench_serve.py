"""`oddl emulate bench`: a lab's own testbed file served at the resources it names, so the probe
and the controller's drivers run unchanged before the devices arrive (issue 34). The serial
links go under a temporary folder here (under /dev they need root); the socket instruments
on loopback ports this test picks."""

from __future__ import annotations

import dataclasses
import grp
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from oddl.common.config import TestbedConfig, load_testbed
from oddl.common.errors import ConfigError
from oddl.drivers.emulators.bench_serve import Bench, check_resources, start_bench
from oddl.launch.shipped import shipped_testbed
from oddl.operator.probe import probe
from oddl.operator.probe_verdicts import OK


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lab_here(folder: Path) -> TestbedConfig:
    """lab-4node with its serial paths moved under `folder` and its meter on loopback."""
    cfg = load_testbed(shipped_testbed("lab-4node"))
    devices = []
    for d in cfg.devices:
        if d.resource.startswith("/dev/"):
            d = dataclasses.replace(d, resource=str(folder / d.resource.removeprefix("/")))
        elif d.kind == "powermeter":
            d = dataclasses.replace(d, resource=f"TCPIP0::127.0.0.1::{_free_port()}::SOCKET")
        devices.append(d)
    return dataclasses.replace(cfg, devices=tuple(devices))


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[tuple[Bench, TestbedConfig]]:
    cfg = _lab_here(tmp_path)
    group = grp.getgrgid(os.getegid()).gr_name
    b = start_bench(cfg, group)
    try:
        yield b, cfg
    finally:
        b.close()


def test_the_probe_finds_every_device_of_the_lab_file_where_it_names_it(
        bench: tuple[Bench, TestbedConfig]) -> None:
    b, cfg = bench
    assert set(b.served) == {d.id for d in cfg.devices}
    for dev in cfg.devices:
        if dev.kind in ("itla", "wss"):
            link = Path(dev.resource)
            assert link.is_symlink() and os.readlink(link).startswith("/dev/pts/")
            assert os.stat(link).st_mode & 0o777 == 0o660
    report = probe(cfg, scan=False)
    assert [(d.device, d.status) for d in report.devices] == \
        [(d.id, OK) for d in cfg.devices], [d.message for d in report.devices]


def test_closing_the_bench_removes_its_links(tmp_path: Path) -> None:
    cfg = _lab_here(tmp_path)
    b = start_bench(cfg, grp.getgrgid(os.getegid()).gr_name)
    links = [Path(d.resource) for d in cfg.devices if d.kind == "itla"]
    assert all(link.is_symlink() for link in links)
    b.close()
    assert not any(link.is_symlink() for link in links)


def test_a_real_device_at_the_path_is_left_alone(tmp_path: Path) -> None:
    cfg = _lab_here(tmp_path)
    laser = Path(cfg.devices[0].resource)
    laser.parent.mkdir(parents=True)
    laser.write_bytes(b"")  # stands for the adapter's device node
    with pytest.raises(ConfigError, match="exists and is not a link to an emulator's terminal"):
        start_bench(cfg, grp.getgrgid(os.getegid()).gr_name)
    assert laser.is_file() and not laser.is_symlink()
    assert not any(Path(d.resource).is_symlink() for d in cfg.devices)


def test_a_vxi11_meter_resource_is_refused_with_the_socket_form() -> None:
    cfg = load_testbed(shipped_testbed("lab-4node"))
    meter = next(d for d in cfg.devices if d.kind == "powermeter")
    vxi = dataclasses.replace(cfg, devices=tuple(
        dataclasses.replace(d, resource="TCPIP0::10.0.0.20::inst0::INSTR") if d is meter else d
        for d in cfg.devices))
    with pytest.raises(ConfigError, match=r'set resource = "TCPIP0::10.0.0.20::5025::SOCKET"'):
        check_resources(vxi)
    check_resources(cfg)  # the shipped template is what the bench serves
