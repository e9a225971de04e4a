"""The heartbeat monitor holds its verdicts while the server's event loop is behind: the
heartbeats it would miss may be waiting there unread (decision record 0032)."""

from __future__ import annotations

import time
from pathlib import Path

from oddl.common.config import load_testbed
from oddl.controller.devices import DeviceManager
from oddl.controller.servicer import ControllerService
from oddl.launch.shapes import control_plane
from oddl.protos import oddl_pb2 as pb


def test_no_agent_is_declared_dead_while_the_loop_is_behind(tmp_path: Path) -> None:
    path = tmp_path / "cp.toml"
    path.write_text(control_plane(4), encoding="utf-8")
    cfg = load_testbed(path)
    service = ControllerService(cfg, DeviceManager(cfg, drivers={}))
    for n in ("n0", "n1"):
        service.core.register(pb.RegisterAgentRequest(node_id=n))
    later = time.monotonic() + 10 * cfg.controller.heartbeat_s  # both silent by then
    service.loop_lag = lambda: 2 * cfg.controller.heartbeat_s
    assert not service.sweep(later)
    assert not service.core.registry.dead("n0")
    assert service.core.errors["sweep held: event loop behind"] == 1
    service.loop_lag = lambda: 0.0  # caught up, and still nothing heard: dead
    assert service.sweep(later)
    assert service.core.registry.dead("n0") and service.core.registry.dead("n1")
    service.close()
