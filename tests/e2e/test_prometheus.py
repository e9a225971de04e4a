"""The Grafana dashboard and the alert rules against a real Prometheus (the distribution's
package): every panel query returns data from the emulated four-node testbed, and the alerts
fire when their condition is provoked. Skips where no `prometheus` binary is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from beds import allreduce_all
from helpers import EMULATED, ROOT, wait_for

from oddl.common.errors import OperationRefused
from oddl.launch.processes import free_port
from oddl.launch.testbed import RunningTestbed, write_config

DASHBOARD = ROOT / "deploy" / "grafana" / "oddl.json"
RULES = ROOT / "deploy" / "prometheus" / "oddl-alerts.yml"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                reason="needs the prometheus and promtool binaries "
                                       "(apt-get install prometheus)")

GRAFANA_VARS = {"$__rate_interval": "30s", "$__interval": "5s", "$__range": "5m"}
NOT_ON_THE_FABRIC = {
    "oddl_agent_link_rate_bits_per_second":
        'measured only on direct TCP links (fabric.link = "direct"), as a lab has',
}
"""Panel metrics the emulated testbed cannot have, and why: each is checked to be so."""
SKEW_BUDGET_US = 0.001
"""A clock skew budget no loopback clock sync can meet, so the clock alert has to fire."""


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel, rows' panels included."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    out = []
    for panel in panels + [p for row in panels for p in row.get("panels", [])]:
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append((panel.get("title", "?"), target["expr"]))
    return out


def substitute(expr: str) -> str:
    """The query with Grafana's variables replaced: built-in intervals by durations, any
    other `$var` (a template variable) by a regex matching everything."""
    for name, value in GRAFANA_VARS.items():
        expr = expr.replace(name, value)
    expr = re.sub(r"\$\{?\w+(:\w+)?\}?", ".*", expr)
    assert "$" not in expr, expr
    return expr


class Prometheus:
    """A Prometheus server on a loopback port, scraping the given targets every second."""

    def __init__(self, workdir: Path, controller: str, agents: list[str], rules: Path):
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: [{json.dumps(str(rules))}]\n"
            "scrape_configs:\n"
            f"  - job_name: oddl-controller\n    static_configs:\n"
            f"      - targets: {json.dumps([controller])}\n"
            f"  - job_name: oddl-agents\n    static_configs:\n"
            f"      - targets: {json.dumps(agents)}\n")
        self.log = workdir / "prometheus.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={config}",
                 f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._ready, 60, f"prometheus ready (log {self.log})", interval=0.2)

    def _ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[Any]:
        return self.api("query", query=expr)["result"]

    def firing(self) -> set[str]:
        return {a["labels"]["alertname"] for a in self.api("alerts")["alerts"]
                if a["state"] == "firing"}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def host_port(url: str) -> str:
    """HOST:PORT of a metrics URL (http://HOST:PORT/metrics)."""
    return urllib.parse.urlsplit(url).netloc


def test_the_rules_pass_promtool() -> None:
    out = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_dashboard_query_has_data_and_the_alerts_fire(tmp_path: Path) -> None:
    # The shipped rules with every `for:` shortened, so a provoked condition fires at once.
    rules = tmp_path / "oddl-alerts.yml"
    rules.write_text(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 0s", RULES.read_text()))
    testbed = write_config(EMULATED, tmp_path / "testbed.toml",
                           {"clock_skew_us = 100.0": f"clock_skew_us = {SKEW_BUDGET_US}"})
    (tmp_path / "bed").mkdir()
    with RunningTestbed(tmp_path / "bed", testbed) as tb:
        metrics = tb.metrics
        agents = {n: host_port(metrics[n]) for n in tb.launched.node_ids}
        prom = Prometheus(tmp_path, host_port(metrics["controller"]), list(agents.values()),
                          rules)
        try:
            wait_for(lambda: len(prom.query("up == 1")) == 1 + len(agents), 60,
                     "every target scraped")
            run_traffic(tb)
            assert tb.cfg.fabric.link != "direct"
            check_dashboard(prom)
            provoke_alerts(tb, prom, agents)
        finally:
            prom.close()


def run_traffic(tb: RunningTestbed) -> None:
    """A job and five exact all-reduces, so the counters move."""
    tb.operator.submit("prom", [], "ring", "optical")
    rng = np.random.default_rng(37)
    for step in range(1, 6):
        arrays = [rng.integers(-1000, 1000, 20000) for _ in tb.clients]
        outs = allreduce_all(tb.clients, arrays, step=step)
        exact = np.sum(arrays, axis=0)
        assert all(np.array_equal(o, exact) for o in outs), outs


def check_dashboard(prom: Prometheus) -> None:
    """Poll until every panel query has data; on timeout, name the ones still empty."""
    queries = [(t, e) for t, e in dashboard_queries()
               if not any(m in e for m in NOT_ON_THE_FABRIC)]
    assert queries, f"no queries in {DASHBOARD}"
    last: list[str] = []

    def all_have_data() -> bool:
        nonlocal last
        last = [f"{title}: {expr}" for title, expr in queries
                if not prom.query(substitute(expr))]
        return not last

    try:
        wait_for(all_have_data, 60, "every dashboard query to return data", interval=1.0)
    except BaseException:
        pytest.fail("dashboard queries without data:\n" + "\n".join(last))


def alerts_named(prom: Prometheus, name: str) -> list[dict[str, Any]]:
    return [a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == name]


def provoke_alerts(tb: RunningTestbed, prom: Prometheus, agents: dict[str, str]) -> None:
    """Make each alert's condition true on the testbed and wait until the alert fires."""
    # The clock: no loopback sync meets a budget of a nanosecond.
    wait_for(lambda: "OddlClockErrorOverBudget" in prom.firing(), 60,
             "OddlClockErrorOverBudget firing")
    bounds = [float(a["value"]) for a in alerts_named(prom, "OddlClockErrorOverBudget")]
    assert bounds and all(SKEW_BUDGET_US / 1e6 < b < 1.0 for b in bounds), bounds

    # Devices not answering and a retune failing: kill the emulator host, then ask for a
    # reconfiguration, which cannot be verified and is rolled back.
    assert not {"OddlDeviceNotAnswering", "OddlRetuneFailed"} & prom.firing()
    kill(tb, "emulators")
    with pytest.raises(OperationRefused, match="rolled back"):
        tb.operator.reconfigure({"set_channel": {"transmitter": "laser0", "channel": 5}},
                                dry_run=False)
    wait_for(lambda: {"OddlDeviceNotAnswering", "OddlRetuneFailed"} <= prom.firing(), 60,
             "OddlDeviceNotAnswering and OddlRetuneFailed firing")
    unanswered = {a["labels"]["device"] for a in alerts_named(prom, "OddlDeviceNotAnswering")}
    assert "laser0" in unanswered, unanswered

    # An agent down: kill its process; its scrape fails and the controller loses it.
    assert not {"OddlAgentDown", "OddlAgentLost"} & prom.firing()
    kill(tb, "agent-n3")
    wait_for(lambda: {"OddlAgentDown", "OddlAgentLost"} <= prom.firing(), 60,
             "OddlAgentDown and OddlAgentLost firing")
    down = alerts_named(prom, "OddlAgentDown")
    assert [a["labels"]["instance"] for a in down] == [agents["n3"]]


def kill(tb: RunningTestbed, name: str) -> None:
    """SIGKILL the testbed's process `name` and reap it."""
    victim = next(p for p in tb.group.procs if p.name == name)
    victim.proc.kill()
    victim.proc.wait(10)
