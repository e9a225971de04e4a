"""A testbed with lasers, a WSS and a circuit switch together: the emulated four-node testbed
with one host port per node wired through a 16x16 switch ``ocs0`` (node k's port 1: ingress
k + 1, egress 17 + k), so that one device transaction spans all three kinds and the
controller's scheduler (hosts on a WSS) still serves it."""

from __future__ import annotations

import re
from pathlib import Path

from oddl.common.config import TestbedConfig, load_testbed

ROOT = Path(__file__).resolve().parents[2]
FOUR_NODES = ROOT / "deploy" / "testbeds" / "emulated-4node.toml"

SWITCH = '''
[[devices]]
id = "ocs0"
kind = "ocs"
resource = "emulated"
size = 16
switch_ms = 1.0
timeout_s = 2.0
'''


def mixed_testbed(folder: Path) -> TestbedConfig:
    """Write the testbed file into `folder` and load it."""
    text = re.sub(r'(transmitter = "laser\d")\n', r'\1\nports = 1\n', FOUR_NODES.read_text())
    text = text.replace('name = "emulated-4node"', 'name = "mixed-4node"') + SWITCH
    for k in range(4):
        text += (f'\n[[fibres]]\nfrom = "n{k}.p1.tx"\nto = "ocs0.{k + 1}"\n'
                 f'\n[[fibres]]\nfrom = "ocs0.{17 + k}"\nto = "n{k}.p1.rx"\n')
    path = folder / "mixed-4node.toml"
    path.write_text(text)
    cfg = load_testbed(path)
    assert cfg.name == "mixed-4node" and len(cfg.port_links()) == 4
    return cfg
