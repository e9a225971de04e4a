"""The testbed file loader: the shipped files load, and every kind of mistake is named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import EMULATED, ROOT

from oddl.cli.main import main
from oddl.common.config import dump_testbed, load_testbed, parse_testbed
from oddl.common.errors import ConfigError

LAB = ROOT / "deploy" / "testbeds" / "lab-4node.toml"


def test_shipped_testbeds_load():
    emu, lab = load_testbed(EMULATED), load_testbed(LAB)
    assert [n.id for n in emu.nodes] == ["n0", "n1", "n2", "n3"]
    assert [n.rx_channel for n in emu.nodes] == [1, 2, 3, 4]
    assert emu.attachment("n2").out_port == 3
    assert all(d.emulated for d in emu.devices)
    assert lab.device("laser0").resource.startswith("/dev/")
    assert lab.device("pm0").resource.startswith("TCPIP0::")
    assert lab.fabric.link == "direct"
    assert emu.meter_taps()[("pm0", 4)] == ("wss0", 4)


def test_round_trip_through_dump():
    cfg = load_testbed(EMULATED)
    again = parse_testbed(dump_testbed(cfg), str(EMULATED))
    assert again == cfg


def _mutate(old: str, new: str, count: int = 1) -> str:
    text = EMULATED.read_text()
    assert old in text, old
    return text.replace(old, new, count)


@pytest.mark.parametrize(("old", "new", "key", "fix"), [
    ("spacing_ghz = 100.0\n", "spacing_ghz = 100.0\nspacng = 3\n", "grid.spacng", "did you mean 'spacing_ghz'"),
    ('id = "n1"', 'id = "n0"', "id", "duplicate node id 'n0'"),
    ('transmitter = "laser2"', 'transmitter = "laser9"', "transmitter", "add a [[devices]] entry"),
    ("rx_thz = 193.3", "rx_thz = 193.33", "rx_thz", "use a grid frequency, e.g. 193.3000 THz"),
    ('from = "wss0.3"\nto = "n2.rx"', 'from = "wss0.7"\nto = "n2.rx"', "fibres[6].from", "no port '7'"),
    ('[fabric]', '[fabrik]', "fabrik", "did you mean [fabric]"),
    ('kind = "wss"', 'kind = "roadm"', "kind", "use one of itla, wss, powermeter"),
    ('[fabric]', '[agent]\ngate_priority = 120\n\n[fabric]', "agent.gate_priority",
     "outside [0, 99]"),
    ('link = "fabric"', 'link = "fabric"\ntransport = "pigeon"', "fabric.transport",
     "not one of streams, relay"),
    ("power_dbm = 10.0\npower_range_dbm = [7.0, 13.0]",
     "power_dbm = 15.0\npower_range_dbm = [7.0, 13.0]", "power_dbm", "safety range"),
    ("rx_thz = 193.4", "rx_thz = 193.3", "rx_channel", "its own channel"),
    ('from = "n3.tx"\nto = "wss0.in"', 'from = "n3.tx"\nto = "n0.rx"', "fibres[3]", "connect node.tx"),
])
def test_mistakes_name_file_key_and_fix(old, new, key, fix):
    with pytest.raises(ConfigError) as err:
        parse_testbed(_mutate(old, new), "bench.toml")
    msg = str(err.value)
    assert msg.startswith("bench.toml: ")
    assert key in msg
    assert fix in msg


def test_missing_fibre_to_receiver_is_named():
    text = _mutate('[[fibres]]\nfrom = "wss0.2"\nto = "n1.rx"\n', "")
    with pytest.raises(ConfigError, match=re.escape("node n1 has no fibre to its receiver")):
        parse_testbed(text, "t.toml")


def test_not_toml_and_missing_file():
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_testbed("[testbed\nname=", "x.toml")
    with pytest.raises(ConfigError, match="cannot read the testbed file"):
        load_testbed("/nonexistent/testbed.toml")


def test_cli_config_check(capsys):
    assert main(["config", "check", str(EMULATED)]) == 0
    assert "ok — testbed 'emulated-4node': 4 nodes" in capsys.readouterr().out
    assert main(["config", "check", str(LAB), "--json"]) == 0
    assert '"link": "direct"' in capsys.readouterr().out


def test_cli_config_check_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(_mutate('transmitter = "laser2"', 'transmitter = "laser9"'))
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and "laser9" in err


def test_agent_gate_scheduling_is_read_and_reported():
    cfg = parse_testbed(_mutate("[fabric]", "[agent]\ngate_priority = 5\ngate_cpu = 0\n\n[fabric]"),
                        "t.toml")
    assert (cfg.agent.gate_priority, cfg.agent.gate_cpu) == (5, 0)
    assert parse_testbed(dump_testbed(cfg), "t.toml").agent == cfg.agent
    # the agent applies it to the calling thread where permitted and says what it got
    import threading
    import types

    from oddl.agents.agent import Agent

    fake = types.SimpleNamespace(cfg=cfg, node_id="n0", gate_scheduling="normal")
    t = threading.Thread(target=Agent._gate_thread_setup, args=(fake,))
    t.start()
    t.join()
    assert "CPU 0" in fake.gate_scheduling and "SCHED_FIFO 5" in fake.gate_scheduling


def test_device_check_interval_is_validated():
    base = (Path(__file__).resolve().parents[2] / "deploy" / "testbeds"
            / "emulated-4node.toml").read_text()
    assert parse_testbed(base).controller.device_check_s == 2.0
    bad = base.replace("heartbeat_s = 1.0", "heartbeat_s = 1.0\ndevice_check_s = -1")
    with pytest.raises(ConfigError, match="device_check_s"):
        parse_testbed(bad)
