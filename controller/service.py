"""The controller's old entry module; its names now live in modules named for their jobs.

`ControllerServer` (the process) is in `controller.server`, `ControllerService` (the gRPC
servicer) in `controller.servicer`; the agents registry, collective starts and the slot
executor are in `controller.agent_registry`, `controller.collective_starts` and
`controller.slot_executor`.
"""

from __future__ import annotations

from controller.server import (  # house: re-export for controller.server
    ControllerServer,
    default_configuration,
    is_loopback,
)
from controller.servicer import ControllerService  # house: re-export for controller.servicer

__all__ = ["ControllerServer", "ControllerService", "default_configuration", "is_loopback"]
