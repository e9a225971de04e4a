"""Start the emulated testbed's processes: emulators and fabric, controller, one agent a node.

The same commands a lab runs (`oddl emulate testbed`, `oddl controller serve`, `oddl agent
serve`), each a child of a `ProcessGroup` that stops them; for benchmarks and tools that need
a running testbed and its clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oddl.config import TestbedConfig, load_testbed
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
