"""Where the local API listens: a Unix socket only its owner can open, by default.

The local API accepts all-reduce requests for the node, on buckets its clients share with it
(handed over as descriptors on the bucket socket beside an ipc socket, `bucket_socket`).
Over TCP any local user could reach it; a Unix socket in a private folder (mode 0700, the
socket itself 0600) limits it to the agent's own user, which the kernel checks at connect
time. `ipc://auto` picks such a path; an explicit `ipc://PATH` is used as given (its folder
must exist and must not be writable by others); `tcp://` is accepted only on loopback and
logs that it is reachable by every local user.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket as pysocket
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from oddl.common.collective_kinds import ALL_REDUCE, check_call
from oddl.common.errors import (
    AgentRestarted,
    BucketUnavailable,
    CallsDiffer,
    CollectiveError,
    ConfigError,
    LostData,
    OddlError,
    OperationRefused,
    PeerDown,
    StepMismatch,
    StepPassed,
)

logger = logging.getLogger(__name__)

AUTO = "ipc://auto"
_LOOPBACK = ("127.", "localhost", "[::1]")
# sun_path holds 108 bytes with the terminating NUL
_MAX_IPC_PATH = 107
BUCKET_SUFFIX = ".buckets"
"""The bucket socket sits beside the local API socket, at its path plus this suffix."""


def runtime_dir(shared: bool = False) -> Path:
    """The folder for agent sockets: $XDG_RUNTIME_DIR/oddl or /tmp/oddl-<uid>; for a socket
    shared with a group always the latter (a user's runtime folder is closed to others)."""
    base = None if shared else os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "oddl" if base else Path(tempfile.gettempdir()) / f"oddl-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(path)
    return path


def check_private_dir(path: Path) -> None:
    """Refuse a socket folder that another user owns or may write (they could swap the socket)."""
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"local API folder {path} is not a directory; remove it or set "
                          "XDG_RUNTIME_DIR to a private folder")
    if st.st_uid != os.getuid():
        raise ConfigError(f"local API folder {path} belongs to uid {st.st_uid}, not to this "
                          f"user ({os.getuid()}); remove it or set XDG_RUNTIME_DIR")
    if st.st_mode & 0o022:
        raise ConfigError(f"local API folder {path} is writable by others (mode "
                          f"{st.st_mode & 0o777:o}); chmod 700 it")


def bind(socket: zmq.Socket, address: str, node_id: str, group: str | None = None) -> str:
    """Bind the local API socket to `address`; return the address clients connect to.

    With `group` (a group name), members of that group may connect too: the socket's folder
    becomes 0750 and the socket 0660, both of that group (for training processes that run as
    other users than the agent); the clients then share their bucket files with the group.
    """
    gid = _gid(group)
    if address == AUTO:
        path = runtime_dir(shared=gid is not None) / f"agent-{node_id}-{os.getpid()}.sock"
        return _bind_ipc(socket, path, gid)
    if address.startswith("ipc://"):
        path = Path(address[len("ipc://"):])
        if not path.is_absolute():
            raise ConfigError(f"local API {address}: use an absolute path (ipc:///run/oddl/"
                              f"{node_id}.sock) or ipc://auto")
        check_private_dir(path.parent)
        return _bind_ipc(socket, path, gid)
    if address.startswith("tcp://"):
        host = address[len("tcp://"):].rsplit(":", 1)[0]
        if not host.startswith(_LOOPBACK):
            raise ConfigError(f"local API {address}: the training process's API must not "
                              "listen beyond this host; use ipc://auto (default) or "
                              "tcp://127.0.0.1:0")
        logger.warning("%s: local API on %s: every local user can reach it; ipc://auto "
                       "limits it to this user", node_id, address)
        if address.endswith(":0"):
            port = socket.bind_to_random_port(address.rsplit(":", 1)[0])
            return f"{address.rsplit(':', 1)[0]}:{port}"
        socket.bind(address)
        return address
    raise ConfigError(f"local API {address!r}: use ipc://auto, ipc:///absolute/path or "
                      "tcp://127.0.0.1:PORT")


def _gid(group: str | None) -> int | None:
    if not group:
        return None
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"local API group {group!r} does not exist; create it (groupadd) "
                          "and add the training users to it, or leave it out") from None


def shared_group(address: str) -> int | None:
    """The group a client shares its bucket files with: the socket's group when the socket is
    open to its group (mode 0660), else None (the agent runs as this same user)."""
    if not address.startswith("ipc://"):
        return None
    try:
        st = os.stat(address[len("ipc://"):])
    except OSError:
        return None
    if st.st_mode & 0o060 != 0o060 or st.st_uid == os.getuid():
        return None
    return st.st_gid


def bucket_socket(address: str) -> Path | None:
    """Where an agent whose local API is at `address` takes its clients' bucket descriptors
    (`oddl.agents.local_api.bucket_server`): beside an ipc socket, same folder; None for a TCP address."""
    if not address.startswith("ipc://"):
        return None
    return Path(address[len("ipc://"):] + BUCKET_SUFFIX)


