"""What the bucket tests share: the agent's two sockets on a thread (`BucketSockets`), a short
private folder for them (the `folder` fixture, in conftest.py), an emulated testbed with four agents in this process (`Bed`), and
what /proc and /dev/shm say about a process's buckets."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
from pathlib import Path

import zmq
from helpers import EMULATED

from oddl.agents.agent import Agent
from oddl.agents.local_api import wire as localapi
from oddl.agents.local_api.bucket_server import BucketRegistry, BucketServer
from oddl.common import memfd
from oddl.common.config import load_testbed
from oddl.common.shm import creator_pid, shm_dir
from oddl.controller.server import ControllerServer
from oddl.drivers.emulators.host import start_emulated_testbed
from oddl.launch.testbed import write_config
from oddl.operator.client import OperatorClient


class BucketSockets:
    """The agent's two sockets: a local API ROUTER (never answered here) and the bucket
    socket beside it, served on a thread."""

    def __init__(self, folder: Path, group: str | None = None):
        self.api = zmq.Context.instance().socket(zmq.ROUTER)
        self.api.setsockopt(zmq.LINGER, 0)
        self.address = localapi.bind(self.api, f"ipc://{folder}/n0.sock", "n0", group)
        self.registry = BucketRegistry()
        self.server = BucketServer(self.address, self.registry, "n0")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.server.serve, args=(self.stop,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.server.close()
        self.registry.close()
        self.api.close(0)
        localapi.unlink(self.address)


def bucket_maps(pid: int | str = "self", size: int | None = None) -> list[str]:
    """The lines of /proc/PID/maps that map a bucket memfd (of `size` bytes, if given)."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if f"/memfd:{memfd.NAME}" not in line:
            continue
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if size is None or hi - lo == size:
            out.append(line)
    return out


def shm_files_of(pid: int) -> list[str]:
    return [n for n in os.listdir(shm_dir()) if creator_pid(n) == pid]


class Bed:
    """Controller, emulators and four agents in this process, one ring job on them."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="oddl-bke-", dir="/tmp"))
        self.folder.chmod(0o700)
        # direct links, as in a lab: TCP streams between the agents
        cfg = load_testbed(write_config(EMULATED, self.folder / "testbed.toml",
                                        {'link = "fabric"': 'link = "direct"'}))
        cfg = dataclasses.replace(cfg, timing=dataclasses.replace(
            cfg.timing, receive_timeout_ms=30_000))
        self.emulators = start_emulated_testbed(cfg)
        self.server = ControllerServer(self.emulators.resolved, "127.0.0.1:0",
                                       metrics_listen=None)
        self.server.start()
        self.nodes = [n.id for n in self.server.cfg.nodes]
        self.agents: dict[str, Agent] = {}
        for node in self.nodes:
            self.start_agent(node)
        self.operator = OperatorClient(self.server.address)
        self.job = self.operator.submit("buckets", [], "ring", "ideal")

    def api(self, node: str) -> str:
        return f"ipc://{self.folder}/{node}.sock"

    def start_agent(self, node: str) -> Agent:
        agent = Agent(self.server.cfg, node, self.server.address, local_api=self.api(node))
        agent.start()
        self.agents[node] = agent
        return agent

    def close(self) -> None:
        self.operator.close()
        for agent in self.agents.values():
            agent.close()
        self.server.stop()
        self.emulators.close()
        for p in self.folder.iterdir():
            p.unlink()
        self.folder.rmdir()
