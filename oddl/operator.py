"""The operator's client of the controller API, and the tables the CLI prints."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from oddl.errors import ControllerUnavailable, OperationRefused
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

_REFUSALS = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
             grpc.StatusCode.ABORTED, grpc.StatusCode.UNAUTHENTICATED)


def _as_dict(msg: Any) -> dict[str, Any]:
    return MessageToDict(msg, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)


class OperatorClient:
    """Calls the controller and turns gRPC failures into typed errors with a fix."""

    def __init__(self, address: str, timeout_s: float = 10.0):
        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.ControllerStub(self._channel)

    def _call(self, name: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return getattr(self._stub, name)(request, timeout=timeout or self.timeout_s)
        except grpc.RpcError as exc:
            code, detail = exc.code(), exc.details()
            if code in _REFUSALS:
                raise OperationRefused(detail) from exc
            raise ControllerUnavailable(
                f"the controller at {self.address} did not answer ({code.name}: {detail}); "
                "check the address (--controller / ODDL_CONTROLLER) and that "
                "`oddl controller serve` is running") from exc

    def status(self) -> dict[str, Any]:
        """Agents, jobs and counters."""
        return _as_dict(self._call("GetStatus", pb.GetStatusRequest()))

    def topology(self) -> dict[str, Any]:
        """Nodes, devices and the grid."""
        return _as_dict(self._call("GetTopology", pb.GetTopologyRequest()))

    def devices(self) -> dict[str, Any]:
        """Every device read back now."""
        return _as_dict(self._call("GetDeviceState", pb.GetDeviceStateRequest()))

    def jobs(self) -> list[dict[str, Any]]:
        """All jobs."""
        return _as_dict(self._call("ListJobs", pb.ListJobsRequest())).get("jobs", [])

    def submit(self, name: str, nodes: list[str], collective: str, network: str,
               params: dict[str, str] | None = None) -> dict[str, Any]:
        """Submit a job; returns it."""
        req = pb.SubmitJobRequest(name=name, nodes=nodes, collective=collective,
                                  network=network, params=params or {})
        return _as_dict(self._call("SubmitJob", req, timeout=60))

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job; returns it."""
        return _as_dict(self._call("CancelJob", pb.CancelJobRequest(job_id=job_id)))

    def schedule(self, job_id: str, message_bytes: int, itemsize: int = 4) -> pb.Schedule:
        """The schedule a job's collective gets for `message_bytes`."""
        return self._call("GetSchedule", pb.GetScheduleRequest(
            job_id=job_id, message_bytes=message_bytes, itemsize=itemsize))

    def reconfigure(self, change: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        """Apply (or preview) one operator change."""
        req = pb.ReconfigureRequest(dry_run=dry_run, **{k: v for k, v in change.items()})
        return _as_dict(self._call("Reconfigure", req, timeout=60))

    def close(self) -> None:
        """Release the channel."""
        self._channel.close()


def format_status(status: dict[str, Any]) -> str:
    """A table for people."""
    lines = [f"testbed {status.get('testbed', '?')}: {status.get('reconfigurations', 0)} "
             f"reconfigurations, {status.get('transactions_failed', 0)} failed transactions", "",
             f"{'node':<6} {'alive':<6} {'hb age':>8} {'offset':>10} {'gate p50':>10} "
             f"{'gate p99':>10} {'done':>6} {'failed':>6}"]
    for a in status.get("agents", []):
        lines.append(f"{a['node_id']:<6} {'yes' if a['alive'] else 'NO':<6} "
                     f"{a['last_heartbeat_age_s']:>7.2f}s {a['clock_offset_s'] * 1e6:>8.1f}µs "
                     f"{a['gate_error_p50_s'] * 1e6:>8.1f}µs {a['gate_error_p99_s'] * 1e6:>8.1f}µs "
                     f"{int(a['collectives_done']):>6} {int(a['collectives_failed']):>6}")
    lines += ["", format_jobs(status.get("jobs", []))]
    return "\n".join(lines)


def format_jobs(jobs: list[dict[str, Any]]) -> str:
    """Jobs as a table."""
    if not jobs:
        return "no jobs"
    lines = [f"{'job':<8} {'state':<10} {'collective':<18} {'network':<8} {'nodes':<16} "
             f"{'done':>6} {'retunes':>8}"]
    for j in jobs:
        lines.append(f"{j['id']:<8} {j['state']:<10} {j['collective']:<18} {j['network']:<8} "
                     f"{','.join(j['nodes']):<16} {int(j['collectives_done']):>6} "
                     f"{int(j['reconfigurations']):>8}")
    return "\n".join(lines)
