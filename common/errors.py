"""Typed errors shared by every layer; the CLI maps them to exit codes.

Every message names the thing that is wrong and what to do about it.
"""

from __future__ import annotations


class OddlError(Exception):
    """Base of every error oddl raises on purpose."""


class ConfigError(OddlError):
    """A testbed file is malformed or inconsistent."""


class MissingExtra(ConfigError):
    """A command needs a package of an optional extra this host did not install
    (`oddl.common.extras`); the message names the extra to install."""


class DeviceError(OddlError):
    """A device refused a command, answered wrongly, or did not answer."""

    def __init__(self, message: str, *, device: str = "") -> None:
        super().__init__(f"{device}: {message}" if device else message)
        self.device = device


class DeviceTimeout(DeviceError):
    """A device did not answer (or did not finish an operation) in time."""


class ProtocolError(DeviceError):
    """Bytes on the wire do not follow the device protocol (bad checksum, bad echo, garbage)."""


class SafetyLimitError(OddlError):
    """A requested setting is outside the limits the testbed file allows; nothing was sent."""


class ScheduleError(OddlError):
    """A collective or schedule cannot be built for the given topology and parameters."""


class PlanError(ScheduleError):
    """A collective plan cannot serve the requested N, W or degree."""


class CollectiveError(OddlError):
    """An all-reduce failed: lost data, mismatched inputs, a dead peer, or a cancelled job."""


class LostData(CollectiveError):
    """Chunks a collective needed did not arrive in time (a link, a light path or a peer)."""


class CallsDiffer(CollectiveError):
    """The ranks ran different calls in one collective (its kind, op, root, dtype or block
    sizes differ): their results differ, so it fails on every rank."""


class StepMismatch(CollectiveError):
    """The ranks handed in different calls for one collective (their step numbers differ):
    pairing them would reduce different training steps together, so nothing was run."""


class StepPassed(StepMismatch):
    """This rank's call is for a step another rank is already past: that rank finished or gave
    up the step and will not make the call again, so retrying it can never pair. The caller
    goes on with the next step (this step's result is lost on this rank)."""


class ControllerUnavailable(OddlError):
    """The controller could not be reached."""


class OperationRefused(OddlError):
    """The controller refused an operation (unknown node, unknown job, not allowed)."""


class PeerDown(OperationRefused):
    """A peer of the job is down and did not come back within the call's timeout; the call
    was not run (it consumed no step)."""


class AgentRestarted(OperationRefused):
    """A request was made to an agent that has since restarted (another generation); it was
    not run."""


class SecurityError(OddlError):
    """Keys or certificates are missing, malformed, expired or would be overwritten."""


class BucketUnavailable(OperationRefused):
    """The agent cannot use the shared-memory bucket a request names; `kind` says why and
    what the client does: ``bucket-unknown`` (the token is not this agent's: hand the
    descriptor over again) or ``bucket-unreachable`` (the agent cannot map the bucket file:
    send the bytes instead)."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
