"""docs/how-to/lab-bring-up.md, steps 7 and 8 of "The procedure": jobs, training processes on every host calling
`AgentClient("ipc:///run/oddl/agent-nN.sock").allreduce(...)`, DDP on the `oddl` backend."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.hosts import HOST_IF
from lab.procedure import torchrun, torchrun_elastic
from lab.report import CheckFailed
from lab.rig import Rig
from lab.services import last_lines
from lab.shell import wait_until
from lab.steps import TESTBED, ok_or_fail


def submit(rig: Rig, collective: str, network: str | None = None) -> str:
    more = ["--network", network] if network else []
    done = rig.oddl(rig.plan.controller, "jobs", "submit", "--collective", collective, *more,
                    "--config", TESTBED, "--json")
    ok_or_fail(done, f"oddl jobs submit --collective {collective} {' '.join(more)}".strip())
    return str(json.loads(done.stdout)["id"])


def cancel(rig: Rig, job: str) -> str:
    return ok_or_fail(rig.oddl(rig.plan.controller, "jobs", "cancel", job, "--config", TESTBED),
                      f"oddl jobs cancel {job}")


def api(node: str) -> str:
    return f"ipc:///run/oddl/agent-{node}.sock"


@dataclass
class Calls:
    """Every call of the training processes: exact, wrong, failed with a reason."""

    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exact(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("ok")]

    @property
    def wrong(self) -> list[dict[str, Any]]:
        return [r for r in self.records if "wrong" in r]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.records if "error" in r]

    def silent(self) -> list[dict[str, Any]]:
        """Failures whose message names nothing (an empty or next to empty `reason`)."""
        return [r for r in self.failed if len(str(r.get("reason", "")).strip()) < 8]

    def summary(self) -> str:
        return (f"{len(self.records)} calls: {len(self.exact)} exact, {len(self.wrong)} wrong, "
                f"{len(self.failed)} failed with a reason")


def start_workers(rig: Rig, job: str, tag: str, *, count: int = 0, elements: int = 1000,
                  stop_file: Path | None = None) -> list[subprocess.Popen[bytes]]:
    procs = []
    for rank, host in enumerate(rig.plan.training_hosts):
        assert host.node is not None
        args = ["--api", api(host.node), "--rank", str(rank), "--nodes",
                str(len(rig.plan.nodes)), "--job", job, "--elements", str(elements)]
        args += ["--count", str(count)] if count else ["--stop-file", str(stop_file)]
        procs.append(rig.worker(host, "allreduce_worker.py", args, f"{tag}-{host.name}.jsonl"))
    return procs


def read_calls(rig: Rig, tag: str) -> Calls:
    calls = Calls()
    for host in rig.plan.training_hosts:
        path = rig.logs / f"{tag}-{host.name}.jsonl"
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("{"):
                calls.records.append({**json.loads(line), "host": host.name})
    return calls


def stop_together(rig: Rig, tag: str, stop_file: Path,
                  procs: list[subprocess.Popen[bytes]]) -> None:
    """Ask the training processes to stop after one and the same collective (a few steps
    past the furthest one seen), so no rank is left waiting for a call the others never make."""
    steps = [int(r["step"]) for r in read_calls(rig, tag).records]
    write_stop(stop_file, str(max(steps, default=0) + 20))
    try:
        wait_all(procs, 60)
    except Exception:
        write_stop(stop_file, "")
        wait_all(procs, 90)


def write_stop(stop_file: Path, text: str) -> None:
    """Replace the stop file whole, so no process reads it half written (empty: stop now)."""
    tmp = stop_file.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(stop_file)


def wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    wait_until("training processes to finish",
               lambda: True if all(p.poll() is not None for p in procs) else None, timeout_s)


def exact_allreduces(rig: Rig, job: str, tag: str, count: int, elements: int) -> str:
    """`count` all-reduces on every host; every one must be the exact sum."""
    procs = start_workers(rig, job, tag, count=count, elements=elements)
    wait_all(procs, 300)
    return all_exact(rig, tag, count)


def torch_allreduces(rig: Rig, tag: str, count: int, elements: int, port: int,
                     job: str | None = None) -> str:
    """The same `count` all-reduces as `dist.all_reduce` under torchrun on every host, its
    static rendezvous on the first at `port`: on torch's gloo backend (what a user would run
    instead, on the same hosts and links; on the host's data interface), or with `job` on
    the `oddl` backend. Every one must be the exact sum."""
    master = rig.plan.training_hosts[0].address
    procs = []
    for rank, host in enumerate(rig.plan.training_hosts):
        assert host.node is not None
        launcher = torchrun(len(rig.plan.nodes), rank, master, port=port)
        env = ({"GLOO_SOCKET_IFNAME": HOST_IF} if job is None
               else {"ODDL_LOCAL_API": api(host.node), "ODDL_JOB": job})
        procs.append(rig.worker(
            host, "torch_allreduce.py", ["--backend", "gloo" if job is None else "oddl",
                                         "--elements", str(elements), "--count", str(count)],
            f"{tag}-{host.name}.jsonl", env=env, argv0=launcher[0],
            launcher_args=launcher[1:-1]))
    wait_all(procs, 300)
    return all_exact(rig, tag, count)


def all_exact(rig: Rig, tag: str, count: int) -> str:
    """The calls of `tag`: `count` on every host, every one the exact sum, else CheckFailed."""
    calls = read_calls(rig, tag)
    want = count * len(rig.plan.nodes)
    if len(calls.exact) != want or calls.wrong or calls.failed:
        first = (calls.wrong or calls.failed or [{}])[0]
        raise CheckFailed(f"{calls.summary()} (want {want} exact); first: {first}")
    return calls.summary()


def shm_clean(rig: Rig) -> str:
    """No bucket left in any host's /dev/shm once the training processes are gone (each
    check counts the files that appeared since the previous one)."""
    left = {h.name: {p.name for p in (rig.h.root(h) / "dev/shm").glob("oddl-bucket-*")}
            for h in rig.plan.training_hosts}
    new = {h: names - rig.seen_buckets.get(h, set()) for h, names in left.items()}
    rig.seen_buckets = left
    if any(new.values()):
        counts = ", ".join(f"{h} {len(n)}" for h, n in new.items() if n)
        size = sum((rig.h.root(rig.plan.host(h)) / "dev/shm" / n).stat().st_size
                   for h, names in new.items() for n in names)
        raise CheckFailed(f"{sum(len(n) for n in new.values())} oddl-bucket-* files "
                          f"({size / 1e6:.1f} MB) outlived their processes: {counts}")
    return "no oddl-bucket-* left on any host"


def ddp(rig: Rig, job: str) -> str:
    """torchrun, one rank per host, static master address; every rank's parameters identical
    and equal to one process trained on the whole batch (float64, summation order apart)."""
    master = rig.plan.training_hosts[0].address
    return _ddp_run(rig, job, "ddp", lambda rank: torchrun(len(rig.plan.nodes), rank, master))


def ddp_elastic(rig: Rig, job: str) -> str:
    """The same training under torchrun's elastic form: one command on every host, a c10d
    rendezvous on the first (ranks by order of arrival, not by host), `--max-restarts 1`."""
    endpoint = rig.plan.training_hosts[0].address
    run_id = f"lab-{job}"
    hosts = rig.plan.training_hosts
    return _ddp_run(rig, job, "elastic", lambda index: torchrun_elastic(
        len(rig.plan.nodes), endpoint, run_id, hosts[index].address, holds_store=index == 0))


def _ddp_run(rig: Rig, job: str, tag: str, launcher_of: Callable[[int], list[str]]) -> str:
    """Train on every training host with `launcher_of(host index)`, then compare each rank's
    parameters with each other and with one process trained on the whole batch."""
    out = rig.plan.run_dir / "out"  # 1777: the training user writes there
    procs = []
    for rank, host in enumerate(rig.plan.training_hosts):
        assert host.node is not None
        launcher = launcher_of(rank)  # the page's command
        procs.append(rig.worker(
            host, "ddp_train.py", ["--out", str(out / f"{tag}-{host.name}.json")],
            f"{tag}-{host.name}.log", argv0=launcher[0],
            env={"ODDL_LOCAL_API": api(host.node), "ODDL_JOB": job},
            launcher_args=launcher[1:-1]))
    wait_all(procs, 300)
    bad = [h.name for h, p in zip(rig.plan.training_hosts, procs, strict=True) if p.returncode]
    if bad:
        logs = rig.logs / f"{tag}-{bad[0]}.log"
        raise CheckFailed(f"torchrun failed on {bad}: {last_lines(logs.read_text(), 4)}")
    ref = rig.worker(rig.plan.controller, "ddp_train.py",
                     ["--reference", str(len(rig.plan.nodes)),
                      "--out", str(out / f"{tag}-ref.json")], f"{tag}-reference.log")
    wait_all([ref], 120)
    return _compare_params(out, tag, [h.name for h in rig.plan.training_hosts])


def _compare_params(out: Path, tag: str, hosts: list[str]) -> str:
    ranks = [json.loads((out / f"{tag}-{h}.json").read_text())["params"] for h in hosts]
    if any(r != ranks[0] for r in ranks[1:]):
        raise CheckFailed("the ranks' trained parameters differ")
    ref = json.loads((out / f"{tag}-ref.json").read_text())["params"]
    got = [float.fromhex(v) for group in ranks[0] for v in group]
    want = [float.fromhex(v) for group in ref for v in group]
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    if worst > 1e-9:
        raise CheckFailed(f"parameters differ from the single-process reference by {worst:.3g}")
    return (f"{len(got)} parameters identical on {len(hosts)} ranks; max |Δ| to the "
            f"single-process reference {worst:.1e}")
