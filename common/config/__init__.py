"""The testbed file: one TOML document that describes a testbed, validated on load.

A testbed file names the nodes, the devices and their driver resources, the fibres between
them, the wavelength grid, the device timing and the control-plane addresses. The emulated and
the lab testbed differ only in this file. Every error names the file, the key and the fix.

This package is the public face: import the names below from ``oddl.common.config``. Inside,
:mod:`~oddl.common.config.schema` says what a testbed is (frozen dataclasses),
:mod:`~oddl.common.config.channel_plan` a WSS module's own channel plan and the map onto it,
:mod:`~oddl.common.config.parser` loads, validates and writes the file, reading the tables with
:mod:`~oddl.common.config.reader`, the devices with :mod:`~oddl.common.config.devices`, and the nodes and
fibres with :mod:`~oddl.common.config.wiring`.
"""

from oddl.common.config.channel_plan import FixedPlan, UnmappedChannel, channel_map
from oddl.common.config.parser import dump_testbed, load_testbed, parse_testbed
from oddl.common.config.schema import (
    DEVICE_KINDS,
    EMULATED,
    LINK_KINDS,
    OCS,
    OPTINC,
    OPTINC_MAX_INPUTS,
    TRANSPORTS,
    AgentConfig,
    Attachment,
    ControllerConfig,
    DeviceConfig,
    DeviceHostConfig,
    Endpoint,
    FabricConfig,
    FibreConfig,
    GridConfig,
    NodeConfig,
    OptincDeviceConfig,
    PortLink,
    SecurityConfig,
    TestbedConfig,
    TimingConfig,
)

__all__ = [
    "DEVICE_KINDS", "EMULATED", "LINK_KINDS", "OCS", "OPTINC", "OPTINC_MAX_INPUTS", "TRANSPORTS",
    "AgentConfig", "Attachment", "ControllerConfig", "DeviceConfig", "DeviceHostConfig", "Endpoint", "FabricConfig",
    "FibreConfig", "FixedPlan", "GridConfig", "NodeConfig", "OptincDeviceConfig", "PortLink",
    "SecurityConfig", "TestbedConfig", "TimingConfig", "UnmappedChannel", "channel_map",
    "dump_testbed", "load_testbed", "parse_testbed",
]
