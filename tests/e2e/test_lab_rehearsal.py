"""The lab rehearsal (docs/how-to/lab-bring-up.md): five hosts in network namespaces, run as `make lab` runs
it, when the machine allows it (root, `ip netns`, unshare, nsenter, setpriv, tc); otherwise
skipped with the reason. The pure parts (hosts and names, units, the lab file's edit) are
tested everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.rig_plan import line_rate_bound_s, plan_lab, run_id_of, tcp_bound_s
from lab.shell import missing_prerequisite
from lab.testbed_file import edit_lab_file
from lab.units import load_unit, parse_unit

ROOT = Path(__file__).resolve().parents[2]


def test_every_name_carries_the_run_id_and_addresses_are_distinct() -> None:
    plan = plan_lab(4242)
    names = [h.netns for h in plan.hosts] + [plan.bridge_netns]
    assert all(run_id_of(n) == 4242 for n in names)
    assert len(set(names)) == len(names) == 6
    assert len({h.address for h in plan.hosts}) == 5
    assert plan.host("n2").node == "n2" and plan.controller.name == "ctl"
    assert run_id_of("oddl-lab-venv") is None and run_id_of("other-4242-ctl") is None


def test_line_rate_bound_is_two_n_minus_one_over_n() -> None:
    assert line_rate_bound_s(16_000_000, 4, 1.0) == pytest.approx(1.5 * 16e6 * 8 / 1e9)


def test_the_tcp_bound_counts_the_headers_of_a_full_packet_at_the_mtu() -> None:
    line = line_rate_bound_s(16_000_000, 4, 1.0)
    assert tcp_bound_s(16_000_000, 4, 1500) == pytest.approx(line * 1514 / 1448)
    assert tcp_bound_s(16_000_000, 4, 9000) == pytest.approx(line * 9014 / 8948)
    assert plan_lab(4242, mtu=9000).mtu == 9000 and plan_lab(4242).mtu == 1500
    with pytest.raises(ValueError, match="--mtu 70000: give 576..65535"):
        plan_lab(4242, mtu=70000)


def test_units_are_read_from_deploy_as_shipped() -> None:
    agent = load_unit(ROOT / "deploy/systemd/oddl-agent@.service", "n1")
    assert agent.user == "oddl" and agent.exec_start[0] == "/opt/oddl/.venv/bin/oddl"
    assert "ipc:///run/oddl/agent-n1.sock" in agent.exec_start
    assert agent.runtime_directory == "oddl" and agent.runtime_directory_mode == 0o750
    ctl = load_unit(ROOT / "deploy/systemd/oddl-controller.service")
    assert ctl.group == "dialout" and ctl.state_directory == "oddl"
    assert ctl.exec_start_pre[0][1:3] == ("config", "check")


def test_a_unit_line_the_rig_cannot_run_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="x.service: ExecStart=-/bin/true"):
        parse_unit("[Service]\nUser=a\nExecStart=-/bin/true\n", "x.service")
    with pytest.raises(ValueError, match="needs ExecStart"):
        parse_unit("[Service]\nUser=a\n", "x.service")


def test_the_lab_file_edit_changes_only_what_the_readme_lists() -> None:
    text = (ROOT / "deploy/testbeds/lab-4node.toml").read_text(encoding="utf-8")
    edited = edit_lab_file(text, hosts={"n0": "10.77.0.11"}, data_ports={"n1": 5601},
                           resources={"pm0": "TCPIP0::10.77.0.10::5025::SOCKET"},
                           controller_address="10.77.0.10:50051")
    changed = [(a, b) for a, b in zip(text.splitlines(), edited.splitlines(), strict=True)
               if a != b]
    assert [b for _, b in changed] == [
        'address = "10.77.0.10:50051"   # where the agents reach the controller',
        'host = "10.77.0.11"', "data_port = 5601",
        'resource = "TCPIP0::10.77.0.10::5025::SOCKET"']
    with pytest.raises(ValueError, match="nodes"):
        edit_lab_file(text, hosts={"n9": "10.77.0.19"}, data_ports={}, resources={},
                      controller_address="x:1")


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_lab_rehearsal(tmp_path: Path) -> None:
    why = missing_prerequisite()
    if why:
        pytest.skip(why)
    report = tmp_path / "lab.json"
    with subprocess.Popen([sys.executable, "-m", "lab", "--json", str(report)], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as rig:
        stdout, stderr = rig.communicate(timeout=1700)
    done = subprocess.CompletedProcess(rig.args, rig.returncode, stdout, stderr)
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(report.read_text(encoding="utf-8"))
    failed = [f"{c['name']}: {c['detail'][:2000]}" for c in result["checks"] if not c["ok"]]
    assert not failed and done.returncode == 0, "\n".join(
        failed + _log_tails(report.with_name(report.name + ".logs"))) or done.stdout[-3000:]
    # this run's namespaces (named by its pid) are gone; another rehearsal on the machine
    # keeps its own
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"oddl-lab-{rig.pid}-" not in leftovers


def _log_tails(folder: Path, lines: int = 12) -> list[str]:
    """The last lines of every service's log the rig kept for a failed run (CI keeps no files:
    the assertion message is all a reader of a red run gets)."""
    return [f"--- {log.name}:\n" + "\n".join(
                log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
            for log in sorted(folder.glob("*agent*")) + sorted(folder.glob("*controller*"))]


def test_the_wss_module_plan_is_uncommented_in_its_own_table() -> None:
    text = (ROOT / "deploy/testbeds/lab-4node.toml").read_text(encoding="utf-8")
    plan = "{ first_channel = 0, first_thz = 191.35, spacing_ghz = 50.0, channels = 96 }"
    edited = edit_lab_file(text, hosts={}, data_ports={}, resources={},
                           controller_address="10.77.0.10:50051", module_plans={"wss0": plan})
    assert f"\nmodule_plan = {plan}\n" in edited
    assert edited.count("module_plan =") == text.count("module_plan =")


def test_without_root_the_reason_is_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert missing_prerequisite() == ("needs root for network namespaces (run as root, as CI "
                                      "does)")
