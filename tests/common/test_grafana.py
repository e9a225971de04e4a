"""deploy/grafana/oddl.json and deploy/prometheus/oddl-alerts.yml: every PromQL query names
only metrics oddl exports.

The exported names are found from the code, not listed here: the histograms of a real
`oddl.common.metrics.Metrics` registry for each prefix the controller and the agent use, and the
counters and gauges their scrape-time collectors build (every `counter("...")` /
`gauge("...")` call in controller/, agents/ and common/, read from the source's syntax tree).
The queries are parsed enough to take out label matchers, strings, ranges, grouping clauses,
functions and keywords; what is left are metric names.
"""

from __future__ import annotations

import ast
import functools
import json
import re

import pytest
from helpers import ROOT

from oddl.common.metrics import Metrics

DASHBOARD = ROOT / "deploy" / "grafana" / "oddl.json"
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "and", "or", "unless", "atan2", "inf", "nan"}
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes itself for every target."""
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def _prefixes() -> set[str]:
    """The prefixes `Metrics(...)` is built with in the controller and the agent."""
    found = set()
    for path in [*(ROOT / "controller").rglob("*.py"), *(ROOT / "agents").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Metrics"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                found.add(str(node.args[0].value))
    return found


def _state_metrics() -> dict[str, str]:
    """name → counter|gauge of every family the scrape-time collectors build."""
    found: dict[str, str] = {}
    for folder in ("controller", "agents", "common"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", "") in
                        ("counter", "gauge") and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    found[str(node.args[0].value)] = node.func.id  # type: ignore[attr-defined]
    return found


@functools.cache
def exported_series() -> frozenset[str]:
    """Every series name oddl's /metrics endpoints can show."""
    names: set[str] = set()
    for prefix in _prefixes():
        for family in Metrics(prefix).registry.collect():
            if family.type == "histogram":
                names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count", "created")}
            else:
                names.add(family.name)
    for name, kind in _state_metrics().items():
        names.add(name if kind == "gauge" or name.endswith("_total") else f"{name}_total")
    return frozenset(names)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings (label values)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery durations
    text = re.sub(r"\b\d[\w.]*", "", text)  # numbers and durations (0.99, 5m)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for m in IDENT.finditer(text):
        rest = text[m.end():].lstrip()
        if m.group() in KEYWORDS or rest.startswith("(") or m.group().startswith("$"):
            continue
        if text[max(0, m.start() - 1)] == "$":  # a Grafana variable such as $__rate_interval
            continue
        names.add(m.group())
    return names


def _targets() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def test_the_parser_finds_names_and_only_names():
    assert metric_names('histogram_quantile(0.99, sum by (le, phase) '
                        '(rate(oddl_retune_slot_seconds_bucket{phase="granted"}[5m])))') \
        == {"oddl_retune_slot_seconds_bucket"}
    assert metric_names("sum by (node, peer) (rate(a_total[$__rate_interval])) * 8 / "
                        "ignoring(x) b offset 5m") == {"a_total", "b"}


def test_the_exported_names_are_found_in_the_code():
    """A check against an empty or partial list could not fail: the collectors' and the
    histograms' names must all be there."""
    series = exported_series()
    assert {"oddl_agent_slot_gate_error_seconds_bucket", "oddl_device_command_seconds_bucket",
            "oddl_reconfigurations_total", "oddl_agent_clock_offset_seconds",
            "oddl_agent_bytes_sent_total", "oddl_agent_late_chunks_total",
            "oddl_guard_time_seconds_total"} <= series


@pytest.mark.parametrize("title, expr", _targets())
def test_every_panel_query_names_exported_metrics(title, expr):
    names = metric_names(expr)
    assert names, f"panel {title!r}: no metric in {expr!r}"
    unknown = names - exported_series() - PROMETHEUS_OWN
    assert not unknown, (f"panel {title!r} queries {sorted(unknown)}, which oddl does not "
                         "export; fix the query or the metric")


def test_the_dashboard_covers_what_the_issue_asks_for():
    """Guard time, retunes, gate error, late chunks, bytes per peer, device command latency,
    clock offset: each has a panel reading its metric."""
    used = set().union(*(metric_names(e) for _t, e in _targets()))
    assert {"oddl_guard_time_seconds_total", "oddl_retune_slot_seconds_bucket",
            "oddl_reconfigurations_total", "oddl_agent_slot_gate_error_seconds_bucket",
            "oddl_agent_late_chunks_total", "oddl_agent_bytes_sent_total",
            "oddl_device_command_seconds_bucket", "oddl_agent_clock_offset_seconds"} <= used
    dash = json.loads(DASHBOARD.read_text())
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])


RULES = ROOT / "deploy" / "prometheus" / "oddl-alerts.yml"
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes itself for every target."""


def _rules() -> list[tuple[str, str]]:
    yaml = pytest.importorskip("yaml")
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(r["alert"], r["expr"]) for g in groups for r in g["rules"]]


def test_every_alert_rule_names_exported_metrics():
    """deploy/prometheus/oddl-alerts.yml reads only what oddl exports (promtool checks the
    syntax, in tests/e2e/test_prometheus.py, but not that the series exist)."""
    rules = _rules()
    assert {"OddlAgentDown", "OddlClockErrorOverBudget", "OddlSlotOverruns",
            "OddlDeviceNotAnswering", "OddlRetuneFailed"} <= {name for name, _ in rules}
    for name, expr in rules:
        names = metric_names(expr)
        assert names, f"alert {name}: no metric in {expr!r}"
        unknown = names - exported_series() - PROMETHEUS_OWN
        assert not unknown, f"alert {name} reads {sorted(unknown)}, which oddl does not export"
