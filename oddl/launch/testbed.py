"""Start the emulated testbed's processes: emulators and fabric, controller, one agent a node.

The one start-up sequence that `oddl demo`, `oddl demo --train`, `oddl testbed up`, the
benchmarks and the end-to-end tests share. Each process runs the same command a lab runs
(`oddl emulate testbed`, `oddl controller serve`, `oddl agent serve`) as a child of a
`ProcessGroup` that stops them in reverse order.

- `launch_emulated`: start everything in a given group; returns what the processes reported.
- `RunningTestbed`: the same in a group of its own, with an operator client and one agent
  client a node; closes everything (a context manager).
- `RestartableTestbed`: processes that fault tests and the soak kill, stall and restart.
- `write_config`: a copy of a testbed file with edits (line rate, heartbeat, security, ...).
- `fabric_stats`: the emulated fabric's counters; `torchrun_env`: a training rank's
  environment.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oddl.common.config import TestbedConfig, load_testbed
from oddl.common.errors import ConfigError
from oddl.controller.testbed_model import topology_from_config
from oddl.launch.processes import Child, ProcessGroup, oddl_command
from oddl.launch.shipped import shipped_testbed

if TYPE_CHECKING:  # imported where used: `oddl testbed up` needs neither
    from oddl.agents.client.agent_client import AgentClient
    from oddl.operator.client import OperatorClient

logger = logging.getLogger(__name__)

DEFAULT_TESTBED = shipped_testbed("emulated-4node.toml")
"""The emulated four-node testbed of `oddl demo`, `oddl testbed up` and the benchmarks: the
package's own copy (oddl/testbeds/, also reachable as deploy/testbeds/ in the source tree)."""

TRACE_GRACE_S = 60.0
"""How long a recording process may take to write its trace after SIGTERM."""

LOCAL = "127.0.0.1:0"
"""Listen on loopback, on a port the kernel picks."""

Progress = Callable[[int, int, str], None]
"""Called before each step of the start: (step from 1, steps in all, what starts), what being
``emulated devices and fabric``, ``controller`` or the agents, started together (``agents
n0, n1, n2, n3``; ``agent n0`` alone; ``40 agents, n0 to n39``)."""


# ---- the three commands ---------------------------------------------------------------------


def emulators_command(config: Path, resolved: Path, reuse: Path | None = None) -> list[str]:
    """argv of the emulator host; it writes the testbed file with real addresses to
    `resolved`. `reuse`: an older resolved file whose ports to take again (a restart)."""
    extra = ("--reuse", str(reuse)) if reuse is not None else ()
    return oddl_command("emulate", "testbed", "--config", str(config), "--resolved",
                        str(resolved), *extra)


def controller_command(resolved: Path, listen: str = LOCAL,
                       state: Path | None = None) -> list[str]:
    """argv of the controller; with `state`, it keeps its jobs in that file across restarts."""
    extra = ("--state", str(state)) if state is not None else ()
    return oddl_command("controller", "serve", "--config", str(resolved), "--listen", listen,
                        *extra)


def agent_command(resolved: Path, node: str, controller: str, verbose: bool = False) -> list[str]:
    """argv of one node's agent, linked to the controller at `controller`."""
    return oddl_command(*(("-v",) if verbose else ()), "agent", "serve", "--config",
                        str(resolved), "--node", node, "--controller", controller)


# ---- start-up -------------------------------------------------------------------------------


@dataclass
class Launched:
    """A started testbed: the resolved file, the controller's address and each agent's
    ready line (local_api, data_address, metrics), by node id."""

    resolved: Path
    cfg: TestbedConfig
    controller: str
    agents: dict[str, dict[str, Any]]
    emulators: dict[str, Any]
    controller_info: dict[str, Any] = field(default_factory=dict)
    """The controller's ready line (address, metrics)."""

    @property
    def node_ids(self) -> list[str]:
        """The nodes in the testbed file's order."""
        return [n.id for n in self.cfg.nodes]

    @property
    def apis(self) -> list[str]:
        """Each agent's local API address, in node order."""
        return [self.agents[n]["local_api"] for n in self.node_ids]

    @property
    def fabric(self) -> str:
        """The emulated fabric's address, or "" without one."""
        return str(self.emulators.get("fabric", ""))

    @property
    def metrics(self) -> dict[str, str]:
        """The metrics address of the controller (key ``controller``) and of each agent."""
        return {"controller": self.controller_info.get("metrics", ""),
                **{n: a.get("metrics", "") for n, a in self.agents.items()}}


