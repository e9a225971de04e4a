"""A starting agent keeps asking a controller that does not answer its registration (not up
yet, or busy with hundreds of others) for a while, each retry logged, instead of exiting at
the first timeout; then it fails naming the address."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from helpers import EMULATED

from oddl.agents.agent import Agent
from oddl.common.config import load_testbed
from oddl.common.errors import ControllerUnavailable
from oddl.controller.server import ControllerServer
from oddl.drivers.emulators.host import start_emulated_testbed
from oddl.launch.processes import free_port


def test_an_agent_started_before_its_controller_registers_once_it_is_up(caplog):
    tb = start_emulated_testbed(load_testbed(EMULATED))
    address = f"127.0.0.1:{free_port()}"
    agent = Agent(tb.resolved, "n0", address)
    errors: list[BaseException] = []

    def register() -> None:
        try:
            agent.register(patience_s=120)
        except BaseException as exc:  # the assertion below reports it
            errors.append(exc)

    caplog.set_level(logging.WARNING, logger="oddl.agents.agent")
    thread = threading.Thread(target=register)
    thread.start()
    server = None
    try:
        deadline = time.monotonic() + 60
        while not any("asking again" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline and thread.is_alive(), errors
            time.sleep(0.05)
        server = ControllerServer(tb.resolved, address, metrics_listen=None)
        server.start()
        thread.join(120)
        assert not thread.is_alive() and not errors, errors
        assert agent.session
    finally:
        agent.close()
        if server is not None:
            server.stop()
        tb.close()


def test_an_agent_whose_controller_never_answers_fails_naming_it():
    tb = start_emulated_testbed(load_testbed(EMULATED))
    address = f"127.0.0.1:{free_port()}"
    agent = Agent(tb.resolved, "n0", address)
    try:
        with pytest.raises(ControllerUnavailable, match=address):
            agent.register(patience_s=1.0)
    finally:
        agent.close()
        tb.close()
