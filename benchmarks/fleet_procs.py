"""The benchmark's agents in one process or spread over several (bench_control_plane.py).

A thousand agents on one Python thread are slower than a thousand agent processes: at 1024
the fleet's own loop falls behind reading what the controller sends, its heartbeats go late
and the controller declares its agents dead. `ProcCrowd` spreads the agents over P worker
processes (this file run as a script), each a `LocalCrowd`, driven by one JSON line per
command on its stdin and answered on its stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from oddl.launch.fleet import Fleet
from oddl.protos import oddl_pb2 as pb


def _matches(kind: str, job: str) -> Any:
    def match(e: pb.ScheduleEvent) -> bool:
        if e.WhichOneof("event") != kind:
            return False
        return (e.assigned.job.id if kind == "assigned" else getattr(e, kind).job_id) == job
    return match


class LocalCrowd:
    """The agents of `nodes` on this process's event loop."""

    def __init__(self, address: str, nodes: list[str], heartbeat_s: float):
        self.nodes = nodes
        self.fleet = Fleet(address, nodes, heartbeat_s=heartbeat_s)

    async def start(self) -> None:
        await self.fleet.start()

    async def close(self) -> None:
        await self.fleet.close()

    async def stats(self) -> dict[str, Any]:
        return {"heartbeats": self.fleet.heartbeats, "errors": dict(self.fleet.errors),
                "beat_gap_max_s": round(self.fleet.beat_gap_max_s, 2)}

    async def heard(self, kind: str, job: str, since_ns: int, timeout: float) -> dict[str, Any]:
        """When each agent first heard `kind` of `job` (ns), the largest one's size, the sum
        of their sizes and the errors of gos."""
        got = await self.fleet.wait_all(_matches(kind, job), timeout, since_ns)
        sizes = [h.event.ByteSize() for h in got.values()]
        errors = sorted({h.event.go.error for h in got.values()} - {""}) if kind == "go" else []
        return {"at": [h.at_ns for h in got.values()], "bytes": max(sizes),
                "bytes_total": sum(sizes), "errors": errors}

    async def ready_all(self, job: str, seq: int, shape: list[int]) -> None:
        await self.fleet.ready_all(job, seq, shape)

    async def registrations(self) -> dict[str, int]:
        return {a.node: a.registrations for a in self.fleet.agents.values()}

    async def beats(self) -> dict[str, int]:
        return {a.node: a.beats for a in self.fleet.agents.values()}

    async def kill(self, nodes: list[str]) -> None:
        await self.fleet.kill([n for n in nodes if n in self.fleet.agents])


class ProcCrowd:
    """The agents of `nodes` spread over `procs` worker processes."""

    def __init__(self, address: str, nodes: list[str], heartbeat_s: float, procs: int):
        self.nodes = nodes
        self._argv = [[sys.executable, __file__, address, str(heartbeat_s),
                       ",".join(nodes[k::procs])] for k in range(procs)]
        self._workers: list[asyncio.subprocess.Process] = []

    async def start(self) -> None:
        for argv in self._argv:
            self._workers.append(await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                limit=1 << 24))
        await self._all({"op": "start"})

    async def _ask(self, w: asyncio.subprocess.Process, command: dict[str, Any]) -> Any:
        assert w.stdin is not None and w.stdout is not None
        w.stdin.write((json.dumps(command) + "\n").encode())
        await w.stdin.drain()
        line = await w.stdout.readline()
        if not line:
            raise RuntimeError(f"a fleet worker ended (exit {await w.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"a fleet worker: {reply['error']}")
        return reply["result"]

    async def _all(self, command: dict[str, Any]) -> list[Any]:
        return list(await asyncio.gather(*(self._ask(w, command) for w in self._workers)))

    async def close(self) -> None:
        try:
            await self._all({"op": "close"})
        finally:
            for w in self._workers:
                await w.wait()

    async def stats(self) -> dict[str, Any]:
        parts = await self._all({"op": "stats"})
        errors: dict[str, int] = {}
        for p in parts:
            for k, v in p["errors"].items():
                errors[k] = errors.get(k, 0) + v
        return {"heartbeats": sum(p["heartbeats"] for p in parts), "errors": errors,
                "beat_gap_max_s": max(p["beat_gap_max_s"] for p in parts)}

    async def heard(self, kind: str, job: str, since_ns: int, timeout: float) -> dict[str, Any]:
        parts = await self._all({"op": "heard", "kind": kind, "job": job, "since": since_ns,
                                 "timeout": timeout})
        return {"at": [t for p in parts for t in p["at"]],
                "bytes": max(p["bytes"] for p in parts),
                "bytes_total": sum(p["bytes_total"] for p in parts),
                "errors": sorted({e for p in parts for e in p["errors"]})}

    async def ready_all(self, job: str, seq: int, shape: list[int]) -> None:
        await self._all({"op": "ready", "job": job, "seq": seq, "shape": shape})

    async def registrations(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in await self._all({"op": "registrations"}):
            out.update(p)
        return out

    async def beats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in await self._all({"op": "beats"}):
            out.update(p)
        return out

    async def kill(self, nodes: list[str]) -> None:
        await self._all({"op": "kill", "nodes": nodes})


async def _serve(address: str, heartbeat_s: float, nodes: list[str]) -> None:
    """A worker: a LocalCrowd driven by JSON lines on stdin."""
    crowd = LocalCrowd(address, nodes, heartbeat_s)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        c = json.loads(line)
        try:
            if c["op"] == "start":
                result: Any = await crowd.start()
            elif c["op"] == "heard":
                result = await crowd.heard(c["kind"], c["job"], c["since"], c["timeout"])
            elif c["op"] == "ready":
                result = await crowd.ready_all(c["job"], c["seq"], c["shape"])
            elif c["op"] == "registrations":
                result = await crowd.registrations()
            elif c["op"] == "beats":
                result = await crowd.beats()
            elif c["op"] == "kill":
                result = await crowd.kill(c["nodes"])
            elif c["op"] == "stats":
                result = await crowd.stats()
            else:
                await crowd.close()
                print(json.dumps({"result": None}), flush=True)
                return
            print(json.dumps({"result": result}), flush=True)
        except Exception as exc:  # the parent reports it
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], float(sys.argv[2]), sys.argv[3].split(",")))
