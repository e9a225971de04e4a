"""A lab's faults under traffic: a host's link down and up, an agent killed and restarted,
the controller killed and restarted from its state file, a host rebooted. Training processes
on every host call all-reduces the whole time; afterwards every call must have been exact or
have failed with a reason, with the time to detect and the time to recover measured."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from lab import bringup, jobs
from lab.report import CheckFailed, Report
from lab.rig import Rig, kill_group
from lab.services import stop
from lab.shell import LabError, wait_until

# what an error must not say on a lab with direct links (issue 23): the light path and the
# WSS are not in the data path, and an agent whose link came back rejoins by itself
MISLEADING = ("light path", "WSS route", "can rejoin by restarting")
LINK_DOWN_S = 6.0       # longer than three heartbeats of the lab file (1 s)
STEADY_CALLS = 5        # exact calls per host before a fault and after recovery
RECOVERY_DEADLINE_S = 120.0


@dataclass
class Fault:
    """A fault: `inject` breaks something, `clear` mends it (as the lab would); `restart_all`
    when the training processes must start again afterwards (a rebooted host's died)."""

    name: str
    inject: Callable[[], None]
    clear: Callable[[], None]
    restart_all: bool = False


def faults(rig: Rig) -> list[Fault]:
    n1, n2, n3 = (rig.plan.host(n) for n in ("n1", "n2", "n3"))

    def link_down() -> None:
        rig.h.link(n1, up=False)
        time.sleep(LINK_DOWN_S)

    def kill(key: str) -> Callable[[], None]:
        return lambda: stop(rig.services[key], signal.SIGKILL)

    def restart_agent(host: Any) -> Callable[[], None]:
        def go() -> None:
            time.sleep(rig.services[host.node].unit.restart_sec)
            bringup.start_agent(rig, host)
        return go

    def restart_controller() -> None:
        time.sleep(rig.services["controller"].unit.restart_sec)
        bringup.start_controller(rig)

    def reboot() -> None:
        rig.h.host_down(n3)
        rig.h.host_up(n3)

    return [Fault("n1 link down 6 s and up", link_down, lambda: rig.h.link(n1, up=True)),
            Fault("n2 agent SIGKILL, restarted", kill("n2"), restart_agent(n2)),
            Fault("controller SIGKILL, restarted from its state file", kill("controller"),
                  restart_controller),
            Fault("n3 host rebooted", reboot, restart_agent(n3), restart_all=True)]


def _steady(rig: Rig, tag: str, after: float) -> bool | None:
    """True once every host has STEADY_CALLS exact calls started after `after`; False as
    soon as one host has had that many wrong ones (it will not mend by waiting)."""
    calls = jobs.read_calls(rig, tag)
    hosts = [h.name for h in rig.plan.training_hosts]
    wrong = {h: sum(1 for r in calls.wrong if r["host"] == h and r["start"] > after)
             for h in hosts}
    if max(wrong.values()) >= STEADY_CALLS:
        return False
    exact = {h: sum(1 for r in calls.exact if r["host"] == h and r["start"] > after)
             for h in hosts}
    return True if min(exact.values()) >= STEADY_CALLS else None


def run_fault(rig: Rig, fault: Fault, job: str, index: int) -> dict[str, Any]:
    """Traffic, the fault, its repair, traffic again; the calls and the times."""
    tag = f"fault{index}"
    stop_file = rig.plan.run_dir / "out" / f"{tag}.stop"
    procs = jobs.start_workers(rig, job, tag, stop_file=stop_file)
    wait_until(f"{fault.name}: steady traffic before", lambda: _steady(rig, tag, 0), 120)
    t_fault = time.time()
    fault.inject()
    fault.clear()
    t_clear = time.time()
    if fault.restart_all:  # the job is restarted: its launcher kills every rank, starts anew
        for proc in procs:
            kill_group(proc)
        tag, stop_file = f"{tag}b", rig.plan.run_dir / "out" / f"{tag}b.stop"
        procs = jobs.start_workers(rig, job, tag, stop_file=stop_file)
    mended = False
    try:
        mended = bool(wait_until(f"{fault.name}: exact results on every host again",
                                 lambda: _steady(rig, tag, t_clear), RECOVERY_DEADLINE_S))
        if not mended:
            raise LabError(f"wrong results on every call after the repair (from "
                           f"{jobs.read_calls(rig, tag).wrong[0]})")
        bringup.agents_alive(rig, timeout_s=RECOVERY_DEADLINE_S)
        registered_s = time.time() - t_clear  # an upper bound: polled after the traffic mended
    except LabError as exc:
        mended = False
        calls = jobs.read_calls(rig, tag)
        last = {h.name: next((r.get("error", r.get("wrong", "exact")) for r in
                              reversed(calls.records) if r["host"] == h.name), "no call")
                for h in rig.plan.training_hosts}
        raise CheckFailed(f"{exc}; {calls.summary()}; last call per host: {last}") from None
    finally:
        if mended:
            jobs.stop_together(rig, tag, stop_file, procs)
        else:  # no common step to stop at (or interrupted): the processes are killed
            for proc in procs:
                kill_group(proc)
    calls = jobs.read_calls(rig, f"fault{index}")
    if fault.restart_all:
        calls.records += jobs.read_calls(rig, tag).records
    return _timings(calls, t_fault, t_clear) | {"all_alive_after_s": registered_s}


def _timings(calls: jobs.Calls, t_fault: float, t_clear: float) -> dict[str, Any]:
    failed_after = [r["end"] for r in calls.failed if r["end"] >= t_fault]
    hosts = {r["host"] for r in calls.records}
    firsts = [min((r["end"] for r in calls.exact if r["host"] == h and r["start"] >= t_clear),
                  default=float("nan")) for h in hosts]
    return {"calls": calls, "detect_s": min(failed_after) - t_fault if failed_after else None,
            "recover_s": max(firsts) - t_clear, "outage_s": t_clear - t_fault}


def check_fault(rig: Rig, fault: Fault, job: str, index: int, measured: dict[str, Any]
                ) -> str:
    result = run_fault(rig, fault, job, index)
    calls: jobs.Calls = result["calls"]
    measured[fault.name] = {k: v for k, v in result.items() if k != "calls"} | {
        "exact": len(calls.exact), "wrong": len(calls.wrong), "failed": len(calls.failed),
        "reasons": sorted({r["error"] for r in calls.failed})}
    if calls.wrong or calls.silent():
        bad = (calls.wrong or calls.silent())[0]
        raise CheckFailed(f"{calls.summary()}; {len(calls.silent())} without a reason; "
                          f"first: {bad}")
    detect = ("nothing failed" if result["detect_s"] is None
              else f"first failure {result['detect_s']:.2f} s after the fault")
    reasons = sorted({r["error"][:90] for r in calls.failed})[:2]
    return (f"{calls.summary()}; {detect}; exact again {result['recover_s']:.2f} s after the "
            f"repair; every agent alive in oddl status by {result['all_alive_after_s']:.2f} s "
            "after it" + (f"; reasons: {reasons}" if reasons else ""))


def plain_reasons(measured: dict[str, Any]) -> str:
    reasons = sorted({r for f in measured.values() for r in f.get("reasons", [])})
    misleading = [r for r in reasons if any(m in r for m in MISLEADING)]
    if misleading:
        raise CheckFailed(f"{len(misleading)} of {len(reasons)} distinct reasons mislead on a "
                          f"direct-link lab, e.g. {misleading[0][:260]!r}")
    return f"{len(reasons)} distinct reasons, none about light paths"


def reset_agents(rig: Rig, report: Report) -> None:
    """After a fault the system did not recover from, restart every agent (as an operator
    would) so the next fault starts from a clean state; said in the report."""
    report.note("restarting every agent so that the next fault starts clean")
    for host in rig.plan.training_hosts:
        assert host.node is not None
        stop(rig.services[host.node], signal.SIGTERM)
        bringup.start_agent(rig, host)


def run_all(rig: Rig, report: Report) -> None:
    job = jobs.submit(rig, "ring")
    measured: dict[str, Any] = {}
    for index, fault in enumerate(faults(rig)):
        if not report.check(f"fault: {fault.name}: every call exact or failed with a reason",
                            partial(check_fault, rig, fault, job, index, measured)):
            reset_agents(rig, report)
        report.check(f"fault: {fault.name}: /dev/shm clean afterwards",
                     lambda: jobs.shm_clean(rig))
    report.measurements["faults"] = measured
    report.check("errors on direct links speak of hosts and links, not light paths",
                 partial(plain_reasons, measured))
    report.check("ctl: oddl status after the faults: every agent alive",
                 lambda: bringup.agents_alive(rig))
    jobs.cancel(rig, job)
