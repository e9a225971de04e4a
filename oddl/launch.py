"""Start the emulated testbed's processes: emulators and fabric, controller, one agent a node.

The same commands a lab runs (`oddl emulate testbed`, `oddl controller serve`, `oddl agent
serve`), each a child of a `ProcessGroup` that stops them; for benchmarks and tools that need
a running testbed and its clients.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import TestbedConfig, load_testbed
from oddl.procs import ProcessGroup, oddl_command


@dataclass
class Launched:
    """A started testbed: the resolved file, the controller's address and each agent's
    ready line (local_api, data_address, metrics), by node id."""

    resolved: Path
    cfg: TestbedConfig
    controller: str
    agents: dict[str, dict[str, Any]]
    emulators: dict[str, Any]


def launch_emulated(group: ProcessGroup, config: Path, workdir: Path) -> Launched:
    """Start the emulator host, the controller and every node's agent in `group`."""
    resolved = workdir / "testbed.resolved.toml"
    emulators = group.start("emulators", oddl_command(
        "emulate", "testbed", "--config", str(config), "--resolved", str(resolved)))
    address = group.start("controller", oddl_command(
        "controller", "serve", "--config", str(resolved), "--listen", "127.0.0.1:0"))["address"]
    cfg = load_testbed(resolved)
    agents = {n.id: group.start(f"agent-{n.id}", oddl_command(
        "agent", "serve", "--config", str(resolved), "--node", n.id, "--controller", address))
        for n in cfg.nodes}
    return Launched(resolved, cfg, address, agents, emulators)


class RestartableTestbed:
    """An emulated testbed whose processes may be killed, stalled and restarted (fault tests,
    the soak): the controller keeps its state in a file, so a restart resumes it."""

    def __init__(self, workdir: Path, config: Path, heartbeat_s: float = 0.3,
                 agent_timeout_s: float = 30.0):
        from agents.client import AgentClient

        self._client_type = AgentClient
        self.workdir = workdir
        self.agent_timeout_s = agent_timeout_s
        text = config.read_text().replace("heartbeat_s = 1.0", f"heartbeat_s = {heartbeat_s}")
        self.config = workdir / "testbed.toml"
        self.config.write_text(text)
        self.group = ProcessGroup(workdir)
        self.resolved = workdir / "resolved.toml"
        self.state = workdir / "controller.sqlite"
        try:
            self.emulators = self.group.start("emulators", oddl_command(
                "emulate", "testbed", "--config", str(self.config), "--resolved",
                str(self.resolved)), timeout=60)
            self.address = self.group.start("controller", self._controller_argv("127.0.0.1:0"),
                                            timeout=60)["address"]
            self.cfg = load_testbed(self.resolved)
            self.clients: dict[str, Any] = {}
            self.retired: list[Any] = []
            self.agent_info: dict[str, dict[str, Any]] = {}
            for node in self.cfg.nodes:
                self.start_agent(node.id)
        except BaseException:
            self.group.stop_all()
            raise

    def _controller_argv(self, listen: str) -> list[str]:
        return oddl_command("controller", "serve", "--config", str(self.resolved), "--listen",
                            listen, "--state", str(self.state))

    def proc(self, name: str) -> Any:
        """The newest process started under `name` (``controller``, ``agent-n0``, …)."""
        return next(p for p in reversed(self.group.procs) if p.name == name)

    def start_agent(self, node: str, close_old: bool = True) -> None:
        """Start (or restart) a node's agent and connect a client to it; the old client is
        closed, or kept in `retired` (closed by `close()`) for a caller whose threads may
        still be inside it."""
        verbose = ("-v",) if os.environ.get("ODDL_SOAK_VERBOSE") else ()
        info = self.group.start(f"agent-{node}", oddl_command(
            *verbose, "agent", "serve", "--config", str(self.resolved), "--node", node,
            "--controller", self.address), timeout=60)
        self.agent_info[node] = info
        old = self.clients.pop(node, None)
        if old is not None:
            if close_old:
                old.close()
            else:
                self.retired.append(old)
        self.clients[node] = self._client_type(info["local_api"],
                                                timeout_s=self.agent_timeout_s)

    def restart_emulators(self) -> None:
        """Start the emulator host again where the old one was (`--reuse`): same device
        ports, fabric address and light table."""
        self.group.start("emulators", oddl_command(
            "emulate", "testbed", "--config", str(self.config), "--resolved", str(self.resolved),
            "--reuse", str(self.resolved)), timeout=60)

    def data_port(self, node: str) -> int:
        """The TCP port a node's agent receives its data streams on."""
        return int(str(self.agent_info[node]["data_address"]).rsplit(":", 1)[1])

    def restart_controller(self) -> None:
        """Start the controller again on its old address, from its state file."""
        self.group.start("controller", self._controller_argv(self.address), timeout=60)

    def close(self) -> None:
        """Stop every process."""
        for c in (*self.clients.values(), *self.retired):
            c.close()
        self.group.stop_all()
