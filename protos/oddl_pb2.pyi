from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterAgentRequest(_message.Message):
    __slots__ = ("node_id", "data_address", "agent_version", "local_api", "instance")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_API_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    data_address: str
    agent_version: str
    local_api: str
    instance: str
    def __init__(self, node_id: _Optional[str] = ..., data_address: _Optional[str] = ..., agent_version: _Optional[str] = ..., local_api: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class RegisterAgentReply(_message.Message):
    __slots__ = ("session", "heartbeat_interval_s", "topology", "fabric_address", "link", "line_rate_bps", "clock_port")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    FABRIC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    LINE_RATE_BPS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_PORT_FIELD_NUMBER: _ClassVar[int]
    session: str
    heartbeat_interval_s: float
    topology: Topology
    fabric_address: str
    link: str
    line_rate_bps: float
    clock_port: int
    def __init__(self, session: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., topology: _Optional[_Union[Topology, _Mapping]] = ..., fabric_address: _Optional[str] = ..., link: _Optional[str] = ..., line_rate_bps: _Optional[float] = ..., clock_port: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "session", "clock_offset_s", "clock_rtt_s", "collectives_done", "collectives_failed", "gate_error_p50_s", "gate_error_p99_s", "bytes_sent", "clock_error_bound_s", "measured_line_rate_gbps", "sent_ns")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_S_FIELD_NUMBER: _ClassVar[int]
    CLOCK_RTT_S_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_DONE_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FAILED_FIELD_NUMBER: _ClassVar[int]
    GATE_ERROR_P50_S_FIELD_NUMBER: _ClassVar[int]
    GATE_ERROR_P99_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    CLOCK_ERROR_BOUND_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_LINE_RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    SENT_NS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    clock_offset_s: float
    clock_rtt_s: float
    collectives_done: int
    collectives_failed: int
    gate_error_p50_s: float
    gate_error_p99_s: float
    bytes_sent: int
    clock_error_bound_s: float
    measured_line_rate_gbps: float
    sent_ns: int
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., clock_offset_s: _Optional[float] = ..., clock_rtt_s: _Optional[float] = ..., collectives_done: _Optional[int] = ..., collectives_failed: _Optional[int] = ..., gate_error_p50_s: _Optional[float] = ..., gate_error_p99_s: _Optional[float] = ..., bytes_sent: _Optional[int] = ..., clock_error_bound_s: _Optional[float] = ..., measured_line_rate_gbps: _Optional[float] = ..., sent_ns: _Optional[int] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("controller_time_ns", "reregister")
    CONTROLLER_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    controller_time_ns: int
    reregister: bool
    def __init__(self, controller_time_ns: _Optional[int] = ..., reregister: _Optional[bool] = ...) -> None: ...

class SyncClockRequest(_message.Message):
    __slots__ = ("node_id", "agent_send_ns")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_SEND_NS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    agent_send_ns: int
    def __init__(self, node_id: _Optional[str] = ..., agent_send_ns: _Optional[int] = ...) -> None: ...

class SyncClockReply(_message.Message):
    __slots__ = ("agent_send_ns", "controller_receive_ns", "controller_send_ns")
    AGENT_SEND_NS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_RECEIVE_NS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_SEND_NS_FIELD_NUMBER: _ClassVar[int]
    agent_send_ns: int
    controller_receive_ns: int
    controller_send_ns: int
    def __init__(self, agent_send_ns: _Optional[int] = ..., controller_receive_ns: _Optional[int] = ..., controller_send_ns: _Optional[int] = ...) -> None: ...

class WatchScheduleRequest(_message.Message):
    __slots__ = ("node_id", "session")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class ScheduleEvent(_message.Message):
    __slots__ = ("assigned", "go", "ended", "circuits_ready", "peer_lost", "trace")
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    GO_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    CIRCUITS_READY_FIELD_NUMBER: _ClassVar[int]
    PEER_LOST_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    assigned: JobAssigned
    go: CollectiveGo
    ended: JobEnded
    circuits_ready: CircuitsReady
    peer_lost: PeerLost
    trace: TraceSwitch
    def __init__(self, assigned: _Optional[_Union[JobAssigned, _Mapping]] = ..., go: _Optional[_Union[CollectiveGo, _Mapping]] = ..., ended: _Optional[_Union[JobEnded, _Mapping]] = ..., circuits_ready: _Optional[_Union[CircuitsReady, _Mapping]] = ..., peer_lost: _Optional[_Union[PeerLost, _Mapping]] = ..., trace: _Optional[_Union[TraceSwitch, _Mapping]] = ...) -> None: ...

class TraceSwitch(_message.Message):
    __slots__ = ("on", "dir", "buffer_events")
    ON_FIELD_NUMBER: _ClassVar[int]
    DIR_FIELD_NUMBER: _ClassVar[int]
    BUFFER_EVENTS_FIELD_NUMBER: _ClassVar[int]
    on: bool
    dir: str
    buffer_events: int
    def __init__(self, on: _Optional[bool] = ..., dir: _Optional[str] = ..., buffer_events: _Optional[int] = ...) -> None: ...

class SetTraceRequest(_message.Message):
    __slots__ = ("on", "dir", "buffer_events")
    ON_FIELD_NUMBER: _ClassVar[int]
    DIR_FIELD_NUMBER: _ClassVar[int]
    BUFFER_EVENTS_FIELD_NUMBER: _ClassVar[int]
    on: bool
    dir: str
    buffer_events: int
    def __init__(self, on: _Optional[bool] = ..., dir: _Optional[str] = ..., buffer_events: _Optional[int] = ...) -> None: ...

class SetTraceReply(_message.Message):
    __slots__ = ("controller_file", "agents")
    CONTROLLER_FILE_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    controller_file: str
    agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, controller_file: _Optional[str] = ..., agents: _Optional[_Iterable[str]] = ...) -> None: ...

