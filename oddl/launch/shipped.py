"""The files oddl ships inside its package and reads at run time, found with
importlib.resources, so that they are there after a wheel install as in the source tree
(decision record 0014).

The testbed files live in ``oddl/testbeds/`` (``deploy/testbeds`` in the source tree is a
symbolic link to it): ``emulated-4node.toml``, the default of `oddl demo` and `oddl testbed up`,
and ``lab-4node.toml``, the template of a lab's ``/etc/oddl/testbed.toml``
(`oddl config example lab-4node`).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from oddl.common.errors import ConfigError

TESTBEDS = "testbeds"
"""The folder of the shipped testbed files, inside the ``oddl`` package."""


def shipped_testbed_names() -> list[str]:
    """The shipped testbed files, by name without ``.toml``."""
    folder = files("oddl").joinpath(TESTBEDS)
    return sorted(e.name[:-len(".toml")] for e in folder.iterdir()
                  if e.name.endswith(".toml"))


def shipped_testbed(name: str) -> Path:
    """The path of a shipped testbed file (``emulated-4node.toml`` or ``emulated-4node``).

    A path, not only a resource: the file is handed to other processes (`oddl emulate
    testbed --config FILE`). oddl is installed as files (pip installs wheels unpacked), so
    the resource is one; anything else is refused with the fix.
    """
    filename = name if name.endswith(".toml") else f"{name}.toml"
    resource = files("oddl").joinpath(TESTBEDS, filename)
    if not isinstance(resource, Path):
        raise ConfigError(f"oddl is installed in a form whose files are not on disk "
                          f"({resource}); install it with pip as files, or pass --config FILE")
    return resource


def find_testbed(given: str) -> Path:
    """The testbed file a ``--config`` names: a path, else the name of a shipped file
    (``emulated-8node``); ConfigError naming both kinds when it is neither."""
    path = Path(given)
    if path.exists() or "/" in given:
        return path
    shipped = shipped_testbed(given)
    if shipped.is_file():
        return shipped
    known = ", ".join(shipped_testbed_names()) or "none"
    raise ConfigError(f"--config {given}: no such file, and no shipped testbed of that name "
                      f"(shipped: {known}); give a path or a shipped name")


def read_shipped_testbed(name: str) -> str:
    """The text of a shipped testbed file; an unknown name is refused with the known ones."""
    path = shipped_testbed(name)
    if not path.is_file():
        known = ", ".join(shipped_testbed_names()) or "none"
        raise ConfigError(f"no shipped testbed file {name!r} (shipped: {known}); the files "
                          f"are in {path.parent}")
    return path.read_text(encoding="utf-8")
