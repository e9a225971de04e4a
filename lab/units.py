"""The systemd units of `deploy/systemd/` read as a lab's systemd would run them (pure).

Only what starting a service needs: the `[Service]` command lines, user and group, runtime and
state folders, environment and restart delay, with the instance specifier `%i` expanded.
Anything else the rig cannot honour is listed in `Unit.not_applied`, so the report says so.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

APPLIED = {"Type", "User", "Group", "ExecStartPre", "ExecStart", "RuntimeDirectory",
           "RuntimeDirectoryMode", "StateDirectory", "StateDirectoryMode", "Environment",
           "Restart", "RestartSec", "KillSignal", "TimeoutStopSec", "NoNewPrivileges"}


@dataclass(frozen=True)
class Unit:
    """One service as the rig starts it."""

    name: str
    user: str
    group: str | None
    exec_start_pre: tuple[tuple[str, ...], ...]
    exec_start: tuple[str, ...]
    runtime_directory: str | None
    runtime_directory_mode: int
    state_directory: str | None
    state_directory_mode: int
    environment: dict[str, str] = field(default_factory=dict)
    restart_sec: float = 0.1
    no_new_privileges: bool = False
    not_applied: tuple[str, ...] = ()


def parse_unit(text: str, name: str, instance: str | None = None) -> Unit:
    """The `[Service]` section of a unit file; ValueError naming the unit and key when a
    line cannot be run as written."""
    service: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section != "Service":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{name}: line {raw!r} is not KEY=VALUE")
        value = value.strip().replace("%i", instance or "%i")
        if "%" in value.replace("%%", ""):
            raise ValueError(f"{name}: {key.strip()}={value}: a specifier the rig does not "
                             "expand (it knows %i)")
        service.setdefault(key.strip(), []).append(value)
    return _unit(name, service)


def _command(name: str, key: str, value: str) -> tuple[str, ...]:
    if value[:1] in "-+@!:":
        raise ValueError(f"{name}: {key}={value}: prefix {value[0]!r} is not supported by the rig")
    return tuple(shlex.split(value))


def _unit(name: str, service: dict[str, list[str]]) -> Unit:
    def one(key: str, default: str | None = None) -> str | None:
        values = service.get(key)
        return values[-1] if values else default

    if "ExecStart" not in service or "User" not in service:
        raise ValueError(f"{name}: [Service] needs ExecStart= and User=")
    env: dict[str, str] = {}
    for line in service.get("Environment", []):
        for item in shlex.split(line):
            k, _, v = item.partition("=")
            env[k] = v
    return Unit(
        name=name, user=str(one("User")), group=one("Group"),
        exec_start_pre=tuple(_command(name, "ExecStartPre", v)
                             for v in service.get("ExecStartPre", [])),
        exec_start=_command(name, "ExecStart", str(one("ExecStart"))),
        runtime_directory=one("RuntimeDirectory"),
        runtime_directory_mode=int(one("RuntimeDirectoryMode", "0755") or "0755", 8),
        state_directory=one("StateDirectory"),
        state_directory_mode=int(one("StateDirectoryMode", "0755") or "0755", 8),
        environment=env,
        restart_sec=float(one("RestartSec", "0.1") or "0.1"),
        no_new_privileges=(one("NoNewPrivileges", "no") or "no").lower() in ("yes", "true", "1"),
        not_applied=tuple(sorted(f"{k}={v[-1]}" for k, v in service.items()
                                 if k not in APPLIED)),
    )


def load_unit(path: Path, instance: str | None = None) -> Unit:
    return parse_unit(path.read_text(encoding="utf-8"), path.name.replace("@", f"@{instance}")
                      if instance else path.name, instance)
