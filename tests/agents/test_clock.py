"""The clock estimate (a pure core fed synthetic samples), its budget check, the clock seam,
the UDP clock exchange, and the line-rate check (fed recorded chunk times)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
import pytest

from oddl.agents.clock import wall as wallclock
from oddl.agents.clock.excursion import Excursion
from oddl.agents.clock.offset_filter import (
    STEP_CONFIRM,
    UNKNOWN,
    ClockFilter,
    ClockSample,
    estimate,
)
from oddl.agents.clock.sync import ClockSync, UdpProbe, budget_warning
from oddl.agents.links.line_rate import MIN_CHUNK_BYTES, MIN_CHUNKS, LineRateMeter, rate_warning
from oddl.common.clock_wire import REQUEST, parse_reply, reply_to
from oddl.common.errors import ConfigError
from oddl.controller.clock_service import ClockService
from oddl.controller.scheduling.slot_grants import Grant, late_grant_advice
from oddl.operator.client import clock_bound_text, format_status

S = 1_000_000_000  # ns per second


def exchange(at_ns: int, offset_ns: int, out_ns: int, back_ns: int, hold_ns: int = 5_000
             ) -> ClockSample:
    """A sample sent at agent time `at_ns` whose controller clock is `offset_ns` ahead, with
    the given one-way delays and the controller's processing time."""
    t2 = at_ns + out_ns + offset_ns
    t3 = t2 + hold_ns
    return ClockSample(at_ns, t2, t3, at_ns + out_ns + hold_ns + back_ns)