def _bind_ipc(socket: zmq.Socket, path: Path, gid: int | None = None) -> str:
    longest = _MAX_IPC_PATH - len(BUCKET_SUFFIX)
    if len(str(path).encode()) > longest:
        raise ConfigError(f"local API socket path {path} is longer than {longest} bytes (its "
                          f"bucket socket, {path.name}{BUCKET_SUFFIX} beside it, must fit in "
                          f"{_MAX_IPC_PATH}); use a shorter folder (XDG_RUNTIME_DIR)")
    if path.exists() or path.is_symlink():
        if listening(path):
            raise ConfigError(f"local API socket {path} is in use by another process; stop "
                              "that agent or pick another path")
        path.unlink()  # left by an agent that was killed; the folder is ours alone
    old = os.umask(0o177)
    try:
        socket.bind(f"ipc://{path}")
    finally:
        os.umask(old)
    if gid is not None:
        os.chown(path.parent, -1, gid)
        os.chmod(path.parent, 0o750)
        os.chown(path, -1, gid)
        os.chmod(path, 0o660)
    return f"ipc://{path}"


def listening(path: Path, kind: int = pysocket.SOCK_STREAM) -> bool:
    """Whether a live process listens on the Unix socket at `path` (of socket type `kind`)."""
    probe = pysocket.socket(pysocket.AF_UNIX, kind)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def unlink(address: str) -> None:
    """Remove the socket file of an ipc address (the agent is closing)."""
    if address.startswith("ipc://"):
        Path(address[len("ipc://"):]).unlink(missing_ok=True)


# ---- replies -----------------------------------------------------------------------------
REPLY_KINDS: tuple[tuple[type[OddlError], str], ...] = (
    (StepPassed, "step-passed"), (StepMismatch, "step-mismatch"), (LostData, "lost-data"),
    (PeerDown, "peer-down"), (AgentRestarted, "restarted"), (CallsDiffer, "calls-differ"))
"""Error types that travel from the agent to the client by kind, most specific first; the
rest travel as "collective" (a failed collective) or "refused" (a request refused unrun)."""


def error_of_kind(kind: str, message: str) -> OddlError:
    """The typed error an error reply of `kind` stands for."""
    if kind in ("bucket-unknown", "bucket-unreachable"):
        return BucketUnavailable(message, kind=kind)
    for cls, name in REPLY_KINDS:
        if name == kind:
            return cls(message)
    if kind == "collective":
        return CollectiveError(message)
    return OperationRefused(message)


# ---- requests ----------------------------------------------------------------------------
_DTYPE = re.compile(r"^[<>=|]?([iu][1248]|f[248])$")
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_SESSION = re.compile(r"^[A-Za-z0-9_-]{0,64}$")
MAX_ELEMENTS = 1 << 34
"""Largest array the local API accepts (16 Gi elements): a bound against arithmetic overflow."""