def launch_emulated(group: ProcessGroup, config: Path, workdir: Path, *,
                    state: Path | None = None, detach: bool = False, timeout: float = 30.0,
                    verbose_agents: bool = False, progress: Progress | None = None,
                    resolved_name: str = "testbed.resolved.toml",
                    agent_env: Mapping[str, dict[str, str]] | None = None,
                    trace: Path | None = None) -> Launched:
    """Start the emulator host, the controller and every node's agent in `group`.

    `state`: the controller's state file; `detach`: the processes outlive this one (`oddl
    testbed up`); `timeout`: seconds each may take to become ready; `agent_env`: extra
    environment variables by node id (`ODDL_CLOCK_SHIFT_US` for a rehearsal, say); `trace`:
    every process records its timeline into that folder (docs/how-to/trace-a-run.md). The caller
    stops the group (also when this raises: what started is in it).
    """
    cfg = load_testbed(config)  # a broken file fails here, before any start
    topology_from_config(cfg)  # and one the controller cannot schedule
    total = 3
    say = progress or (lambda step, steps, what: None)
    resolved = workdir / resolved_name
    say(1, total, "emulated devices and fabric")
    rec = ["--trace", str(trace)] if trace is not None else []
    emulators = group.start("emulators", emulators_command(config, resolved) + rec,
                            timeout=timeout, detach=detach)
    start_device_hosts(group, resolved, timeout=timeout, detach=detach)
    say(2, total, "controller")
    ctl = group.start("controller", controller_command(resolved, state=state) + rec,
                      timeout=timeout, detach=detach)
    cfg = load_testbed(resolved)
    ids = [node.id for node in cfg.nodes]
    say(3, total, _agents_named(ids))
    ready = group.start_together(
        [Child(f"agent-{node}", agent_command(resolved, node, ctl["address"], verbose_agents)
               + rec, (agent_env or {}).get(node)) for node in ids],
        timeout=timeout, detach=detach)
    return Launched(resolved, cfg, ctl["address"], dict(zip(ids, ready, strict=True)),
                    emulators, ctl)


def _agents_named(ids: list[str]) -> str:
    """The agents of `ids` as the progress names them."""
    if len(ids) == 1:
        return f"agent {ids[0]}"
    if len(ids) <= 8:
        return f"agents {', '.join(ids)}"
    return f"{len(ids)} agents, {ids[0]} to {ids[-1]}"


def start_device_hosts(group: ProcessGroup, resolved: Path, *, timeout: float = 30.0,
                       detach: bool = False) -> dict[str, str]:
    """One `oddl devices host` per `[[device_hosts]]` entry of the resolved file, each on a
    loopback port of its choice and driving the emulator host's lasers; the file is rewritten
    with the addresses they listen on, so the controller started after reaches them (decision
    record 0036). Their addresses by id (none without device hosts)."""
    from dataclasses import replace

    from oddl.common.config import dump_testbed

    cfg = load_testbed(resolved)
    placed = []
    for host in cfg.device_hosts:
        info = group.start(f"device-host-{host.id}", oddl_command(
            "devices", "host", "--config", str(resolved), "--host", host.id, "--listen",
            "127.0.0.1:0"), timeout=timeout, detach=detach)
        placed.append(replace(host, address=str(info["address"])))
    if placed:
        resolved.write_text(dump_testbed(replace(cfg, device_hosts=tuple(placed))),
                            encoding="utf-8")
    return {h.id: h.address for h in placed}


def write_config(source: Path, dest: Path, replace: Mapping[str, str] | None = None,
                 extra: str = "") -> Path:
    """Copy the testbed file `source` to `dest`, replacing each key of `replace` (which must
    occur) by its value and appending `extra`; returns `dest`."""
    text = source.read_text(encoding="utf-8")
    for old, new in (replace or {}).items():
        if old not in text:
            raise ConfigError(f"{source} has no {old!r} to replace")
        text = text.replace(old, new)
    dest.write_text(text + extra, encoding="utf-8")
    return dest


def fabric_stats(address: str, timeout_ms: int = 2000) -> dict[str, Any]:
    """The emulated fabric's counters (delivered, lost, streams, the OptINC devices' …), or
    {} when it does not answer within `timeout_ms`."""
    import zmq

    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart([b"S"])
        if sock.poll(timeout_ms):
            frames = sock.recv_multipart()
            stats: dict[str, Any] = json.loads(frames[1])
            return stats
        return {}
    finally:
        sock.close(0)


def torchrun_env(rank: int, world: int, port: int, apis: list[str]) -> dict[str, str]:
    """The environment of one training rank as torchrun would set it, with the agents' local
    APIs (ODDL_LOCAL_API, comma-separated by rank) for the oddl torch backend; no fallback."""
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "ODDL_LOCAL_API": ",".join(apis)}
    env.pop("ODDL_TORCH_FALLBACK", None)
    return env


# ---- a running testbed with its clients -----------------------------------------------------


