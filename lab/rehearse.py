"""`python -m lab`: bring the rig up, run the lab steps of docs/how-to/lab-bring-up.md and a lab's faults, print one
line per check and a summary, take everything down (unless --keep). Exit 0 only when every
check passed."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from functools import partial
from pathlib import Path
from types import FrameType

from lab import bringup, faults, jobs, measure, steps, users
from lab.hosts import Hosts
from lab.install import CACHE_ROOT, build_wheel, prune, venv_for
from lab.report import Report
from lab.rig import REPO, Rig, clean_stale, other_live_rigs
from lab.rig_plan import DEFAULT_MTU, plan_lab
from lab.shell import missing_prerequisite


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def bring_up(rig: Rig, report: Report) -> bool:
    def install() -> str:
        wheel = build_wheel(REPO, rig.plan.run_dir / "wheel")
        root, reused = venv_for(wheel, rig.logs / "install.log")
        rig.hosts = Hosts(rig.plan, root)
        if not reused and not other_live_rigs(rig.plan.run_dir):
            for old in prune(keep=root):
                report.note(f"removed an older cached venv {old}")
        return (f"{wheel.name} into {root}/.venv with [torch] "
                f"({'reused: same wheel content' if reused else 'made; cached under '}"
                f"{'' if reused else CACHE_ROOT})")

    def users_() -> str:
        rig.made_users = users.ensure_users()
        rig.save_state()
        return f"made {rig.made_users}" if rig.made_users else "present already"

    def hosts_() -> str:
        rig.h.up()
        rig.install_workers()
        return (f"{len(rig.plan.hosts)} hosts on {rig.plan.controller.address}/24, "
                "tbf 1gbit both ends")

    return (report.check("users: oddl and a training user in group oddl", users_)
            and report.check("install: wheel, non-editable venv at /opt/oddl/.venv", install)
            and report.check("hosts: namespaces, bridge, shaped links, private mounts", hosts_))


def _submit(rig: Rig, collective: str, into: list[str]) -> str:
    into.append(jobs.submit(rig, collective))
    return into[-1]


def exact_both(rig: Rig, job: str, collective: str) -> str:
    return (jobs.exact_allreduces(rig, job, collective, 30, 1000) + "; "
            + jobs.exact_allreduces(rig, job, collective + "-1M", 10, 1 << 20))


def lab_steps(rig: Rig, report: Report, bench: bool) -> None:
    steps.devices_and_files(rig, report)
    steps.certificates(rig, report)
    steps.config_check(rig, report)
    steps.probe(rig, report)
    steps.wheel_has_default_files(rig, report)
    if not bringup.services(rig, report):
        return
    report.check("ctl: oddl status: every agent alive", lambda: bringup.agents_alive(rig))
    report.check("operator: a login user runs oddl status with its own key (certs hand-out)",
                 lambda: bringup.operator_handout(rig))
    report.check(f"clock: {steps.CLOCK_SHIFT_NODE} shifted {steps.CLOCK_SHIFT_US} µs found "
                 "within its bound", lambda: bringup.clock_shift(rig))
    for collective in ("ring", "halving-doubling"):
        submitted: list[str] = []
        if not report.check(f"{collective}: oddl jobs submit", partial(
                _submit, rig, collective, submitted)):
            continue
        job = submitted[0]
        report.check(f"{collective}: 40 exact all-reduces per host (1 k and 1 M int64)",
                     partial(exact_both, rig, job, collective))
        report.check(f"{collective}: /dev/shm clean after the processes exit",
                     lambda: jobs.shm_clean(rig))
        if collective == "ring":
            report.check("torchrun DDP on the oddl backend, one rank per host",
                         partial(jobs.ddp, rig, job))
            report.check("torchrun's elastic form (c10d rendezvous, --max-restarts 1)",
                         partial(jobs.ddp_elastic, rig, job))
        report.check(f"{collective}: oddl jobs cancel", partial(jobs.cancel, rig, job))
    report.check("line rate: a warning names line_rate_gbps", lambda: bringup.line_rate_warned(rig))
    if bench:
        measure.run(rig, report)
    faults.run_all(rig, report)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    p.add_argument("--json", metavar="FILE", help="write the report here (and, when a check "
                   "failed, every process's log to FILE.logs/)")
    p.add_argument("--keep", action="store_true", help="leave the rig up for debugging")
    p.add_argument("--down", action="store_true", help="remove kept (and crashed) rigs, exit")
    p.add_argument("--bench", action="store_true", help="also measure (benchmarks/bench_lab.py)")
    p.add_argument("--mtu", type=int, default=DEFAULT_MTU, help="the links' MTU (default "
                   "%(default)s; a training network often runs jumbo frames, 9000)")
    args = p.parse_args(argv)
    why = missing_prerequisite()
    if why:
        print(f"skip: {why}")
        return 2
    if args.down:
        removed = clean_stale(include_kept=True)
        print(f"removed {removed}" if removed else "no rig to remove")
        return 0
    for name in clean_stale(include_kept=False):
        print(f"note removed the leftovers of a crashed run: {name}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        plan = plan_lab(os.getpid(), mtu=args.mtu)
    except ValueError as exc:
        p.error(str(exc))
    report, rig = Report(), Rig(plan)
    rig.save_state()
    print(f"lab rig {rig.plan.tag}: logs under {rig.logs}", flush=True)
    start = time.monotonic()
    try:
        if bring_up(rig, report):
            lab_steps(rig, report, args.bench)
    except KeyboardInterrupt:
        report.note("interrupted: taking the rig down")
    except Exception as exc:  # the run stops, the rig still comes down, the summary says why
        report.fail("rig: the rehearsal could not go on", f"{type(exc).__name__}: {exc}")
    finally:
        if args.json:
            report.write(Path(args.json))
            if not report.passed and rig.logs.exists():
                kept_logs = Path(f"{args.json}.logs")
                shutil.rmtree(kept_logs, ignore_errors=True)
                shutil.copytree(rig.logs, kept_logs)
                print(f"logs of this failed run: {kept_logs}")
        if args.keep:
            rig.save_state(kept=True)
            print(f"kept: {rig.plan.tag} (enter a host with nsenter -t PID -m -n; "
                  f"keepers {rig.hosts.keepers if rig.hosts else {}}); "
                  "remove with python -m lab --down")
        else:
            for problem in rig.teardown():
                print(f"cleanup: {problem}")
    print(f"{report.summary()}\n{time.monotonic() - start:.0f} s in all", flush=True)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
