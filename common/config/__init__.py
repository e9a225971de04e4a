"""The testbed file: one TOML document that describes a testbed, validated on load.

A testbed file names the nodes, the devices and their driver resources, the fibres between
them, the wavelength grid, the device timing and the control-plane addresses. The emulated and
the lab testbed differ only in this file. Every error names the file, the key and the fix.

This package is the public face: import the names below from ``common.config``. Inside,
:mod:`~common.config.schema` says what a testbed is (frozen dataclasses),
:mod:`~common.config.channel_plan` a WSS module's own channel plan and the map onto it,
:mod:`~common.config.parser` loads, validates and writes the file, reading the tables with
:mod:`~common.config.reader`, the devices with :mod:`~common.config.devices`, and the nodes and
fibres with :mod:`~common.config.wiring`.
"""

from common.config.channel_plan import FixedPlan, UnmappedChannel, channel_map
from common.config.parser import dump_testbed, load_testbed, parse_testbed
from common.config.schema import (
    DEVICE_KINDS,
    EMULATED,
    LINK_KINDS,
    OPTINC,
    OPTINC_MAX_INPUTS,
    TRANSPORTS,
    AgentConfig,
    Attachment,
    ControllerConfig,
    DeviceConfig,
    Endpoint,
    FabricConfig,
    FibreConfig,
    GridConfig,
    NodeConfig,
    OptincDeviceConfig,
    SecurityConfig,
    TestbedConfig,
    TimingConfig,
)

__all__ = [
    "DEVICE_KINDS", "EMULATED", "LINK_KINDS", "OPTINC", "OPTINC_MAX_INPUTS", "TRANSPORTS",
    "AgentConfig", "Attachment", "ControllerConfig", "DeviceConfig", "Endpoint", "FabricConfig",
    "FibreConfig", "FixedPlan", "GridConfig", "NodeConfig", "OptincDeviceConfig",
    "SecurityConfig", "TestbedConfig", "TimingConfig", "UnmappedChannel", "channel_map",
    "dump_testbed", "load_testbed", "parse_testbed",
]
