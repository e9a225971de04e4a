"""Which optional extra each optional package comes with, and the error that names it.

The core install (`pip install oddl`) is what the controller and the agents run. The rest
come with extras, so a host installs what it runs:
- ``plots``: matplotlib, for `oddl schedule plot`, `oddl simulate --plot`, `oddl trace plot`;
- ``offline``: scipy and networkx, for the simulator's SiP-Ring LP and TopoOpt's topology
  search (`oddl simulate`, `oddl topoopt`);
- ``watch``: rich, for `oddl watch`;
- ``torch``: torch, for the `oddl` torch.distributed backend on the training hosts.
"""

from __future__ import annotations

import importlib.util

from oddl.common.errors import MissingExtra

EXTRA_OF = {"matplotlib": "plots", "scipy": "offline", "networkx": "offline", "rich": "watch",
            "torch": "torch"}
"""The extra that installs each optional package."""


def require(package: str, feature: str) -> None:
    """Raise MissingExtra when `package` (a key of EXTRA_OF) is not installed, naming
    `feature` (what needs it) and the extra that brings it."""
    if importlib.util.find_spec(package) is not None:
        return
    extra = EXTRA_OF[package]
    raise MissingExtra(f"{feature} needs {package}, which this host has not installed; "
                       f"install the {extra!r} extra: pip install 'oddl[{extra}]'")
