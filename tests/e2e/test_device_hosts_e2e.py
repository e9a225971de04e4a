"""`oddl demo` on emulated testbeds whose lasers sit on two device hosts (decision record
0036): the launcher starts one `oddl devices host` per entry in place of the file's
placeholder ports, the controller drives the lasers through them, and a retuning collective
trains with exact results (halving-doubling: a ring never retunes, its channels are set once
when the job starts, so its racks would serve only calls). The file is written by hand, or
by `oddl config new --rack`."""

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


def _demo_retunes_through_both_racks(config: Path, run: Path, iterations: int,
                                     placeholders: set[str]) -> None:
    """Run the demo on `config`; the results are exact, the launcher replaced the
    `placeholders` addresses, and both racks' hosts served retunes."""
    proc = subprocess.run([sys.executable, "-m", "oddl", "demo", "--config", str(config),
                           "--iterations", str(iterations), "--collective", "halving-doubling",
                           "--json", "--run-dir", str(run)], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["all_results_exact"] and result["optical"]["mismatches"] == 0
    assert result["device_retunes_total"] > 0
    resolved = load_testbed(run / "testbed.resolved.toml")
    assert [h.id for h in resolved.device_hosts] == ["rack0", "rack1"]
    assert not {h.address for h in resolved.device_hosts} & placeholders, \
        "the launcher wrote the ports the hosts listen on"
    for rack in ("rack0", "rack1"):
        log = (run / f"device-host-{rack}.log").read_text(encoding="utf-8")
        found = re.search(r"stopped; served (\{.*\})", log)
        assert found, log[-2000:]
        served = json.loads(found.group(1))
        assert served["retune"] > 0 and served["lasers_retuned"] > 0, log[-2000:]


def test_a_demo_retunes_its_lasers_through_their_device_hosts(tmp_path):
    config = tmp_path / "racks.toml"
    config.write_text(CONFIG.read_text(encoding="utf-8") + RACKS, encoding="utf-8")
    _demo_retunes_through_both_racks(config, tmp_path / "run", 3,
                                     {"127.0.0.1:1", "127.0.0.1:2"})


def test_a_demo_on_a_generated_racked_file_retunes_through_both_racks(tmp_path):
    config = tmp_path / "racked.toml"
    new = subprocess.run([sys.executable, "-m", "oddl", "config", "new", "--hosts", "8",
                          "--rack", "4"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert new.returncode == 0, new.stderr
    config.write_text(new.stdout, encoding="utf-8")
    _demo_retunes_through_both_racks(config, tmp_path / "run", 2,
                                     {"127.0.0.1:7100", "127.0.0.1:7101"})
