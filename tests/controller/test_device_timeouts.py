"""The ITLA driver's waits come from the device's entry in the testbed file."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from oddl.common.config import parse_testbed
from oddl.common.errors import ConfigError
from oddl.controller.device_drivers import open_driver

LAB = Path(__file__).resolve().parents[2] / "deploy" / "testbeds" / "lab-4node.toml"


def _lab_with(laser0_extra: str) -> str:
    text = LAB.read_text()
    anchor = 'resource = "/dev/serial/by-id/usb-FTDI_ITLA_0-if00-port0"\n'
    assert anchor in text
    text = text.replace("lock_timeout_s = 5.0 ", "# ").replace("enable_timeout_s = 30.0 ", "# ")
    text = text.replace("startup_timeout_s = 10.0 ", "# ")
    return text.replace(anchor, anchor + laser0_extra)


def test_itla_timeouts_follow_the_testbed_file():
    with socket.create_server(("127.0.0.1", 0)) as server:  # something to open socket:// to
        port = server.getsockname()[1]
        text = _lab_with("lock_timeout_s = 45.0\nenable_timeout_s = 60.0\nstartup_timeout_s = 3.5\n"
                         "timeout_s = 0.8\n")
        cfg = parse_testbed(text)
        dev = next(d for d in cfg.devices if d.id == "laser0")
        dev = type(dev)(**{**dev.__dict__, "resource": f"socket://127.0.0.1:{port}"})
        driver = open_driver(dev)
        try:
            t = driver.link.timeouts
            assert (t.reply_s, t.lock_s, t.enable_s, t.startup_s) == (0.8, 45.0, 60.0, 3.5)
        finally:
            driver.close()


def test_an_impossible_itla_timeout_is_refused_with_the_key():
    with pytest.raises(ConfigError) as err:
        parse_testbed(_lab_with("lock_timeout_s = -1\n"))
    assert "lock_timeout_s" in str(err.value) and "laser0" in str(err.value)