def test_the_offset_is_within_its_bound_whatever_the_delays():
    rng = np.random.default_rng(1)
    true = 3_000_000  # 3 ms
    f = ClockFilter()
    for i in range(40):
        out, back = (int(x) for x in rng.integers(5_000, 900_000, 2))
        f.add(exchange(i * S // 4, true, out, back))
    now = 40 * S // 4
    est = f.estimate(now)
    assert est.known and est.samples == 40
    assert abs(est.offset_s - true / 1e9) <= est.error_bound_s
    # the bound is half the best round trip plus the drift since that sample
    best = min(f._samples, key=lambda s: s.bound_s(now))
    assert est.error_bound_s == pytest.approx(best.rtt_s / 2 + 15e-6 * (now - best.t4) / 1e9)


def test_an_asymmetric_path_is_wrong_by_at_most_the_bound():
    # the request always takes 190 µs and the reply 10 µs: the offset reads 90 µs off
    est = estimate([exchange(i * S, 0, 190_000, 10_000) for i in range(8)])
    assert est.offset_s == pytest.approx(90e-6)
    assert est.error_bound_s == pytest.approx(100e-6)


def test_samples_that_queued_do_not_replace_a_good_one():
    f = ClockFilter()
    f.add(exchange(0, 0, 20_000, 20_000))
    for i in range(1, 9):  # after an outage: the first replies ride a full queue
        f.add(exchange(i * S // 10, 0, 1_200_000, 1_400_000))
    est = f.estimate(S)
    assert est.rtt_s == pytest.approx(40e-6)
    assert est.error_bound_s == pytest.approx(20e-6 + 15e-6 * 1.0, rel=1e-3)
    assert abs(est.offset_s) < 1e-9


def test_a_fresh_sample_wins_once_the_old_one_has_aged():
    f = ClockFilter()
    f.add(exchange(0, 0, 20_000, 20_000))            # ±20 µs now, ±20 + 15·t µs later
    f.add(exchange(10 * S, 0, 40_000, 40_000))       # ±40 µs: at 10 s the old one is ±170
    assert f.estimate(10 * S + 80_000).rtt_s == pytest.approx(80e-6)


def test_a_clock_step_restarts_the_window_after_it_is_confirmed():
    f = ClockFilter()
    for i in range(5):
        f.add(exchange(i * S, 0, 20_000, 20_000))
    f.add(exchange(5 * S, 5_000_000, 20_000, 20_000))  # one odd sample: ignored
    assert abs(f.estimate(5 * S).offset_s) < 1e-9
    f.add(exchange(6 * S, 0, 20_000, 20_000))          # back in line: the step is off
    for i in range(STEP_CONFIRM):
        f.add(exchange((7 + i) * S, 5_000_000, 20_000, 20_000))
    est = f.estimate((7 + STEP_CONFIRM) * S)
    assert est.offset_s == pytest.approx(5e-3)
    assert f.steps == 1 and est.samples == STEP_CONFIRM


def test_no_sample_no_estimate():
    f = ClockFilter()
    f.add(ClockSample(100, 0, 0, 50))  # the agent's clock went back during the exchange
    assert f.estimate(S) == UNKNOWN and not UNKNOWN.known
    assert math.isinf(UNKNOWN.error_bound_s)


def test_the_budget_warning_names_both_figures_the_file_and_the_fix():
    est = estimate([exchange(0, 0, 100_000, 100_000)])
    text = budget_warning("n2", est, 50.0, "/etc/oddl/testbed.toml")
    assert text is not None
    for part in ("n2", "±100 µs", "half the best round trip, 200 µs, plus 0 µs",
                 "clock_skew_us = 50 µs", "/etc/oddl/testbed.toml",
                 "chrony or PTP", "raise [timing] clock_skew_us to at least 100"):
        assert part in text
    assert budget_warning("n2", est, 150.0, "t.toml") is None
    assert "no clock sample" in str(budget_warning("n2", UNKNOWN, 50.0, "t.toml"))


def test_an_excursion_warns_once_and_the_next_one_after_the_interval():
    ex = Excursion(min_interval_s=60)
    assert [ex.check(True, t) for t in (0, 1, 2)] == [True, False, False]
    assert not ex.check(False, 3) and not ex.active
    assert not ex.check(True, 10)   # a new excursion, too soon after the last warning
    assert ex.check(True, 61)       # still on once the interval passed: warn
    assert not ex.check(True, 200)
    assert ex.warnings == 2


def test_the_clock_seam_shifts_agent_time():
    try:
        assert wallclock.shift_from_env({"ODDL_CLOCK_SHIFT_US": "3000"}) == pytest.approx(3e-3)
        assert wallclock.from_system_ns(0) == 3_000_000
        with pytest.raises(ConfigError, match="ODDL_CLOCK_SHIFT_US='3 ms'.*microseconds"):
            wallclock.shift_from_env({"ODDL_CLOCK_SHIFT_US": "3 ms"})
    finally:
        wallclock.shift_from_env({})
    assert wallclock.shift_s() == 0.0


def test_the_udp_exchange_finds_a_shift_within_its_bound():
    assert reply_to(b"junk", 1) is None
    reply = reply_to(REQUEST.pack(b"ODCK", b"12345678"), 7)
    assert reply is not None and parse_reply(reply, b"87654321") is None
    assert parse_reply(reply, b"12345678") is not None
    service = ClockService("127.0.0.1", 0)
    service.start()
    probe = UdpProbe("127.0.0.1", service.port)
    try:
        wallclock.shift_from_env({"ODDL_CLOCK_SHIFT_US": "-2500"})
        samples = [s for s in (probe.sample() for _ in range(20)) if s is not None]
        assert samples, "the clock service did not answer on loopback"
        est = estimate(samples)
        # one host, one clock: the controller is 2.5 ms ahead of the shifted agent
        assert abs(est.offset_s - 2.5e-3) <= est.error_bound_s
        assert est.error_bound_s < 1e-3
    finally:
        wallclock.shift_from_env({})
        probe.close()
        service.close()


def test_a_silent_clock_service_gives_no_sample():
    service = ClockService("127.0.0.1", 0)  # bound but never started: nobody answers
    probe = UdpProbe("127.0.0.1", service.port)
    try:
        assert probe.sample() is None
    finally:
        probe.close()
        service.close()


def test_the_line_rate_is_the_median_of_big_chunks():
    meter = LineRateMeter()
    meter.add(4096, 1e-6)  # small: not timed
    for _ in range(MIN_CHUNKS - 1):
        meter.add(1 << 20, (1 << 20) * 8 / 1e9)  # 1 MiB at 1 Gbit/s
    assert meter.measured_bps() is None
    meter.add(1 << 20, 1e-6)        # read from the socket buffer: far too fast
    meter.add(1 << 20, 1.0)         # a read that stalled
    assert meter.measured_bps() == pytest.approx(1e9)
    assert MIN_CHUNK_BYTES <= 1 << 20


def test_the_rate_warning_names_the_key_both_rates_the_file_and_the_fix():
    text = rate_warning("n1", 0.94e9, 25.0, "/etc/oddl/testbed.toml")
    assert text is not None
    for part in ("n1", "0.94 Gbit/s", "[fabric] line_rate_gbps = 25", "/etc/oddl/testbed.toml",
                 "Set [fabric] line_rate_gbps to what the links carry (about 0.94)"):
        assert part in text
    assert rate_warning("n1", 0.9e9, 1.0, "t.toml") is None   # within 80 %
    assert rate_warning("n1", None, 25.0, "t.toml") is None   # not measured yet


def test_a_late_grant_says_what_ran_over():
    # a 10 ms guard; the hand-off came 9 ms late, the retune took 4 ms: the data ran over
    data = late_grant_advice(Grant(3, 1.000, 1.010, 1.009), 1.013, 25.0, "lab.toml")
    assert "[fabric] line_rate_gbps = 25 in lab.toml" in data and "slot 3" in data
    assert "laser_tune_ms" not in data
    # the hand-off came at once, the retune took 12 ms: the retune ran over
    retune = late_grant_advice(Grant(4, 1.000, 1.010, 1.000), 1.012, 25.0, "lab.toml")
    assert "command_ms or laser_tune_ms in lab.toml" in retune
    assert "line_rate_gbps" not in retune


def test_status_shows_the_bound_and_the_measured_rate():
    agent = {"node_id": "n0", "alive": True, "last_heartbeat_age_s": 0.2,
             "clock_offset_s": 3e-3, "clock_error_bound_s": 12e-6, "gate_error_p50_s": 0.0,
             "gate_error_p99_s": 0.0, "collectives_done": 1, "collectives_failed": 0,
             "measured_line_rate_gbps": 0.94}
    text = format_status({"agents": [agent], "jobs": []})
    assert "12.0µs" in text and "0.94 Gbit/s" in text
    assert clock_bound_text("Infinity") == "unknown" and clock_bound_text(None) == "unknown"



def _rpc(rtts_us: list[float]) -> Callable[[], ClockSample | None]:
    """A clock-sample source on this host's clock (offset 0) whose round trips are `rtts_us`
    in turn (the last repeats)."""
    queue = list(rtts_us)

    def sample() -> ClockSample:
        rtt_ns = round((queue.pop(0) if len(queue) > 1 else queue[0]) * 1e3)
        now = wallclock.now_ns()
        return ClockSample(now - rtt_ns, now - rtt_ns // 2, now - rtt_ns // 2, now)

    return sample


def test_a_slow_first_burst_is_measured_again_before_it_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    # the agent's first 8 samples ride 200 µs round trips (a cold start); the next are 20 µs
    sync = ClockSync("n0", "127.0.0.1:1", 50.0, "t.toml", _rpc([200.0] * 8 + [20.0]))
    with caplog.at_level(logging.WARNING):
        sync.burst(8)
        assert sync.estimate().error_bound_s > 50e-6
        sync.check_budget()
    assert sync.estimate().error_bound_s < 50e-6
    assert "known only to" not in caplog.text


def test_a_bound_still_over_budget_after_the_second_burst_warns_once(
        caplog: pytest.LogCaptureFixture) -> None:
    sync = ClockSync("n0", "127.0.0.1:1", 50.0, "t.toml", _rpc([200.0]))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            sync.burst(4)
            sync.check_budget()
    assert caplog.text.count("known only to ±") == 1
