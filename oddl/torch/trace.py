"""The torch backend's side of the timeline: each collective call of an `oddl` process group as
the trace format's `torch` event (docs/reference/trace-format.md, docs/how-to/read-a-trace.md).

    with torch_trace.call(group, kind, fn) as traced:   # in OddlProcessGroup._work
        return _create_work_from_future(channel.submit(kind, traced, inline))

- With ``ODDL_TRACE_DIR`` set, every call is recorded (on the worker thread that runs it, from
  the start to the end of its agent calls) with PyTorch's identifiers — the process group's name
  and its collective sequence number, under the argument names of Kineto's
  `record_param_comms` (`Process Group Name`, `Seq`, ...) — and the agent's `job` and call number
  (`seq`: the client's step number of its first agent call, the caller's `step` of the agent's
  `collective` event). The process writes `ODDL_TRACE_DIR/torch-rank<R>.trace.json` at exit
  (or at `flush()`), times on the controller's clock: the local agent's measured offset is
  asked for once, at the first call, and written into the header with its error bound.
- While a `torch.profiler` session runs, the call is also a `record_function` named
  ``oddl:<collective> pg=<name> seq=<n>`` on the calling thread, so the profiler's own trace
  names the same call (a Python backend's collectives are otherwise invisible to the profiler:
  it records `record_param_comms` only inside the built-in backends).
- Neither on: the function is returned as it is (one environment lookup, one counter).

The buffer is bounded (``ODDL_TRACE_BUFFER`` events, default 100000); calls past it are counted
in the header's `dropped`, never silently lost.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from oddl.trace.files import FORMAT

ENV_DIR = "ODDL_TRACE_DIR"
ENV_BUFFER = "ODDL_TRACE_BUFFER"
DEFAULT_BUFFER = 100_000
C10D_NAMES = {"all_reduce": "allreduce", "all_gather_into_tensor": "_allgather_base",
              "reduce_scatter_tensor": "_reduce_scatter_base", "all_to_all_single": "all_to_allv"}
"""The backend's kinds whose c10d name differs (the others are the same)."""
GATHERS = ("all_gather", "all_gather_into_tensor")
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor")

_seq: dict[str, int] = {}
_seq_lock = threading.Lock()
_tracer: Tracer | None = None
_tracer_lock = threading.Lock()


def c10d_name(kind: str) -> str:
    """The collective's name as c10d's `record_param_comms` spells it."""
    base = kind.split("(", 1)[0]
    return C10D_NAMES.get(base, base)


def _next_seq(group: str) -> int:
    with _seq_lock:
        _seq[group] = _seq.get(group, 0) + 1
        return _seq[group]


def _nelems(result: Any) -> tuple[int, str]:
    tensors: list[Any] = []
    for item in result if isinstance(result, list | tuple) else [result]:
        tensors.extend(item if isinstance(item, list | tuple) else [item])
    tensors = [t for t in tensors if hasattr(t, "numel")]
    dtype = str(tensors[0].dtype).replace("torch.", "") if tensors else ""
    return sum(int(t.numel()) for t in tensors), dtype


class Tracer:
    """One process's buffer of `torch` events and the file it writes."""

    def __init__(self, folder: str, rank: int, buffer_events: int):
        self.path = os.path.join(folder, f"torch-rank{rank}.trace.json")
        self.rank = rank
        self.capacity = buffer_events
        self.events: list[dict[str, Any]] = []
        self.dropped = 0
        self.offset_ns: int | None = None
        self.error_bound_ns: int | None = None
        self.base_ns = time.time_ns()
        self.started_ns = self.base_ns
        self._lock = threading.Lock()

    def learn_clock(self, client: Any) -> None:
        """The controller-minus-local offset from the local agent (once; 0 if it cannot say)."""
        if self.offset_ns is not None:
            return
        try:
            status = client.status()
            offset, bound = status.get("clock_offset_s"), status.get("clock_error_bound_s")
        except Exception:  # an agent that cannot answer now: record local time, say so
            offset, bound = None, None
        self.offset_ns = int(round((offset or 0.0) * 1e9))
        self.error_bound_ns = None if bound is None else int(round(bound * 1e9))
        self.base_ns = self.started_ns + self.offset_ns

    def us(self, local_ns: int) -> float:
        """A local `time.time_ns()` as µs on this trace's axis (the controller's clock)."""
        return (local_ns + (self.offset_ns or 0) - self.base_ns) / 1000.0

    def add(self, event: dict[str, Any]) -> None:
        with self._lock:
            if len(self.events) >= self.capacity:
                self.dropped += 1
            else:
                self.events.append(event)

    def document(self) -> dict[str, Any]:
        """The trace file's content (oddl-trace/1)."""
        with self._lock:
            events = list(self.events)
            dropped = self.dropped
        meta = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
                 "args": {"name": f"torch rank {self.rank}"}},
                {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1,
                 "args": {"name": "collectives"}}]
        clock = {"offset_ns": self.offset_ns or 0, "error_bound_ns": self.error_bound_ns}
        head = {"format": FORMAT, "testbed": os.environ.get("ODDL_TESTBED_NAME", ""),
                "testbed_sha256": _testbed_sha256(), "process": f"torch-rank{self.rank}",
                "host": socket.gethostname(), "clock": clock, "buffer_events": self.capacity,
                "recorded": len(events), "dropped": dropped, "started_ns": self.base_ns,
                "stopped_ns": time.time_ns() + (self.offset_ns or 0)}
        return {"traceEvents": meta + events, "displayTimeUnit": "ns",
                "baseTimeNanoseconds": self.base_ns, "oddl": head}

    def flush(self) -> str:
        """Write the file (atomically); return its path."""
        from oddl.trace.merge import write_json

        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        write_json(self.document(), self.path)
        return self.path


