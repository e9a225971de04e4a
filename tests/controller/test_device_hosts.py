"""Device hosts (decision record 0036): the controller drives a rack's lasers through the process
that owns them, over ZeroMQ, with the real ITLA driver at the host and the emulators behind it.
Transactions, verify and roll-back run through the proxies; a retune is one request per host;
a host that stops answering fails its lasers with an error naming it, and nothing changes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from oddl.common.config import (
    DeviceHostConfig,
    TestbedConfig,
    dump_testbed,
    load_testbed,
    parse_testbed,
)
from oddl.common.errors import ConfigError, DeviceError
from oddl.controller.device_host import DeviceHost
from oddl.controller.device_types import Configuration
from oddl.controller.devices import DeviceManager
from oddl.controller.server import default_configuration
from oddl.drivers.device_host_link import RemoteTransceiver
from oddl.drivers.emulators.host import EmulatedTestbed, start_emulated_testbed

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "testbeds" / "emulated-4node.toml"
RACK = ("laser0", "laser1")


def _with_host(cfg: TestbedConfig, address: str) -> TestbedConfig:
    return replace(cfg, device_hosts=(DeviceHostConfig("rack0", address, RACK),))


class _Running:
    """A device host serving on a thread of this process."""

    def __init__(self, cfg: TestbedConfig):
        self.host = DeviceHost(cfg, "rack0", listen="127.0.0.1:0")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.host.serve, args=(self.stop.is_set,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.host.close()


@pytest.fixture
def bench() -> Iterator[tuple[EmulatedTestbed, _Running, DeviceManager]]:
    tb = start_emulated_testbed(load_testbed(CONFIG))
    for wss in tb.switches.values():
        wss.settle_s = 0.005
    running = _Running(_with_host(tb.resolved, "127.0.0.1:1"))
    cfg = _with_host(tb.resolved, running.host.address)
    dm = DeviceManager(cfg)
    dm.connect()
    dm.initialise(default_configuration(cfg))
    yield tb, running, dm
    dm.close()
    running.close()
    tb.close()


def test_the_racks_lasers_are_driven_through_their_host(bench):
    tb, _running, dm = bench
    assert isinstance(dm.drivers["laser0"], RemoteTransceiver)
    assert not isinstance(dm.drivers["laser2"], RemoteTransceiver)
    assert dm.verified.channels == {"laser0": 1, "laser1": 2, "laser2": 3, "laser3": 4}
    assert dm.drivers["laser1"].identify().serial_number == "EMU-laser1"
    result = dm.transact(Configuration({"laser0": 2, "laser1": 1, "laser2": 4, "laser3": 3}))
    assert result.channels == {"laser0": 2, "laser1": 1, "laser2": 4, "laser3": 3}
    assert tb.lasers["laser0"].optical_output().frequency_thz == pytest.approx(193.2)
    assert dm.transceiver_states["laser1"].channel == 1


def test_a_retune_is_one_request_per_host_and_every_laser_locks(bench):
    tb, running, dm = bench
    commands: list[tuple[str, str]] = []
    dm.on_command = lambda device, op, _s: commands.append((device, op))
    assert dm.retune({"laser0": 3, "laser1": 4, "laser2": 1}) == []
    assert ("rack0", "retune") in commands
    assert not any(d in RACK for d, _ in commands), "the rack's lasers went as one request"
    assert tb.lasers["laser1"].optical_output().frequency_thz == pytest.approx(193.4)
    assert dm.verified.channels["laser0"] == 3 and dm.verified.channels["laser2"] == 1


def test_a_host_that_stops_answering_fails_its_lasers_and_changes_nothing(bench):
    tb, running, dm = bench
    dm.host_links["rack0"].timeout_s = 0.5
    before = dict(dm.verified.channels)
    running.close()
    errors = dm.retune({"laser0": 3, "laser1": 4, "laser2": 1})
    assert len(errors) == 2
    assert all("device host rack0 at" in e and "did not answer" in e for e in errors)
    assert dm.verified.channels == before
    assert tb.lasers["laser0"].optical_output().frequency_thz == pytest.approx(193.1)
    # the controller's own laser did move, and was sent back with the rest failing
    assert tb.lasers["laser2"].optical_output().frequency_thz == pytest.approx(193.3)
    assert any(e.device == "laser2" and e.action == "tune back ch 3" and e.ok
               for e in dm.events)


def test_a_request_for_a_device_it_does_not_drive_is_refused_by_name(bench):
    _tb, running, _dm = bench
    reply = running.host.handle(json.dumps({"op": "call", "device": "laser3",
                                            "method": "state", "args": []}).encode())
    assert reply["ok"] is False and "does not drive 'laser3'" in reply["error"]["message"]
    bad = running.host.handle(b"{not json")
    assert bad["ok"] is False and "malformed request" in bad["error"]["message"]


def test_the_testbed_file_names_unknown_hosts_and_wrong_devices():
    text = dump_testbed(load_testbed(CONFIG))
    with pytest.raises(ConfigError, match="driven by device host 'a' already"):
        parse_testbed(text + '[[device_hosts]]\nid = "a"\naddress = "h:1"\ndevices = ["laser0"]\n'
                      '[[device_hosts]]\nid = "b"\naddress = "h:2"\ndevices = ["laser0"]\n')
    with pytest.raises(ConfigError, match="is not host:port"):
        parse_testbed(text + '[[device_hosts]]\nid = "a"\naddress = "h"\ndevices = ["laser0"]\n')
    cfg = parse_testbed(text)
    with pytest.raises(ConfigError, match="no device host 'rack9'"):
        DeviceHost(cfg, "rack9")
    open_wire = _with_host(cfg, "0.0.0.0:0")
    with pytest.raises(ConfigError, match="is not loopback.*--insecure"):
        DeviceHost(open_wire, "rack0")


def test_the_cli_host_emulates_its_lasers_serves_and_stops_on_sigterm(tmp_path):
    cfg = _with_host(load_testbed(CONFIG), "127.0.0.1:1")
    path = tmp_path / "rack.toml"
    path.write_text(dump_testbed(cfg), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "oddl", "devices", "host", "--config",
                             str(path), "--host", "rack0", "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["ready"] and ready["devices"] == list(RACK)
        link_cfg = _with_host(cfg, ready["address"])
        dm = DeviceManager(link_cfg, drivers={d.id: None for d in cfg.devices
                                               if d.id not in RACK})
        dm.connect()
        try:
            assert dm.drivers["laser0"].set_channel(5, timeout=5.0) > 0
            assert dm.drivers["laser0"].state().channel == 5
            with pytest.raises(DeviceError, match="is not a transmitter call"):
                dm.host_links["rack0"].call("laser0", "close", [], 1.0)
        finally:
            dm.drivers = {k: v for k, v in dm.drivers.items() if v is not None}
            dm.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
