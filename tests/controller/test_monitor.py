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
    service.loop_lag = lambda: 0.0  # caught up: silence counts from now on (ADR 0034)
    assert service.sweep(later + 0.5)
    assert not service.core.registry.dead("n0")
    assert service.sweep(later + 3 * cfg.controller.heartbeat_s)  # nothing heard since: dead
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
    for k in range(2):
        for n, off in (("n0", 0), ("n1", 0), ("n2", 50 * interval_ns)):
            registry.heartbeat(pb.HeartbeatRequest(node_id=n, session=sessions[n],
                                                   sent_ns=time.time_ns() - off))
        held.append(not service.sweep(later + k))
    assert held == [True, False]
    assert not any(registry.dead(n) for n in ("n0", "n1", "n2"))  # silent 1 s of on time
    assert service.sweep(later + 1 + 3 * cfg.controller.heartbeat_s)
    assert all(registry.dead(n) for n in ("n0", "n1", "n2"))
    service.close()


def test_the_controller_asks_a_thousand_agents_for_fewer_beats(tmp_path: Path) -> None:
    # 1024 agents beating every second would cost 40 % of a core (ADR 0034): the interval it
    # asks for at registration, and its deadline, grow with the testbed's nodes
    from oddl.controller.agent_registry import BEATS_PER_S, heartbeat_interval

    for hosts, interval in ((4, 1.0), (256, 1.0), (1024, 1024 / BEATS_PER_S)):
        path = tmp_path / f"cp{hosts}.toml"
        path.write_text(control_plane(hosts), encoding="utf-8")
        cfg = load_testbed(path)
        assert cfg.controller.heartbeat_s == 1.0 and heartbeat_interval(cfg) == interval
    service = ControllerService(cfg, DeviceManager(cfg, drivers={}))
    service.loop_lag = lambda: 0.0
    service.core.register(pb.RegisterAgentRequest(node_id="n0"))
    assert service.sweep(time.monotonic() + 2.5 * interval)  # 5 s: not yet three beats
    assert not service.core.registry.dead("n0")
    assert service.sweep(time.monotonic() + 3 * interval + 0.1)
    assert service.core.registry.dead("n0")
    service.close()


def test_an_agent_that_has_not_beaten_yet_is_counted_from_the_last_registration(
        tmp_path: Path) -> None:
    # a thousand re-registering after a controller restart: the last replies wait behind the
    # others, and an agent cannot beat before its reply (ADR 0034)
    path = tmp_path / "cp.toml"
    path.write_text(control_plane(4), encoding="utf-8")
    cfg = load_testbed(path)
    service = ControllerService(cfg, DeviceManager(cfg, drivers={}))
    service.loop_lag = lambda: 0.0
    registry, interval = service.core.registry, cfg.controller.heartbeat_s
    for n in ("n0", "n1", "n2"):
        service.core.register(pb.RegisterAgentRequest(node_id=n))
    registry.heartbeat(pb.HeartbeatRequest(node_id="n0", session=registry.agents["n0"].session))
    t = time.monotonic()
    for n in ("n0", "n1"):  # both heard from 2 s before n3 registered
        registry.agents[n].last_seen = t + 2.0
    service.core.register(pb.RegisterAgentRequest(node_id="n3"))
    registry.last_registered = t + 4.0
    registry.agents["n2"].last_seen = t + 1.0
    assert service.sweep(t + 2.0 + 3 * interval + 0.1)
    assert registry.dead("n0")  # it beat, then fell silent: dead on time
    assert not registry.dead("n1") and not registry.dead("n2")  # not beaten yet: the burst
    assert service.sweep(t + 4.0 + 3 * interval + 0.1)
    assert registry.dead("n1") and registry.dead("n2")
    service.close()
