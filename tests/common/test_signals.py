"""StopSignals: SIGINT/SIGTERM end a wait, with no lock taken in the handler."""

from __future__ import annotations

import os
import signal
import threading

from oddl.common.signals import StopSignals


def _signal_soon(sig: int, after_s: float = 0.05) -> threading.Timer:
    timer = threading.Timer(after_s, os.kill, args=(os.getpid(), sig))
    timer.start()
    return timer


def test_a_signal_ends_the_wait_and_the_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with StopSignals() as stop:
        _signal_soon(signal.SIGTERM).join()
        assert stop.wait(timeout=30.0)
        assert stop.received == signal.SIGTERM
    assert {s: signal.getsignal(s) for s in before} == before


def test_no_signal_is_a_timeout_and_only_the_first_signal_counts():
    with StopSignals() as stop:
        assert not stop.wait(timeout=0.1)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(timeout=30.0) and stop.received == signal.SIGINT


def test_signals_that_land_while_waiting_never_wedge_it():
    # the handler of the old loop (Event.set from a signal, Event.wait in the loop) could
    # block on the event's own lock; a burst of signals during the wait must simply end it
    with StopSignals() as stop:
        timers = [_signal_soon(signal.SIGTERM, 0.01 * k) for k in range(1, 30)]
        assert stop.wait(timeout=30.0)
        for t in timers:
            t.join()
