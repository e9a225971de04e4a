"""`oddl status` of agents that never registered: "never registered" in the table and the
watch, null in --json (the controller sends -1 on the wire)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from oddl.common.config import load_testbed
from oddl.controller.agent_registry import AgentRegistry
from oddl.launch.testbed import DEFAULT_TESTBED
from oddl.operator.client import _as_dict, format_status, registered_ages
from oddl.operator.watch import _agents
from oddl.protos import oddl_pb2 as pb


def _status_of_a_controller_nobody_registered_with() -> dict[str, Any]:
    cfg = load_testbed(DEFAULT_TESTBED)
    registry = AgentRegistry(cfg, lambda *a, **k: None)
    wire = _as_dict(pb.Status(testbed=cfg.name, agents=registry.status(now=100.0)))
    assert {a["last_heartbeat_age_s"] for a in wire["agents"]} == {-1.0}   # as sent
    return registered_ages(wire)


def test_never_registered_is_said_not_minus_one() -> None:
    status = _status_of_a_controller_nobody_registered_with()
    assert [a["last_heartbeat_age_s"] for a in status["agents"]] == [None] * 4
    assert '"last_heartbeat_age_s": null' in json.dumps(status)
    text = format_status(status)
    assert text.count("never registered") == 4 and "-1" not in text
    console = Console(width=160, record=True)
    console.print(_agents(status))
    shown = console.export_text()
    assert shown.count("never registered") == 4 and "-1" not in shown


def test_a_registered_agent_keeps_its_age() -> None:
    status = registered_ages({"agents": [
        {"node_id": "n0", "alive": True, "last_heartbeat_age_s": 0.25, "clock_offset_s": 0.0,
         "gate_error_p50_s": 0.0, "gate_error_p99_s": 0.0, "collectives_done": "0",
         "collectives_failed": "0"}]})
    assert status["agents"][0]["last_heartbeat_age_s"] == 0.25
    assert "0.25s" in format_status(status) and "never" not in format_status(status)
