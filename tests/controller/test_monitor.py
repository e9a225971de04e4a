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


def test_no_agent_is_declared_dead_while_heartbeats_are_read_late(tmp_path: Path) -> None:
    # after a controller restart its loop ticks on time but answers heartbeats late: the
    # agents are not silent, the controller is behind (decision record 0034)
    path = tmp_path / "cp.toml"
    path.write_text(control_plane(4), encoding="utf-8")
    cfg = load_testbed(path)
    service = ControllerService(cfg, DeviceManager(cfg, drivers={}))
    service.loop_lag = lambda: 0.0
    registry = service.core.registry
    for n in ("n0", "n1", "n2"):
        service.core.register(pb.RegisterAgentRequest(node_id=n))
    interval_ns = round(cfg.controller.heartbeat_s * 1e9)
    sessions = {n: registry.agents[n].session for n in ("n0", "n1", "n2")}
    # n0's and n1's beats sent five intervals ago are read only now; n2 has a wrong clock
    for n in ("n0", "n1"):
        registry.heartbeat(pb.HeartbeatRequest(node_id=n, session=sessions[n],
                                               sent_ns=time.time_ns() - 5 * interval_ns))
    later = time.monotonic() + 10 * cfg.controller.heartbeat_s  # all silent by then
    assert not service.sweep(later)
    assert not any(registry.dead(n) for n in ("n0", "n1", "n2"))
    assert service.core.errors["sweep held: heartbeats read late"] == 1
    # beats read on time again for two periods (the late ones age out); one agent's clock
    # far off holds nothing (the median)
    held = []
    for _ in range(2):
        for n, off in (("n0", 0), ("n1", 0), ("n2", 50 * interval_ns)):
            registry.heartbeat(pb.HeartbeatRequest(node_id=n, session=sessions[n],
                                                   sent_ns=time.time_ns() - off))
        held.append(not service.sweep(later))
    assert held == [True, False]
    assert all(registry.dead(n) for n in ("n0", "n1", "n2"))
    service.close()
