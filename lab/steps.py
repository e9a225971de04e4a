"""The lab steps of docs/how-to/lab-bring-up.md, run on the rig as a new lab would run them, each checked exactly.

"The procedure": install (lab/install.py), the testbed file edited as step 3 says, `oddl config check`, `oddl devices probe`, certificates as docs/explanation/security.md
says, the services from their units, `oddl status`, jobs, training processes on every host.
"""

from __future__ import annotations

import json
import shutil
from functools import partial
from typing import Any

from lab import users
from lab.devices import bench_resources, start_bench
from lab.procedure import CERTS_INIT_FLAGS
from lab.report import CheckFailed, Report
from lab.rig import REPO, Rig
from lab.rig_plan import Host
from lab.services import last_lines
from lab.testbed_file import edit_lab_file

TESTBED = "/etc/oddl/testbed.toml"
CERTS = "/etc/oddl/certs"
UNITS = REPO / "deploy" / "systemd"
# the emulated WSS module's factory plan, as its datasheet (drivers/emulators/wss.py) gives it
WSS_DATASHEET_PLAN = ("{ first_channel = 0, first_thz = 191.35, spacing_ghz = 50.0, "
                      "channels = 96 }")
CLOCK_SHIFT_NODE = "n3"
CLOCK_SHIFT_US = 2500


def ok_or_fail(done: Any, what: str) -> str:
    if done.returncode != 0:
        raise CheckFailed(f"{what} exited {done.returncode}: "
                          f"{last_lines(done.stderr + done.stdout, 4)}")
    return last_lines(done.stdout, 1)


def write_testbed_files(rig: Rig) -> str:
    """Step 3: the shipped lab file with this rig's meter address, hosts and controller, at
    /etc/oddl/testbed.toml on every host (the serial paths stay the template's)."""
    plan = rig.plan
    text = (REPO / "deploy" / "testbeds" / "lab-4node.toml").read_text(encoding="utf-8")
    resources = bench_resources(plan.controller)
    edited = edit_lab_file(text, hosts={h.node: h.address for h in plan.training_hosts
                                        if h.node},
                           data_ports={}, resources=resources,
                           controller_address=f"{plan.controller.address}:50051",
                           module_plans={"wss0": WSS_DATASHEET_PLAN})
    for host in plan.hosts:
        path = rig.h.root(host) / TESTBED.lstrip("/")
        path.write_text(edited, encoding="utf-8")
        path.chmod(0o644)
    (plan.run_dir / "testbed.toml").write_text(edited, encoding="utf-8")
    return f"{len(plan.hosts)} hosts; meter at {resources['pm0']}"


def devices_and_files(rig: Rig, report: Report) -> None:
    ctl = rig.plan.controller

    def emulators() -> str:
        rig.emulators = start_bench(rig.h, ctl, rig.logs, TESTBED)
        return ", ".join(f"{d}={r}" for d, r in sorted(rig.emulators.resources.items()))

    if report.check("testbed file: lab-4node.toml edited as the procedure's step 3 says",
                    lambda: write_testbed_files(rig)):
        report.check("devices: oddl emulate bench serves the lab file's devices at its "
                     "resources", emulators)


def node_cert_files(node: str) -> list[str]:
    """What docs/explanation/security.md ("Installing them on the lab's hosts") copies to host `node`."""
    return ["manifest.json", "tls/ca.crt", f"tls/agent-{node}.crt", f"tls/agent-{node}.key",
            f"curve/{node}.key", f"curve/{node}.key_secret", "revoked.json"]


def certificates(rig: Rig, report: Report) -> None:
    """docs/explanation/security.md: `oddl certs init` on the controller host and the files copied to
    every host. Where the installed oddl has `--owner` (and `oddl certs chown`), as its docs
    say: keys for the service user, each training host given only its own files; otherwise,
    as the older docs say, the whole folder but tls/ca.key."""
    ctl = rig.plan.controller

    def init() -> str:
        owner = "--owner" in rig.oddl(ctl, "certs", "init", "--help").stdout
        args = CERTS_INIT_FLAGS if owner else []
        done = rig.oddl(ctl, "certs", "init", "--out", CERTS, "--nodes",
                        ",".join(rig.plan.nodes), "--hosts", ctl.address, *args)
        ok_or_fail(done, "oddl certs init")
        src = rig.h.root(ctl) / CERTS.lstrip("/")
        for host in rig.plan.training_hosts:
            dest = rig.h.root(host) / CERTS.lstrip("/")
            if not owner:
                shutil.copytree(src, dest, dirs_exist_ok=True,
                                ignore=lambda d, names: ["ca.key"] if d.endswith("tls") else [])
                continue
            assert host.node is not None
            for rel in node_cert_files(host.node):
                if (src / rel).exists():
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True, mode=0o755)
                    shutil.copy2(src / rel, dest / rel)
            for folder in (dest, dest / "tls", dest / "curve"):
                folder.chmod(0o755)
            ok_or_fail(rig.oddl(host, "certs", "chown", "--certs", CERTS, "--owner",
                                users.SERVICE_USER), f"{host.name}: oddl certs chown")
        keys = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.key"))
        how = ("--owner oddl; each host its own files, oddl certs chown there" if owner
               else "the folder but tls/ca.key copied to every host (docs without --owner)")
        return f"{len(keys)} private keys; {how}"

    report.check("certs: oddl certs init, files copied to every host", init)


def _config_check(rig: Rig, host: Host) -> str:
    return ok_or_fail(rig.oddl(host, "config", "check", TESTBED), "oddl config check")


def config_check(rig: Rig, report: Report) -> None:
    for host in rig.plan.hosts:
        report.check(f"{host.name}: oddl config check {TESTBED}",
                     partial(_config_check, rig, host))


def probe(rig: Rig, report: Report) -> None:
    """The lab steps' step 2, literally: `oddl devices probe --config` (with its port scan)."""
    def run_probe() -> str:
        done = rig.oddl(rig.plan.controller, "devices", "probe", "--config", TESTBED, "--json",
                        timeout=180)
        try:
            result = json.loads(done.stdout)
        except ValueError:
            return ok_or_fail(done, "oddl devices probe")
        devices = result.get("devices", [])
        bad = [d for d in devices if d.get("status", "").upper() != "OK"]
        extra = result.get("unlisted", [])
        if done.returncode != 0 or bad or extra:
            raise CheckFailed(f"exit {done.returncode}; not OK: {json.dumps(bad)[:600]}; "
                              f"unlisted: {json.dumps(extra)[:400]}")
        return f"{len(devices)} devices OK"

    report.check("ctl: oddl devices probe --config (every device OK)", run_probe)


def wheel_has_default_files(rig: Rig, report: Report) -> None:
    """`oddl testbed up` without --config must find its default testbed file in the wheel."""
    ctl = rig.plan.controller

    def up_down() -> str:
        done = rig.oddl(ctl, "testbed", "up", "--run-dir", "/tmp/testbed", "--json",
                        timeout=180)
        rig.oddl(ctl, "testbed", "down", "--run-dir", "/tmp/testbed", timeout=60)
        return ok_or_fail(done, "oddl testbed up (default file, wheel install)")[:80]

    report.check("wheel: oddl testbed up finds its default testbed file", up_down)
