"""A call whose training process is gone is voided (decision record 0033): the agent sees the
process that made it exit while the call waits in the ready exchange for a peer whose
training process never makes it, ends it there, and the next process's calls pair at once —
not after the dead call's timeout.

Real processes on loopback, as `tests/agents/test_native_collectives.py`; the dead training
process is a child process killed while the agent holds its call.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import EMULATED, wait_for

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import collective_all
from oddl.agents.collective.void import VoidWindow
from oddl.agents.local_api import callers
from oddl.launch.testbed import RunningTestbed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

STUCK_S = 600.0
"""The dead process's call timeout: far longer than the test may wait for the void."""

CHILD = """
import sys
import numpy as np
from oddl.agents.client.agent_client import AgentClient
AgentClient(sys.argv[1], timeout_s=float(sys.argv[3])).allreduce(
    np.ones(8, dtype=np.float32), job=sys.argv[2], step=2)
"""


def test_a_call_whose_process_died_is_voided_and_the_next_calls_pair(tmp_path: Path) -> None:
    with RunningTestbed(tmp_path, EMULATED) as tb:
        apis = tb.launched.apis[:2]
        job = tb.operator.submit("void", tb.launched.node_ids[:2], "ring", "optical")["id"]
        clients = [AgentClient(api, timeout_s=120) for api in apis]
        try:
            # step 1 on both ranks: the bucket's schedule now stands (the ready exchange)
            _every_rank(clients, job, step=1)
            child = subprocess.Popen([sys.executable, "-c", CHILD, apis[0], job, str(STUCK_S)])
            try:
                wait_for(lambda: (tb.clients[0].status()["call_in_flight"] or {}).get("pid")
                         == child.pid, 120, "n0's agent holds the child's call")
            finally:
                child.kill()
                child.wait()
            wait_for(lambda: tb.clients[0].status()["calls_voided"] == 1, 60,
                     "n0's agent voids the call of the process that is gone")
            started = time.monotonic()
            _every_rank(clients, job, step=3)  # n1 sees n0's ready for step 2 as given up
            assert time.monotonic() - started < STUCK_S / 4
            assert tb.clients[0].status()["call_in_flight"] is None
        finally:
            for c in clients:
                c.close()


def _every_rank(clients: list[AgentClient], job: str, step: int) -> None:
    arrays = [np.full(8, 10.0 * step + r, dtype=np.float32) for r in range(len(clients))]
    outs = collective_all(clients, lambda c, r: c.allreduce(arrays[r], job=job, step=step))[1]
    for out in outs:
        if isinstance(out, Exception):
            raise out
        np.testing.assert_array_equal(out, sum(arrays))


def test_a_process_is_watched_by_pid_and_start_time(tmp_path: Path) -> None:
    me = callers.identity()
    assert me is not None and callers.watched(me) == tuple(me)
    assert not callers.gone(tuple(me))
    assert callers.watched([me[0], me[1] + 1]) is None  # a reused pid is another process
    assert callers.watched("1234") is None and callers.watched([True, 1]) is None
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    stamp = [child.pid, callers.start_ticks(child.pid)]  # alive until its stdin closes
    assert callers.watched(stamp) == (child.pid, stamp[1])
    assert child.stdin is not None
    child.stdin.close()
    # exited but not yet reaped (a zombie waiting for its parent) counts as gone already
    wait_for(lambda: _state(child.pid) == "Z", 60, "the child exits")
    assert callers.gone((stamp[0], stamp[1]))
    child.wait()
    assert callers.gone((stamp[0], stamp[1])) and callers.start_ticks(child.pid) is None


def _state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rfind(")") + 2:].split()[0]


def test_the_void_window_closes_once_the_peers_count_on_the_call() -> None:
    cancel = threading.Event()
    window = VoidWindow(cancel)
    assert not window.void("no call") and not cancel.is_set()
    window.open()
    assert window.void("gone") and cancel.is_set() and window.reason == "gone"
    cancel.clear()  # the next phase of the same call (the runner's _begin)
    window.rearm()
    assert cancel.is_set()  # ends at once: the call stays voided
    window.close()
    cancel.clear()
    window.rearm()
    assert not window.void("late") and not cancel.is_set()  # past the ready exchange
