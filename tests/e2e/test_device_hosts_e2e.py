"""`oddl demo` on an emulated testbed whose lasers sit on two device hosts (decision record
0036): the launcher starts one `oddl devices host` per entry, the controller drives the
lasers through them, and a retuning collective trains with exact results."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from oddl.common.config import load_testbed

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "testbeds" / "emulated-4node.toml"
RACKS = '''
[[device_hosts]]
id = "rack0"
address = "127.0.0.1:1"
devices = ["laser0", "laser1"]

[[device_hosts]]
id = "rack1"
address = "127.0.0.1:2"
devices = ["laser2", "laser3"]
'''


def test_a_demo_retunes_its_lasers_through_their_device_hosts(tmp_path):
    config = tmp_path / "racks.toml"
    config.write_text(CONFIG.read_text(encoding="utf-8") + RACKS, encoding="utf-8")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "oddl", "demo", "--config", str(config),
                           "--iterations", "3", "--collective", "halving-doubling", "--json",
                           "--run-dir", str(run)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["all_results_exact"] and result["optical"]["mismatches"] == 0
    assert result["device_retunes_total"] > 0
    resolved = load_testbed(run / "testbed.resolved.toml")
    assert [h.id for h in resolved.device_hosts] == ["rack0", "rack1"]
    assert all(not h.address.endswith((":1", ":2")) for h in resolved.device_hosts), \
        "the launcher wrote the ports the hosts listen on"
    for rack in ("rack0", "rack1"):
        log = (run / f"device-host-{rack}.log").read_text(encoding="utf-8")
        served = json.loads(re.search(r"stopped; served (\{.*\})", log).group(1))
        assert served["retune"] > 0 and served["lasers_retuned"] > 0, log[-2000:]