class CircuitsReady(_message.Message):
    __slots__ = ("job_id", "seq", "slot", "error")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    seq: int
    slot: int
    error: str
    def __init__(self, job_id: _Optional[str] = ..., seq: _Optional[int] = ..., slot: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class ConfirmDeliveryRequest(_message.Message):
    __slots__ = ("node_id", "job_id", "seq", "slot", "src")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    job_id: str
    seq: int
    slot: int
    src: str
    def __init__(self, node_id: _Optional[str] = ..., job_id: _Optional[str] = ..., seq: _Optional[int] = ..., slot: _Optional[int] = ..., src: _Optional[str] = ...) -> None: ...

class ConfirmDeliveryReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StartStandingRequest(_message.Message):
    __slots__ = ("node_id", "job_id", "seq", "t0_ns", "message_bytes", "itemsize", "schedule_sha256", "kind", "root")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    T0_NS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ITEMSIZE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_SHA256_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    job_id: str
    seq: int
    t0_ns: int
    message_bytes: int
    itemsize: int
    schedule_sha256: bytes
    kind: str
    root: int
    def __init__(self, node_id: _Optional[str] = ..., job_id: _Optional[str] = ..., seq: _Optional[int] = ..., t0_ns: _Optional[int] = ..., message_bytes: _Optional[int] = ..., itemsize: _Optional[int] = ..., schedule_sha256: _Optional[bytes] = ..., kind: _Optional[str] = ..., root: _Optional[int] = ...) -> None: ...

class StartStandingReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RequestFlowRequest(_message.Message):
    __slots__ = ("node_id", "job_id", "dst", "message_bytes", "tag", "lead_us")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    LEAD_US_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    job_id: str
    dst: str
    message_bytes: int
    tag: int
    lead_us: int
    def __init__(self, node_id: _Optional[str] = ..., job_id: _Optional[str] = ..., dst: _Optional[str] = ..., message_bytes: _Optional[int] = ..., tag: _Optional[int] = ..., lead_us: _Optional[int] = ...) -> None: ...

class FlowGrant(_message.Message):
    __slots__ = ("flow", "t0_ns", "hold_s", "channel", "retuned", "guard_s")
    FLOW_FIELD_NUMBER: _ClassVar[int]
    T0_NS_FIELD_NUMBER: _ClassVar[int]
    HOLD_S_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    RETUNED_FIELD_NUMBER: _ClassVar[int]
    GUARD_S_FIELD_NUMBER: _ClassVar[int]
    flow: int
    t0_ns: int
    hold_s: float
    channel: int
    retuned: bool
    guard_s: float
    def __init__(self, flow: _Optional[int] = ..., t0_ns: _Optional[int] = ..., hold_s: _Optional[float] = ..., channel: _Optional[int] = ..., retuned: _Optional[bool] = ..., guard_s: _Optional[float] = ...) -> None: ...

class JobAssigned(_message.Message):
    __slots__ = ("job", "rank", "peers", "next_seq")
    class PeersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    job: Job
    rank: int
    peers: _containers.ScalarMap[str, str]
    next_seq: int
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., rank: _Optional[int] = ..., peers: _Optional[_Mapping[str, str]] = ..., next_seq: _Optional[int] = ...) -> None: ...

