"""The agent's link to the controller when the agent stops under its own threads."""

from __future__ import annotations

import threading
from typing import Any

from helpers import EMULATED

from oddl.agents.controller_link import ControllerLink
from oddl.common.config import load_testbed


def test_a_heartbeat_caught_by_close_ends_quietly():
    """`Agent.close` sets `stop` and closes the channel while a beat may be half way (under
    load the join times out and the beat goes on): the thread ends without an exception."""
    stop = threading.Event()
    link = ControllerLink(load_testbed(EMULATED), "n0", "127.0.0.1:1", None, stop)
    link.heartbeat_s = 0.001
    errors: list[BaseException] = []
    beats = 0

    def counters_then_close() -> dict[str, Any]:
        nonlocal beats
        beats += 1
        stop.set()
        link.close()  # the beat's RPC now meets a closed channel
        return {}

    def run() -> None:
        try:
            link.heartbeat_loop(counters_then_close, lambda: None)
        except BaseException as exc:  # noqa: BLE001 - the test records what escapes
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert beats == 1
    assert errors == []