class RunningTestbed:
    """An emulated testbed in a process group of its own, with an operator client
    (`operator`) and one agent client a node (`clients`, node order); `close()` (or leaving
    the ``with`` block) closes the clients and stops every process.

    `agent_timeout_s`: the agent clients' call timeout (None: the client's default);
    `certs`: the operator's mutual-TLS folder (`oddl certs init`), or ""; the other keyword
    arguments go to `launch_emulated`.
    """

    def __init__(self, workdir: Path, config: Path = DEFAULT_TESTBED, *,
                 agent_timeout_s: float | None = 30.0, certs: str = "", **launch: Any):
        from oddl.agents.client.agent_client import AgentClient
        from oddl.operator.client import OperatorClient

        self.workdir = workdir
        self.group = ProcessGroup(workdir, grace=TRACE_GRACE_S if launch.get("trace") else 5.0)
        self.clients: list[AgentClient] = []
        self._operator: OperatorClient | None = None
        try:
            self.launched = launch_emulated(self.group, config, workdir, **launch)
            self.clients = [AgentClient(api) if agent_timeout_s is None else
                            AgentClient(api, timeout_s=agent_timeout_s)
                            for api in self.launched.apis]
            self._operator = OperatorClient(self.launched.controller, certs=certs)
        except BaseException:
            self.close()
            raise

    @property
    def operator(self) -> OperatorClient:
        """The operator client of the controller."""
        assert self._operator is not None  # set once started
        return self._operator

    @property
    def metrics(self) -> dict[str, str]:
        """The metrics address of the controller (key ``controller``) and of each agent."""
        return self.launched.metrics

    @property
    def address(self) -> str:
        """The controller's address."""
        return self.launched.controller

    @property
    def resolved(self) -> Path:
        """The testbed file with the emulators' real addresses."""
        return self.launched.resolved

    @property
    def cfg(self) -> TestbedConfig:
        """The resolved testbed."""
        return self.launched.cfg

    def close(self) -> None:
        """Close the clients and stop every process (newest first)."""
        for c in self.clients:
            c.close()
        if self._operator is not None:
            self._operator.close()
        self.group.stop_all()

    def __enter__(self) -> RunningTestbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RestartableTestbed:
    """An emulated testbed whose processes may be killed, stalled and restarted (fault tests,
    the soak): the controller keeps its state in a file, so a restart resumes it."""

    def __init__(self, workdir: Path, config: Path, heartbeat_s: float = 0.3,
                 agent_timeout_s: float = 30.0):
        from oddl.agents.client.agent_client import AgentClient

        self._client_type = AgentClient
        self.workdir = workdir
        self.agent_timeout_s = agent_timeout_s
        self.config = write_config(config, workdir / "testbed.toml",
                                   {"heartbeat_s = 1.0": f"heartbeat_s = {heartbeat_s}"})
        self.group = ProcessGroup(workdir)
        self.state = workdir / "controller.sqlite"
        self.clients: dict[str, Any] = {}
        self.retired: list[Any] = []
        try:
            launched = launch_emulated(self.group, self.config, workdir, state=self.state,
                                       timeout=60, resolved_name="resolved.toml",
                                       verbose_agents=self._verbose())
            self.resolved, self.cfg = launched.resolved, launched.cfg
            self.emulators, self.address = launched.emulators, launched.controller
            self.agent_info: dict[str, dict[str, Any]] = launched.agents
            for node in self.cfg.nodes:
                self._connect(node.id)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _verbose() -> bool:
        return bool(os.environ.get("ODDL_SOAK_VERBOSE"))

    def proc(self, name: str) -> Any:
        """The newest process started under `name` (``controller``, ``agent-n0``, …)."""
        return next(p for p in reversed(self.group.procs) if p.name == name)

    def start_agent(self, node: str, close_old: bool = True, keep_address: bool = False
                    ) -> None:
        """Start (or restart) a node's agent and connect a client to it; the old client is
        closed, or kept in `retired` (closed by `close()`) for a caller whose threads may
        still be inside it. With `keep_address`, a restarted agent listens where the old one
        did (as a lab's unit with a fixed `--local-api` does) and the node's client stays:
        it reconnects, as a training process's client does."""
        argv = agent_command(self.resolved, node, self.address, self._verbose())
        previous = self.agent_info.get(node)
        if keep_address and previous is not None:
            argv += ["--local-api", str(previous["local_api"])]
        self.agent_info[node] = self.group.start(f"agent-{node}", argv, timeout=60)
        if not (keep_address and previous is not None and node in self.clients):
            self._connect(node, close_old)

    def _connect(self, node: str, close_old: bool = True) -> None:
        old = self.clients.pop(node, None)
        if old is not None:
            if close_old:
                old.close()
            else:
                self.retired.append(old)
        self.clients[node] = self._client_type(self.agent_info[node]["local_api"],
                                                timeout_s=self.agent_timeout_s)

    def restart_emulators(self) -> None:
        """Start the emulator host again where the old one was (`--reuse`): same device
        ports, fabric address and light table."""
        self.group.start("emulators", emulators_command(self.config, self.resolved,
                                                        reuse=self.resolved), timeout=60)

    def data_port(self, node: str) -> int:
        """The TCP port a node's agent receives its data streams on."""
        return int(str(self.agent_info[node]["data_address"]).rsplit(":", 1)[1])

    def restart_controller(self) -> None:
        """Start the controller again on its old address, from its state file."""
        self.group.start("controller", controller_command(self.resolved, self.address,
                                                          self.state), timeout=60)

    def close(self) -> None:
        """Stop every process."""
        for c in (*self.clients.values(), *self.retired):
            c.close()
        self.group.stop_all()
