"""The ``[[device_hosts]]`` entries of a testbed file: which process drives which transmitters
(decision record 0036). Every error names the file, the entry and the fix."""

from __future__ import annotations

from typing import Any

from oddl.common.config.reader import REQUIRED, TableReader
from oddl.common.config.schema import DeviceConfig, DeviceHostConfig


def device_hosts(read: TableReader, raw: Any, devices: tuple[DeviceConfig, ...]
                 ) -> tuple[DeviceHostConfig, ...]:
    """The device hosts, each with a `host:port` address and the transmitters it drives
    (each at most once in the file; only transmitters: the WSS and switches stay with the
    controller, which sets them in the same transaction as the lasers)."""
    out: list[DeviceHostConfig] = []
    owner: dict[str, str] = {}
    kinds = {d.id: d.kind for d in devices}
    for i, entry in enumerate(read.array(raw, "device_hosts")):
        key = read.entry_key("device_hosts", i, entry)
        values = read.table(entry, key, {"id": (read.text(), REQUIRED),
                                         "address": (read.text(), REQUIRED),
                                         "devices": (_names(read), REQUIRED)})
        if any(h.id == values["id"] for h in out):
            raise read.fail(f"{key}.id", f"duplicate device host id {values['id']!r}",
                            "give every device host its own id")
        host, _, port = values["address"].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise read.fail(f"{key}.address", f"{values['address']!r} is not host:port",
                            'write where the controller reaches it, e.g. "10.0.0.5:7100"')
        for dev in values["devices"]:
            if dev not in kinds:
                raise read.fail(f"{key}.devices", f"names device {dev!r}, which is not defined",
                                "add a [[devices]] entry with that id, or fix the name")
            if kinds[dev] != "itla":
                raise read.fail(f"{key}.devices", f"{dev!r} is a {kinds[dev]}; a device host "
                                "drives transmitters (itla) only",
                                "leave WSS, switches and meters with the controller")
            if dev in owner:
                raise read.fail(f"{key}.devices", f"{dev!r} is driven by device host "
                                f"{owner[dev]!r} already", "name each device in one host")
            owner[dev] = values["id"]
        out.append(DeviceHostConfig(values["id"], values["address"], tuple(values["devices"])))
    return tuple(out)


def _names(read: TableReader) -> Any:
    def conv(v: Any, key: str) -> list[str]:
        if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
            raise read.fail(key, f"expected a list of device ids, got {v!r}",
                            'write devices = ["laser0", "laser1"]')
        if len(set(v)) != len(v):
            raise read.fail(key, "names a device twice", "name each device once")
        return list(v)
    return conv
