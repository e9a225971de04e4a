"""The ITLA emulator without a clock fixture: seeded random faults, fault and constructor
checks, and fuzzing of its frame handler."""

from __future__ import annotations

import pytest
from fakes import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from oddl.common.errors import ConfigError
from oddl.drivers.emulators.itla import ItlaEmulator, ItlaFaults
from oddl.drivers.itla_frames import checksum_ok, decode_reply, encode_request


def test_random_faults_are_seeded() -> None:
    def pattern(seed: int) -> list[bool]:
        emu = ItlaEmulator(seed=seed, faults=ItlaFaults(drop_probability=0.5))
        return [emu.handle_frame(encode_request(0x00)) is None for _ in range(32)]

    assert pattern(1) == pattern(1) and pattern(1) != pattern(2)
    emu = ItlaEmulator(faults=ItlaFaults(garbage_probability=1.0))
    raw = emu.handle_frame(encode_request(0x00))
    assert raw is not None and not checksum_ok(raw)


def test_faults_from_config() -> None:
    faults = ItlaFaults.from_mapping({"no_answer": 2, "late_s": 0.1, "stuck_pending": True})
    assert (faults.no_answer, faults.late_s, faults.stuck_pending) == (2, 0.1, True)
    with pytest.raises(ConfigError, match="unknown key.*bogus"):
        ItlaFaults.from_mapping({"bogus": 1})
    with pytest.raises(ConfigError, match="garbage"):
        ItlaFaults.from_mapping({"garbage": -1})
    with pytest.raises(ConfigError, match="drop_probability"):
        ItlaFaults(drop_probability=2.0)
    with pytest.raises(ConfigError, match="unknown"):
        ItlaEmulator().inject(nope=True)


def test_bad_construction_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        ItlaEmulator(channels=0)
    with pytest.raises(ConfigError):
        ItlaEmulator(power_dbm=20.0)


# --- fuzzing ------------------------------------------------------------------------------------

def _well_formed(frame: bytes, raw: bytes | None) -> None:
    assert raw is not None and len(raw) == 4 and checksum_ok(raw)
    reply = decode_reply(raw)
    assert reply.register == frame[1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=4, max_size=4), min_size=1, max_size=20))
def test_fuzz_random_frames(frames: list[bytes]) -> None:
    emu = ItlaEmulator(clock=FakeClock(1000.0))
    for frame in frames:
        raw = emu.handle_frame(frame)
        if frame[0] & 0x08 and checksum_ok(frame):
            assert raw is not None and checksum_ok(raw)  # LstRsp: a previous reply
        else:
            _well_formed(frame, raw)
        emu.optical_output()


_VALID = st.builds(
    lambda reg, data, write: encode_request(reg, data, write),
    st.sampled_from([0x00, 0x01, 0x04, 0x0B, 0x20, 0x30, 0x31, 0x32, 0x34, 0x35, 0x36, 0x40,
                     0x42, 0x62, 0x65, 0x66, 0x67, 0x68]),
    st.integers(0, 0xFFFF), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_VALID, st.integers(0, 31), st.booleans(), st.floats(0, 1)),
                min_size=1, max_size=30))
def test_fuzz_mutated_valid_frames(steps: list[tuple[bytes, int, bool, float]]) -> None:
    clock = FakeClock(1000.0)
    emu = ItlaEmulator(clock=clock, time_to_lock_s=0.2)
    for frame, bit, mutate, dt in steps:
        if mutate:
            as_int = int.from_bytes(frame, "big") ^ (1 << bit)
            frame = as_int.to_bytes(4, "big")
        raw = emu.handle_frame(frame)
        if frame[0] & 0x08 and checksum_ok(frame):
            assert raw is not None and checksum_ok(raw)
        else:
            _well_formed(frame, raw)
        clock.advance(dt)
        out = emu.optical_output()
        assert out is None or 193.0 < out.frequency_thz < 198.0