@dataclass(frozen=True)
class AllreduceRequest:
    """A validated all-reduce request header."""

    dtype: np.dtype
    shape: tuple[int, ...]
    shm: str | None
    job: str | None
    timeout_s: float
    bucket: str | None = None
    """The token of a bucket the client handed over as a descriptor (`oddl.agents.local_api.bucket_server`)."""
    step: int | None = None
    """The caller's own number for this call (e.g. the training iteration), if it gave one:
    every rank must hand in the same one."""
    steps: dict[str, int] = field(default_factory=dict)
    """Per job, the number of the caller's last call on it: without `step`, this call is the
    next one of the job the agent runs it on."""
    kind: str = ALL_REDUCE
    """The collective (`oddl.common.collective_kinds`); the array is its work buffer."""
    op: str = "sum"
    """The reduction op."""
    root: int = 0
    """The root rank of broadcast, gather and scatter."""
    world: int | None = None
    """The number of ranks the client laid the work buffer out for (None: not said)."""

    @property
    def call(self) -> tuple[str, str, int]:
        """(kind, op, root): what the ranks' calls must agree on."""
        return self.kind, self.op, self.root
    offset: int = 0
    """Where in the bucket `bucket` the array starts, in bytes (memory the client adopted,
    e.g. a tensor's storage, holds the array at the tensor's offset)."""
    tag: int = 0
    """A send's or a receive's tag: flows pair per (sender, receiver, tag)."""
    session: str = ""
    """A send's or a receive's session: flows pair only within one (`oddl.agents.point_to_point`)."""

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def parse_allreduce(header: Any) -> AllreduceRequest:
    """Check an all-reduce header from a training process; OperationRefused names what is
    wrong. Sums are exact only for numbers: integer and floating dtypes only."""
    if not isinstance(header, dict):
        raise OperationRefused("malformed allreduce request: the header is not a JSON object; "
                               "use oddl.agents.client.agent_client.AgentClient")
    if "dtype" not in header:
        raise OperationRefused("malformed allreduce request: no dtype")
    text = header["dtype"]
    # numpy parses far more than a dtype string (comma lists, repeats via ast.literal_eval):
    # only the simple numeric forms get that far
    if not isinstance(text, str) or not _DTYPE.match(text):
        raise OperationRefused(f"malformed allreduce request: dtype {text!r} is not a numeric "
                               "dtype string such as '<f4' or '<i8'; integer and floating "
                               "dtypes can be summed exactly")
    dtype = np.dtype(text)
    raw_shape = header.get("shape")
    if not isinstance(raw_shape, list) or len(raw_shape) > 32 or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x for x in raw_shape):
        raise OperationRefused(f"malformed allreduce request: shape {raw_shape!r} is not a list "
                               "of at most 32 non-negative integers")
    size = 1
    for x in raw_shape:
        size *= x
    if size > MAX_ELEMENTS:
        raise OperationRefused(f"array of {size} elements is larger than the local API takes "
                               f"({MAX_ELEMENTS}); split the bucket")
    shm, bucket, offset = _parse_memory(header)
    job = header.get("job")
    if job is not None and (not isinstance(job, str) or not job):
        raise OperationRefused("malformed allreduce request: job is not a job id")
    timeout = header.get("timeout_s", 60.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not math.isfinite(timeout) or not 0 < timeout <= 86_400:
        raise OperationRefused(f"malformed allreduce request: timeout_s {timeout!r} is not a "
                               "number of seconds in (0, 86400]")
    step, steps = _parse_steps(header)
    kind, op, root = (header.get("kind", ALL_REDUCE), header.get("op", "sum"),
                      header.get("root", 0))
    check_call(kind, op, root, dtype)
    world = header.get("world")
    if world is not None and (isinstance(world, bool) or not isinstance(world, int)):
        raise OperationRefused(f"malformed allreduce request: world {world!r} is not a number "
                               "of ranks")
    tag, session = _parse_flow(header)
    return AllreduceRequest(dtype, tuple(raw_shape), shm, job, float(timeout), bucket, step,
                            steps, kind, op, root, world, offset, tag, session)


def _parse_memory(header: dict[str, Any]) -> tuple[str | None, str | None, int]:
    """Where the array is: a named bucket file, a bucket token and a byte offset in it, or
    (none of them) in the request's payload."""
    shm = header.get("shm")
    if shm is not None and not isinstance(shm, str):
        raise OperationRefused("malformed allreduce request: shm is not a file name")
    bucket = header.get("bucket")
    if bucket is not None and (not isinstance(bucket, str) or not _TOKEN.match(bucket)):
        raise OperationRefused("malformed allreduce request: bucket is not a token this agent "
                               "issued; use oddl.agents.client.agent_client.AgentClient")
    if bucket is not None and shm is not None:
        raise OperationRefused("malformed allreduce request: it names a bucket file and a "
                               "bucket token; name one")
    offset = header.get("offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 1 << 62 \
            or offset and bucket is None:
        raise OperationRefused(f"malformed allreduce request: offset {offset!r} is not a "
                               "byte offset into the bucket the request names by its token")
    return shm, bucket, offset


def _parse_flow(header: dict[str, Any]) -> tuple[int, str]:
    """A send's or a receive's tag and session (`oddl.agents.point_to_point`; 0 and "" by default)."""
    tag = header.get("tag", 0)
    if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag < 1 << 31:
        raise OperationRefused(f"malformed allreduce request: tag {tag!r} is not an integer in "
                               "[0, 2**31)")
    session = header.get("session", "")
    if not isinstance(session, str) or not _SESSION.match(session):
        raise OperationRefused(f"malformed allreduce request: session {session!r} is not up "
                               "to 64 letters, digits, '-' or '_'")
    return tag, session


def _parse_steps(header: dict[str, Any]) -> tuple[int | None, dict[str, int]]:
    """The caller's own step number (if given) and its last step per job."""
    step = header.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)
                             or not 0 < step < 1 << 62):
        raise OperationRefused(f"malformed allreduce request: step {step!r} is not a positive "
                               "integer")
    steps = header.get("steps", {})
    if not isinstance(steps, dict) or len(steps) > 10_000 or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            and 0 <= v < 1 << 62 for k, v in steps.items()):
        raise OperationRefused("malformed allreduce request: steps is not an object of job "
                               "ids and non-negative step numbers")
    return step, steps


# ---- reply frames ------------------------------------------------------------------------
def reply_rid(frames: list[bytes]) -> int | None:
    try:
        rid = json.loads(frames[1]).get("rid")
    except (IndexError, ValueError, AttributeError):
        return None
    return rid if isinstance(rid, int) else None


def reply_field(frames: list[bytes], name: str) -> Any:
    """What a reply's `resolved` says under `name` (None when it says nothing)."""
    try:
        return json.loads(frames[1])["resolved"][name]
    except (IndexError, ValueError, TypeError, KeyError):
        return None


def reply_resolved(frames: list[bytes]) -> tuple[str, int] | None:
    """The job and step a reply says the call was taken as (None when it says nothing)."""
    try:
        resolved = json.loads(frames[1]).get("resolved")
        job, step = resolved["job"], resolved["step"]
    except (IndexError, ValueError, AttributeError, TypeError, KeyError):
        return None
    if isinstance(job, str) and isinstance(step, int) and not isinstance(step, bool):
        return job, step
    return None
