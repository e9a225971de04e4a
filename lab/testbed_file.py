"""Editing a copy of `lab-4node.toml` as docs/how-to/lab-bring-up.md ("The procedure", step 3)
says: device resources, a WSS's `module_plan`, host addresses and data ports, `[controller]
address` (pure text edits, so the rest of the file and its comments stay as shipped).
"""

from __future__ import annotations

import re
from collections.abc import Mapping


def _set_in_table(text: str, header: str, match_key: str, match_value: str, key: str,
                  value: str) -> str:
    """Set `key = value` in the `[[header]]` table whose `match_key` is `match_value`."""
    blocks = re.split(r"(?m)^(?=\[)", text)
    hits = 0
    for i, block in enumerate(blocks):
        if not block.startswith(f"[[{header}]]") and not block.startswith(f"[{header}]"):
            continue
        if match_key and not re.search(rf'(?m)^{match_key}\s*=\s*"{re.escape(match_value)}"',
                                       block):
            continue
        new, n = re.subn(rf"(?m)^({key}\s*=\s*)(\"[^\"]*\"|[^#\n]*?)(\s*(#.*)?)$",
                         lambda m: f"{m.group(1)}{value}{m.group(3)}", block, count=1)
        if n != 1:
            raise ValueError(f"[{header}] {match_value or ''}: no {key} to edit")
        blocks[i] = new
        hits += 1
    if hits != 1:
        raise ValueError(f"lab file: {hits} [{header}] tables with {match_key} = "
                         f"{match_value!r} (expected one)")
    return "".join(blocks)


def _set_module_plan(text: str, device: str, plan: str) -> str:
    """Uncomment (or replace) `module_plan` in the device's table."""
    blocks = re.split(r"(?m)^(?=\[)", text)
    for i, block in enumerate(blocks):
        if block.startswith("[[devices]]") and re.search(rf'(?m)^id\s*=\s*"{device}"', block):
            new, n = re.subn(r"(?m)^#?\s*module_plan\s*=.*$", f"module_plan = {plan}", block,
                             count=1)
            blocks[i] = new if n else block.rstrip("\n") + f"\nmodule_plan = {plan}\n\n"
            return "".join(blocks)
    raise ValueError(f"lab file: no [[devices]] table with id = {device!r}")


def edit_lab_file(text: str, *, hosts: Mapping[str, str], data_ports: Mapping[str, int],
                  resources: Mapping[str, str], controller_address: str,
                  module_plans: Mapping[str, str] | None = None) -> str:
    """The shipped file with each node's host and data port, each device's resource (and a
    WSS's module plan) and the controller's address set."""
    for device, plan in (module_plans or {}).items():
        text = _set_module_plan(text, device, plan)
    for node, host in hosts.items():
        text = _set_in_table(text, "nodes", "id", node, "host", f'"{host}"')
    for node, port in data_ports.items():
        text = _set_in_table(text, "nodes", "id", node, "data_port", str(port))
    for device, resource in resources.items():
        text = _set_in_table(text, "devices", "id", device, "resource", f'"{resource}"')
    return _set_in_table(text, "controller", "", "", "address", f'"{controller_address}"')