def _testbed_sha256() -> str:
    """The testbed file's hash when this process knows the file (``ODDL_CONFIG``), else \"\":
    `oddl trace merge` then takes the torch file with any testbed's."""
    path = os.environ.get("ODDL_CONFIG", "")
    try:
        return hashlib.sha256(open(path, "rb").read()).hexdigest() if path else ""
    except OSError:
        return ""


def tracer(rank: int) -> Tracer | None:
    """This process's tracer, made on first use when ``ODDL_TRACE_DIR`` is set."""
    global _tracer
    folder = os.environ.get(ENV_DIR)
    if not folder:
        return None
    with _tracer_lock:
        if _tracer is None:
            _tracer = Tracer(folder, rank, int(os.environ.get(ENV_BUFFER, DEFAULT_BUFFER)))
            atexit.register(_tracer.flush)
        return _tracer


def flush() -> str | None:
    """Write the process's trace now (it is written at exit anyway); its path, or None."""
    return _tracer.flush() if _tracer is not None else None


_profiler_enabled: Callable[[], bool] | None = None


def _profiling() -> bool:
    """Whether a torch.profiler (or autograd profiler) session is recording now."""
    global _profiler_enabled
    if _profiler_enabled is None:
        import torch

        _profiler_enabled = torch._C._autograd._profiler_enabled
    return bool(_profiler_enabled())


class _Call:
    """The context `call` returns: entering gives the function to submit; around it, the
    profiler's annotation when one records."""

    __slots__ = ("fn", "annotation")

    def __init__(self, fn: Callable[[], Any], annotation: Any = None):
        self.fn, self.annotation = fn, annotation

    def __enter__(self) -> Callable[[], Any]:
        if self.annotation is not None:
            self.annotation.__enter__()
        return self.fn

    def __exit__(self, *exc: object) -> None:
        if self.annotation is not None:
            self.annotation.__exit__(*exc)


def call(group: Any, kind: str, fn: Callable[[], Any]) -> _Call:
    """`with call(group, kind, fn) as traced:` — `traced` is `fn` itself, or `fn` recorded
    (see the module docstring); annotated for the profiler around the submission while one
    records."""
    name = str(getattr(group, "_name", "") or "0")
    seq = _next_seq(name)
    rec = _tracer if _tracer is not None else tracer(int(getattr(group, "_rank", 0)))
    traced = fn if rec is None else _recorded(rec, group, kind, fn, name, seq)
    if not _profiling():
        return _Call(traced)
    from torch.autograd.profiler import record_function

    return _Call(traced, record_function(f"oddl:{c10d_name(kind)} pg={name} seq={seq}"))


def _recorded(rec: Tracer, group: Any, kind: str, fn: Callable[[], Any], name: str,
              seq: int) -> Callable[[], Any]:
    channel = getattr(group, "_channel", None)
    client = getattr(channel, "client", None)
    world = int(getattr(group, "_world", 1))

    def run() -> Any:
        if client is not None:
            rec.learn_clock(client)
        before = dict(getattr(client, "_steps", {}) or {})
        start = time.time_ns()
        result = fn()
        end = time.time_ns()
        job = getattr(getattr(client, "steps", None), "last_job", None) or getattr(
            channel, "job", None)
        out, dtype = _nelems(result)
        into = out // world if kind.startswith(GATHERS) else (
            out * world if kind.startswith(SCATTERS) else out)
        rec.add({"ph": "X", "cat": "torch", "name": c10d_name(kind), "pid": 1, "tid": 1,
                 "ts": rec.us(start), "dur": (end - start) / 1000.0,
                 "args": {"Process Group Name": name, "Seq": seq,
                          "Collective name": c10d_name(kind), "dtype": dtype,
                          "In msg nelems": into, "Out msg nelems": out, "Group size": world,
                          "job": job, "seq": before.get(job, 0) + 1 if job else None}})
        return result
    return run
