"""The emulated optical circuit switch itself: its connections, ports, light and switching time.

``SwitchModel`` is an N×N switch (ingress 1..N, egress N+1..2N) with the behaviour the
sources describe (docs/reference/devices/ocs.md): one egress per ingress, a connection takes
`switch_s` to make (the switch works through a request one connection after another), a
connection costs `loss_db` of light, and the connections are kept in an optional state file
so that they outlive a restart of the emulator process, as a real switch's optics hold when
its controller restarts. Requests that break a rule raise ``ScpiError`` with the standard code
before anything changes; a port that fails (``fail_port``) refuses its connection with -240
while the rest of the request goes through. Nothing here does network I/O.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from oddl.common.errors import ConfigError
from oddl.drivers.emulators.scpi import ScpiError

__all__ = ["DARK_DBM", "DEFAULT_LOSS_DB", "DEFAULT_SWITCH_S", "MAX_SIZE", "SwitchModel"]

DEFAULT_SWITCH_S = 0.025
"""Time to make one connection (sources: 25-50 ms)."""
DEFAULT_LOSS_DB = 1.5
"""Insertion loss of one connection (a lab's notes: about 1.5 dB)."""
DARK_DBM = -60.0
"""What a power monitor reads without light (our choice; no source gives the floor)."""
MAX_SIZE = 1024
HARDWARE_ERROR = -240


class SwitchModel:
    """An N×N switch's state; not thread-safe (the emulator holds its lock around it)."""

    def __init__(self, size: int = 16, *, switch_s: float = DEFAULT_SWITCH_S,
                 loss_db: float = DEFAULT_LOSS_DB, dark_dbm: float = DARK_DBM,
                 state_file: str | Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= size <= MAX_SIZE:
            raise ValueError(f"size={size}: use 1..{MAX_SIZE} (an N x N switch)")
        for label, value in (("switch_s", switch_s), ("loss_db", loss_db)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{label}={value}: use a number >= 0")
        self.size = size
        self.switch_s = switch_s
        self.loss_db = loss_db
        self.dark_dbm = dark_dbm
        self.clock = clock
        self.connections: dict[int, int] = {}
        """{ingress: egress}."""
        self.disabled: set[int] = set()
        self.failed: set[int] = set()
        self.input_dbm: dict[int, float] = {}
        """Light arriving at each ingress port (dBm); absent = dark."""
        self.busy_until = clock()
        """When the switch finishes the connections it is making (``*OPC?`` waits for it)."""
        self._settled_at: dict[int, float] = {}
        self.state_file = Path(state_file) if state_file is not None else None
        if self.state_file is not None and self.state_file.exists():
            self._load(self.state_file)

    # ----- ports ------------------------------------------------------------------------------

    @property
    def ports(self) -> range:
        return range(1, 2 * self.size + 1)

    def is_ingress(self, port: int) -> bool:
        return 1 <= port <= self.size

    def is_egress(self, port: int) -> bool:
        return self.size < port <= 2 * self.size

    def check_ports(self, ports: Iterable[int]) -> list[int]:
        """-222 for a port that does not exist."""
        out = list(ports)
        if any(p not in self.ports for p in out):
            raise ScpiError(-222)
        return out

    def partner(self, port: int) -> int | None:
        """The port `port` is connected to, or None."""
        if self.is_ingress(port):
            return self.connections.get(port)
        return next((i for i, e in self.connections.items() if e == port), None)

    # ----- connections --------------------------------------------------------------------

    def _check_pairs(self, ingress: list[int], egress: list[int]) -> list[tuple[int, int]]:
        """Ingress and egress lists as pairs: -224 when the lengths differ, -222 for a port
        on the wrong side, -221 for a port listed twice."""
        if len(ingress) != len(egress):
            raise ScpiError(-224)
        if not (all(self.is_ingress(p) for p in ingress) and all(self.is_egress(p) for p in egress)):
            raise ScpiError(-222)
        if len(set(ingress)) != len(ingress) or len(set(egress)) != len(egress):
            raise ScpiError(-221)
        return list(zip(ingress, egress, strict=True))

    def add(self, ingress: list[int], egress: list[int]) -> list[int]:
        """ADD: connect the pairs, leave the rest; -221 (nothing done) when a port is in use.
        Returns the errors of ports that failed to connect (the others are made)."""
        pairs = self._check_pairs(ingress, egress)
        used = set(self.connections) | set(self.connections.values())
        if any(i in used or e in used for i, e in pairs):
            raise ScpiError(-221)
        return self._make(pairs)

    def only(self, ingress: list[int], egress: list[int]) -> list[int]:
        """ONLY: the pairs become the whole table; pairs already connected stay untouched."""
        pairs = self._check_pairs(ingress, egress)
        keep = {i: e for i, e in pairs if self.connections.get(i) == e}
        for i in [i for i in self.connections if i not in keep]:
            self._break(i)
        return self._make([(i, e) for i, e in pairs if i not in keep])

    def subtract(self, first: list[int], second: list[int]) -> None:
        """SUBtract: with two lists, break those pairs (-224 lengths differ, -221 a pair that
        is not connected); with an empty second list, break whatever the listed ports have."""
        if not second:
            for port in self.check_ports(first):
                ingress = port if self.is_ingress(port) else self.partner(port)
                if ingress is not None and ingress in self.connections:
                    self._break(ingress)
        else:
            pairs = self._check_pairs(first, second)
            if any(self.connections.get(i) != e for i, e in pairs):
                raise ScpiError(-221)
            for i, _ in pairs:
                self._break(i)
        self.save()

    def disconnect_all(self) -> None:
        for ingress in list(self.connections):
            self._break(ingress)
        self.save()

    def _make(self, pairs: list[tuple[int, int]]) -> list[int]:
        """Connect `pairs` one after another from when the switch is free; -240 per pair
        with a failed port (that pair is skipped)."""
        errors: list[int] = []
        t = max(self.clock(), self.busy_until)
        for ingress, egress in pairs:
            if ingress in self.failed or egress in self.failed:
                errors.append(HARDWARE_ERROR)
                continue
            t += self.switch_s
            self.connections[ingress] = egress
            self._settled_at[ingress] = t
        self.busy_until = t
        self.connections = dict(sorted(self.connections.items()))
        self.save()
        return errors

    def _break(self, ingress: int) -> None:
        self.connections.pop(ingress, None)
        self._settled_at.pop(ingress, None)

    def tuning(self, ingress: int) -> bool:
        """Whether the connection of `ingress` is still being made."""
        return self.clock() < self._settled_at.get(ingress, -math.inf)

    def settled_at(self, ingress: int) -> float:
        """When the connection of `ingress` is (or was) complete; -inf for one loaded from
        the state file, inf when there is none."""
        if ingress not in self.connections:
            return math.inf
        return self._settled_at.get(ingress, -math.inf)

    def light_state(self) -> tuple[object, ...]:
        """What the light through the switch depends on (compared around a command)."""
        return (dict(self.connections), dict(self._settled_at), frozenset(self.disabled),
                frozenset(self.failed))

    # ----- ports' state and light ---------------------------------------------------------

    def set_enabled(self, ports: Iterable[int], enabled: bool) -> None:
        for port in self.check_ports(ports):
            if enabled:
                self.disabled.discard(port)
            else:
                self.disabled.add(port)
        self.save()

    def flag(self, port: int) -> str:
        """E (enabled), D (disabled) or F (failed)."""
        return "F" if port in self.failed else "D" if port in self.disabled else "E"

    def power_dbm(self, port: int) -> float:
        """What the monitor of `port` reads: an ingress port its input; an egress port the
        light of its ingress less the loss once connected, enabled and settled; else dark."""
        if self.is_ingress(port):
            return self.input_dbm.get(port, self.dark_dbm)
        ingress = self.partner(port)
        if (ingress is None or ingress not in self.input_dbm or self.tuning(ingress)
                or {ingress, port} & (self.disabled | self.failed)):
            return self.dark_dbm
        return max(self.input_dbm[ingress] - self.loss_db, self.dark_dbm)

    def reset(self) -> None:
        """*RST: no connections, every port enabled (failed ports stay failed)."""
        self.disabled.clear()
        self.disconnect_all()

    # ----- persistence --------------------------------------------------------------------

    def save(self) -> None:
        """Write the state file (atomically), when there is one."""
        if self.state_file is None:
            return
        data = {"size": self.size, "connections": [[i, e] for i, e in self.connections.items()],
                "disabled": sorted(self.disabled)}
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        os.replace(tmp, self.state_file)

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            size = int(data["size"])
            table = {int(i): int(e) for i, e in data["connections"]}
            disabled = {int(p) for p in data.get("disabled", [])}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"--state {path}: not an OCS emulator state file ({exc}); "
                              "remove it or name another file") from exc
        if size != self.size:
            raise ConfigError(f"--state {path} holds a {size}x{size} switch, not "
                              f"{self.size}x{self.size}; use --size {size} or another file")
        try:
            self._check_pairs(list(table), list(table.values()))
            self.check_ports(disabled)
        except ScpiError:
            raise ConfigError(f"--state {path}: its connections do not fit a "
                              f"{size}x{size} switch; remove the file") from None
        self.connections = dict(sorted(table.items()))
        self.disabled = disabled