class PeerLost(_message.Message):
    __slots__ = ("job_id", "node_id", "reason", "also")
    class AlsoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ALSO_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    node_id: str
    reason: str
    also: _containers.ScalarMap[str, str]
    def __init__(self, job_id: _Optional[str] = ..., node_id: _Optional[str] = ..., reason: _Optional[str] = ..., also: _Optional[_Mapping[str, str]] = ...) -> None: ...

class JobEnded(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReadyCollectiveRequest(_message.Message):
    __slots__ = ("node_id", "job_id", "seq", "shape", "dtype", "caller_step", "kind", "op", "root")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    CALLER_STEP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    job_id: str
    seq: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    caller_step: int
    kind: str
    op: str
    root: int
    def __init__(self, node_id: _Optional[str] = ..., job_id: _Optional[str] = ..., seq: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., caller_step: _Optional[int] = ..., kind: _Optional[str] = ..., op: _Optional[str] = ..., root: _Optional[int] = ...) -> None: ...

class ReadyCollectiveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CollectiveGo(_message.Message):
    __slots__ = ("job_id", "seq", "t0_ns", "schedule", "error", "caller_steps")
    class CallerStepsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    T0_NS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CALLER_STEPS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    seq: int
    t0_ns: int
    schedule: Schedule
    error: str
    caller_steps: _containers.ScalarMap[str, int]
    def __init__(self, job_id: _Optional[str] = ..., seq: _Optional[int] = ..., t0_ns: _Optional[int] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ..., error: _Optional[str] = ..., caller_steps: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ReportCollectiveRequest(_message.Message):
    __slots__ = ("node_id", "job_id", "seq", "ok", "error", "duration_s", "gate_error_max_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    GATE_ERROR_MAX_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    job_id: str
    seq: int
    ok: bool
    error: str
    duration_s: float
    gate_error_max_s: float
    def __init__(self, node_id: _Optional[str] = ..., job_id: _Optional[str] = ..., seq: _Optional[int] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., duration_s: _Optional[float] = ..., gate_error_max_s: _Optional[float] = ...) -> None: ...

class ReportCollectiveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("name", "nodes", "collective", "network", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    collective: str
    network: str
    params: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., collective: _Optional[str] = ..., network: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "name", "nodes", "collective", "network", "state", "reason", "collectives_done", "reconfigurations", "guard_time_s", "submitted_ns", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_DONE_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURATIONS_FIELD_NUMBER: _ClassVar[int]
    GUARD_TIME_S_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_NS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    collective: str
    network: str
    state: str
    reason: str
    collectives_done: int
    reconfigurations: int
    guard_time_s: float
    submitted_ns: int
    params: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., collective: _Optional[str] = ..., network: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., collectives_done: _Optional[int] = ..., reconfigurations: _Optional[int] = ..., guard_time_s: _Optional[float] = ..., submitted_ns: _Optional[int] = ..., params: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ("job_id", "message_bytes", "itemsize", "kind", "root")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ITEMSIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    message_bytes: int
    itemsize: int
    kind: str
    root: int
    def __init__(self, job_id: _Optional[str] = ..., message_bytes: _Optional[int] = ..., itemsize: _Optional[int] = ..., kind: _Optional[str] = ..., root: _Optional[int] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("job_id", "collective", "n_elems", "itemsize", "slots", "reconfigurations", "guard_total_s", "makespan_s", "efficiency", "steps", "receive_timeout_s", "node_id", "whole_sha256", "whole_retunes", "whole_ends_where_it_starts")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    N_ELEMS_FIELD_NUMBER: _ClassVar[int]
    ITEMSIZE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURATIONS_FIELD_NUMBER: _ClassVar[int]
    GUARD_TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    MAKESPAN_S_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WHOLE_SHA256_FIELD_NUMBER: _ClassVar[int]
    WHOLE_RETUNES_FIELD_NUMBER: _ClassVar[int]
    WHOLE_ENDS_WHERE_IT_STARTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    collective: str
    n_elems: int
    itemsize: int
    slots: _containers.RepeatedCompositeFieldContainer[Slot]
    reconfigurations: int
    guard_total_s: float
    makespan_s: float
    efficiency: float
    steps: _containers.RepeatedCompositeFieldContainer[PlanStep]
    receive_timeout_s: float
    node_id: str
    whole_sha256: bytes
    whole_retunes: bool
    whole_ends_where_it_starts: bool
    def __init__(self, job_id: _Optional[str] = ..., collective: _Optional[str] = ..., n_elems: _Optional[int] = ..., itemsize: _Optional[int] = ..., slots: _Optional[_Iterable[_Union[Slot, _Mapping]]] = ..., reconfigurations: _Optional[int] = ..., guard_total_s: _Optional[float] = ..., makespan_s: _Optional[float] = ..., efficiency: _Optional[float] = ..., steps: _Optional[_Iterable[_Union[PlanStep, _Mapping]]] = ..., receive_timeout_s: _Optional[float] = ..., node_id: _Optional[str] = ..., whole_sha256: _Optional[bytes] = ..., whole_retunes: _Optional[bool] = ..., whole_ends_where_it_starts: _Optional[bool] = ...) -> None: ...

class Slot(_message.Message):
    __slots__ = ("index", "step", "start_ns", "data_start_ns", "end_ns", "circuits", "changes_circuits", "handoffs", "keeps_circuits")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    DATA_START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    CIRCUITS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_CIRCUITS_FIELD_NUMBER: _ClassVar[int]
    HANDOFFS_FIELD_NUMBER: _ClassVar[int]
    KEEPS_CIRCUITS_FIELD_NUMBER: _ClassVar[int]
    index: int
    step: int
    start_ns: int
    data_start_ns: int
    end_ns: int
    circuits: _containers.RepeatedCompositeFieldContainer[Circuit]
    changes_circuits: bool
    handoffs: _containers.RepeatedCompositeFieldContainer[Handoff]
    keeps_circuits: bool
    def __init__(self, index: _Optional[int] = ..., step: _Optional[int] = ..., start_ns: _Optional[int] = ..., data_start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., circuits: _Optional[_Iterable[_Union[Circuit, _Mapping]]] = ..., changes_circuits: _Optional[bool] = ..., handoffs: _Optional[_Iterable[_Union[Handoff, _Mapping]]] = ..., keeps_circuits: _Optional[bool] = ...) -> None: ...

class Handoff(_message.Message):
    __slots__ = ("slot", "src", "dst")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    slot: int
    src: str
    dst: str
    def __init__(self, slot: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ...) -> None: ...

class Circuit(_message.Message):
    __slots__ = ("src", "dst", "transmitter", "channel", "frequency_thz", "wss", "in_port", "out_port", "bytes", "retune")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TRANSMITTER_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_THZ_FIELD_NUMBER: _ClassVar[int]
    WSS_FIELD_NUMBER: _ClassVar[int]
    IN_PORT_FIELD_NUMBER: _ClassVar[int]
    OUT_PORT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    RETUNE_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    transmitter: str
    channel: int
    frequency_thz: float
    wss: str
    in_port: str
    out_port: int
    bytes: int
    retune: bool
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., transmitter: _Optional[str] = ..., channel: _Optional[int] = ..., frequency_thz: _Optional[float] = ..., wss: _Optional[str] = ..., in_port: _Optional[str] = ..., out_port: _Optional[int] = ..., bytes: _Optional[int] = ..., retune: _Optional[bool] = ...) -> None: ...

class PlanStep(_message.Message):
    __slots__ = ("op", "src", "dst", "offset", "length", "recv_offset")
    OP_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    RECV_OFFSET_FIELD_NUMBER: _ClassVar[int]
    op: str
    src: _containers.RepeatedScalarFieldContainer[int]
    dst: _containers.RepeatedScalarFieldContainer[int]
    offset: _containers.RepeatedScalarFieldContainer[int]
    length: _containers.RepeatedScalarFieldContainer[int]
    recv_offset: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, op: _Optional[str] = ..., src: _Optional[_Iterable[int]] = ..., dst: _Optional[_Iterable[int]] = ..., offset: _Optional[_Iterable[int]] = ..., length: _Optional[_Iterable[int]] = ..., recv_offset: _Optional[_Iterable[int]] = ...) -> None: ...

class GetTopologyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Topology(_message.Message):
    __slots__ = ("testbed", "nodes", "devices", "grid_first_thz", "grid_spacing_ghz", "grid_channels", "port_links")
    TESTBED_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    GRID_FIRST_THZ_FIELD_NUMBER: _ClassVar[int]
    GRID_SPACING_GHZ_FIELD_NUMBER: _ClassVar[int]
    GRID_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    PORT_LINKS_FIELD_NUMBER: _ClassVar[int]
    testbed: str
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    grid_first_thz: float
    grid_spacing_ghz: float
    grid_channels: int
    port_links: _containers.RepeatedCompositeFieldContainer[PortLink]
    def __init__(self, testbed: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., grid_first_thz: _Optional[float] = ..., grid_spacing_ghz: _Optional[float] = ..., grid_channels: _Optional[int] = ..., port_links: _Optional[_Iterable[_Union[PortLink, _Mapping]]] = ...) -> None: ...

class PortLink(_message.Message):
    __slots__ = ("node", "port", "switch", "ingress", "egress")
    NODE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    SWITCH_FIELD_NUMBER: _ClassVar[int]
    INGRESS_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    node: str
    port: int
    switch: str
    ingress: int
    egress: int
    def __init__(self, node: _Optional[str] = ..., port: _Optional[int] = ..., switch: _Optional[str] = ..., ingress: _Optional[int] = ..., egress: _Optional[int] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("id", "host", "transmitter", "rx_channel", "wss", "out_port")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TRANSMITTER_FIELD_NUMBER: _ClassVar[int]
    RX_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    WSS_FIELD_NUMBER: _ClassVar[int]
    OUT_PORT_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    transmitter: str
    rx_channel: int
    wss: str
    out_port: int
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., transmitter: _Optional[str] = ..., rx_channel: _Optional[int] = ..., wss: _Optional[str] = ..., out_port: _Optional[int] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("id", "kind", "resource")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    resource: str
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., resource: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Status(_message.Message):
    __slots__ = ("testbed", "controller_time_ns", "agents", "jobs", "reconfigurations", "transactions_failed")
    TESTBED_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURATIONS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONS_FAILED_FIELD_NUMBER: _ClassVar[int]
    testbed: str
    controller_time_ns: int
    agents: _containers.RepeatedCompositeFieldContainer[AgentStatus]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    reconfigurations: int
    transactions_failed: int
    def __init__(self, testbed: _Optional[str] = ..., controller_time_ns: _Optional[int] = ..., agents: _Optional[_Iterable[_Union[AgentStatus, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., reconfigurations: _Optional[int] = ..., transactions_failed: _Optional[int] = ...) -> None: ...

class AgentStatus(_message.Message):
    __slots__ = ("node_id", "alive", "last_heartbeat_age_s", "clock_offset_s", "clock_rtt_s", "gate_error_p50_s", "gate_error_p99_s", "collectives_done", "collectives_failed", "data_address", "clock_error_bound_s", "measured_line_rate_gbps")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_S_FIELD_NUMBER: _ClassVar[int]
    CLOCK_RTT_S_FIELD_NUMBER: _ClassVar[int]
    GATE_ERROR_P50_S_FIELD_NUMBER: _ClassVar[int]
    GATE_ERROR_P99_S_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_DONE_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FAILED_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_ERROR_BOUND_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_LINE_RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    alive: bool
    last_heartbeat_age_s: float
    clock_offset_s: float
    clock_rtt_s: float
    gate_error_p50_s: float
    gate_error_p99_s: float
    collectives_done: int
    collectives_failed: int
    data_address: str
    clock_error_bound_s: float
    measured_line_rate_gbps: float
    def __init__(self, node_id: _Optional[str] = ..., alive: _Optional[bool] = ..., last_heartbeat_age_s: _Optional[float] = ..., clock_offset_s: _Optional[float] = ..., clock_rtt_s: _Optional[float] = ..., gate_error_p50_s: _Optional[float] = ..., gate_error_p99_s: _Optional[float] = ..., collectives_done: _Optional[int] = ..., collectives_failed: _Optional[int] = ..., data_address: _Optional[str] = ..., clock_error_bound_s: _Optional[float] = ..., measured_line_rate_gbps: _Optional[float] = ...) -> None: ...

class GetDeviceStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceStateList(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceState]
    def __init__(self, devices: _Optional[_Iterable[_Union[DeviceState, _Mapping]]] = ...) -> None: ...

class DeviceState(_message.Message):
    __slots__ = ("id", "kind", "reachable", "error", "channel", "frequency_thz", "power_dbm", "output_enabled", "locked", "routes", "verified_ns", "meter", "connections")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_THZ_FIELD_NUMBER: _ClassVar[int]
    POWER_DBM_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ENABLED_FIELD_NUMBER: _ClassVar[int]
    LOCKED_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_NS_FIELD_NUMBER: _ClassVar[int]
    METER_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    reachable: bool
    error: str
    channel: int
    frequency_thz: float
    power_dbm: float
    output_enabled: bool
    locked: bool
    routes: _containers.RepeatedCompositeFieldContainer[WssRoute]
    verified_ns: int
    meter: _containers.RepeatedCompositeFieldContainer[MeterReading]
    connections: _containers.RepeatedCompositeFieldContainer[OcsConnection]
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., reachable: _Optional[bool] = ..., error: _Optional[str] = ..., channel: _Optional[int] = ..., frequency_thz: _Optional[float] = ..., power_dbm: _Optional[float] = ..., output_enabled: _Optional[bool] = ..., locked: _Optional[bool] = ..., routes: _Optional[_Iterable[_Union[WssRoute, _Mapping]]] = ..., verified_ns: _Optional[int] = ..., meter: _Optional[_Iterable[_Union[MeterReading, _Mapping]]] = ..., connections: _Optional[_Iterable[_Union[OcsConnection, _Mapping]]] = ...) -> None: ...

class OcsConnection(_message.Message):
    __slots__ = ("ingress", "egress", "power", "ingress_dbm", "egress_dbm")
    INGRESS_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    INGRESS_DBM_FIELD_NUMBER: _ClassVar[int]
    EGRESS_DBM_FIELD_NUMBER: _ClassVar[int]
    ingress: int
    egress: int
    power: bool
    ingress_dbm: float
    egress_dbm: float
    def __init__(self, ingress: _Optional[int] = ..., egress: _Optional[int] = ..., power: _Optional[bool] = ..., ingress_dbm: _Optional[float] = ..., egress_dbm: _Optional[float] = ...) -> None: ...

class MeterReading(_message.Message):
    __slots__ = ("channel", "power_dbm", "light")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    POWER_DBM_FIELD_NUMBER: _ClassVar[int]
    LIGHT_FIELD_NUMBER: _ClassVar[int]
    channel: int
    power_dbm: float
    light: bool
    def __init__(self, channel: _Optional[int] = ..., power_dbm: _Optional[float] = ..., light: _Optional[bool] = ...) -> None: ...

class WssRoute(_message.Message):
    __slots__ = ("channel", "port", "attenuation_db")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ATTENUATION_DB_FIELD_NUMBER: _ClassVar[int]
    channel: int
    port: int
    attenuation_db: float
    def __init__(self, channel: _Optional[int] = ..., port: _Optional[int] = ..., attenuation_db: _Optional[float] = ...) -> None: ...

class GetDeviceLogRequest(_message.Message):
    __slots__ = ("limit", "device")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    limit: int
    device: str
    def __init__(self, limit: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class DeviceLog(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DeviceLogEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[DeviceLogEntry, _Mapping]]] = ...) -> None: ...

class DeviceLogEntry(_message.Message):
    __slots__ = ("time_ns", "device", "action", "ok", "detail")
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    time_ns: int
    device: str
    action: str
    ok: bool
    detail: str
    def __init__(self, time_ns: _Optional[int] = ..., device: _Optional[str] = ..., action: _Optional[str] = ..., ok: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class ReconfigureRequest(_message.Message):
    __slots__ = ("set_channel", "set_route", "set_connections", "dry_run")
    SET_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    SET_ROUTE_FIELD_NUMBER: _ClassVar[int]
    SET_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    set_channel: SetChannel
    set_route: SetRoute
    set_connections: SetConnections
    dry_run: bool
    def __init__(self, set_channel: _Optional[_Union[SetChannel, _Mapping]] = ..., set_route: _Optional[_Union[SetRoute, _Mapping]] = ..., set_connections: _Optional[_Union[SetConnections, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class SetChannel(_message.Message):
    __slots__ = ("transmitter", "channel")
    TRANSMITTER_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    transmitter: str
    channel: int
    def __init__(self, transmitter: _Optional[str] = ..., channel: _Optional[int] = ...) -> None: ...

class SetRoute(_message.Message):
    __slots__ = ("wss", "channel", "port", "attenuation_db")
    WSS_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ATTENUATION_DB_FIELD_NUMBER: _ClassVar[int]
    wss: str
    channel: int
    port: int
    attenuation_db: float
    def __init__(self, wss: _Optional[str] = ..., channel: _Optional[int] = ..., port: _Optional[int] = ..., attenuation_db: _Optional[float] = ...) -> None: ...

class SetConnections(_message.Message):
    __slots__ = ("ocs", "connect", "disconnect")
    class ConnectEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    OCS_FIELD_NUMBER: _ClassVar[int]
    CONNECT_FIELD_NUMBER: _ClassVar[int]
    DISCONNECT_FIELD_NUMBER: _ClassVar[int]
    ocs: str
    connect: _containers.ScalarMap[int, int]
    disconnect: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ocs: _Optional[str] = ..., connect: _Optional[_Mapping[int, int]] = ..., disconnect: _Optional[_Iterable[int]] = ...) -> None: ...

class ReconfigureReply(_message.Message):
    __slots__ = ("applied", "changes", "message")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    changes: _containers.RepeatedScalarFieldContainer[str]
    message: str
    def __init__(self, applied: _Optional[bool] = ..., changes: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ...) -> None: ...
