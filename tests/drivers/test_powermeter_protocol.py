"""The power meter driver's exact SCPI frames against a scripted pyvisa resource (no emulator)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from fakes import ScriptedVisaResource, ScriptedWire

from oddl.common.errors import DeviceError, ProtocolError
from oddl.drivers.emulators.scpi import ieee_block
from oddl.drivers.powermeter import PowerMeter

NO_ERROR = (":SYST:ERR?", '+0,"No error"')


def scripted(script: list[tuple[str, str | bytes | None]]) -> tuple[PowerMeter,
                                                                    ScriptedVisaResource]:
    """A meter on a scripted resource: (line sent, answer line, raw bytes, or None)."""
    def reply(answer: str | bytes | None) -> bytes | None:
        return answer if not isinstance(answer, str) else (answer + "\n").encode("ascii")

    link = ScriptedWire([((sent + "\n").encode("ascii"), reply(answer))
                         for sent, answer in script]).visa()
    return PowerMeter.from_resource(link, name="pm-x"), link  # type: ignore[arg-type]


def test_protocol_settings_and_readings() -> None:
    pm, link = scripted([
        (":SENS2:POW:WAV 1550.1200NM", None), NO_ERROR,
        (":SENS2:POW:ATIM 0.0005S", None), NO_ERROR,
        (":SENS2:POW:RANG:AUTO 1", None), NO_ERROR,
        (":SENS2:CORR -0.5000DB", None), NO_ERROR,
        (":SENS2:POW:UNIT 0", None), NO_ERROR,
        (":SENS2:POW:REF:STAT?", "+0"),
        (":INIT2:CONT OFF", None), NO_ERROR,
        (":READ2:POW?", "-1.23400000E+01"),
        (":FETC2:POW?", "+9.91000000E+37"),
        (":SENS2:POW:WAV?", "+1.55012000E-06"),
    ])
    with pm:
        pm.set_wavelength_nm(2, 1550.12)
        pm.set_averaging_time_s(2, 5e-4)
        pm.set_auto_range(2, True)
        pm.set_correction_db(2, -0.5)
        pm.set_unit_dbm(2)
        assert pm.read_power_dbm(2) == pytest.approx(-12.34)
        assert pm.fetch_power_dbm(2) is None
        assert pm.wavelength_nm(2) == pytest.approx(1550.12)
    link.assert_all_consumed()
    assert link.closed


def test_protocol_unknown_unit_is_queried_once() -> None:
    pm, link = scripted([
        (":SENS1:POW:UNIT?", "+0"),
        (":SENS1:POW:REF:STAT?", "+0"),
        (":INIT1:CONT OFF", None), NO_ERROR,
        (":SENS1:POW:ATIM?", "+1.00000000E-01"),
        (":READ1:POW?", "-3.0"),
        (":READ1:POW?", "-3.5"),
    ])
    assert pm.read_power_dbm(1) == pytest.approx(-3.0)
    assert pm.read_power_dbm(1) == pytest.approx(-3.5)
    link.assert_all_consumed()


def test_protocol_logging() -> None:
    values = [1e-3, 2.5e-6, 0.0]
    block = ieee_block(struct.pack("<3f", *values)) + b"\n"
    pm, link = scripted([
        (":SENS1:POW:REF:STAT?", "+0"),
        (":SENS1:POW:UNIT?", "+1"),
        (":TRIG1:INP SME", None), NO_ERROR,
        (":SENS1:FUNC:PAR:LOGG 3,0.001S", None), NO_ERROR,
        (":SENS1:FUNC:STAT LOGG,STAR", None), NO_ERROR,
        (":SENS1:FUNC:STAT?", "LOGGING_STABILITY,COMPLETE"),
        (":SENS1:FUNC:RES?", block),
    ])
    pm.start_logging(1, 3, 1e-3, trigger="SME")
    np.testing.assert_array_equal(pm.logging_result(1), np.array(values, dtype=np.float32))
    link.assert_all_consumed()


def test_protocol_logging_in_dbm_and_relative_is_converted_to_watts() -> None:
    dbm_block = ieee_block(struct.pack("<2f", -10.0, 9.91e37)) + b"\n"
    db_block = ieee_block(struct.pack("<1f", 3.0)) + b"\n"
    pm, link = scripted([
        (":SENS1:POW:REF:STAT?", "+0"),
        (":SENS1:POW:UNIT?", "+0"),
        (":TRIG1:INP IGN", None), NO_ERROR,
        (":SENS1:FUNC:PAR:LOGG 2,0.001S", None), NO_ERROR,
        (":SENS1:FUNC:STAT LOGG,STAR", None), NO_ERROR,
        (":SENS1:FUNC:STAT?", "LOGGING_STABILITY,COMPLETE"),
        (":SENS1:FUNC:RES?", dbm_block),
        (":SENS1:POW:REF:STAT 1", None), NO_ERROR,
        (":SENS1:POW:REF:STAT?", "+1"),
        (":TRIG1:INP IGN", None), NO_ERROR,
        (":SENS1:FUNC:PAR:LOGG 1,0.001S", None), NO_ERROR,
        (":SENS1:FUNC:STAT LOGG,STAR", None), NO_ERROR,
        (":SENS1:FUNC:STAT?", "LOGGING_STABILITY,COMPLETE"),
        (":SENS1:POW:REF?", "-13.0"),
        (":SENS1:FUNC:RES?", db_block),
    ])
    pm.start_logging(1, 2, 1e-3)
    np.testing.assert_allclose(pm.logging_result(1), [1e-4, 0.0], rtol=1e-6)
    pm.set_reference_relative(1, True)
    pm.start_logging(1, 1, 1e-3)
    np.testing.assert_allclose(pm.logging_result(1), [1e-4], rtol=1e-6)   # -13 dBm + 3 dB
    link.assert_all_consumed()


@pytest.mark.parametrize("reply", [b"garbage\n", b"#0\n", b"#2x8" + b"\0" * 8 + b"\n",
                                   b"#13abc\n", b"#14abcdX"])
def test_protocol_bad_block_is_a_protocol_error(reply: bytes) -> None:
    pm, link = scripted([
        (":SENS1:FUNC:STAT?", "NONE,COMPLETE"),
        (":SENS1:POW:REF:STAT?", "+0"),
        (":SENS1:POW:UNIT?", "+1"),
        (":SENS1:FUNC:RES?", reply),
    ])
    with pytest.raises(ProtocolError):
        pm.logging_result(1)


def test_protocol_queued_error_names_the_command() -> None:
    pm, link = scripted([
        (":SENS1:POW:WAV 1300.0000NM", None),
        (":SYST:ERR?", '-221,"Settings conflict"'),
        (":SYST:ERR?", '+0,"No error"'),
    ])
    with pytest.raises(DeviceError, match=r"':SENS1:POW:WAV 1300.0000NM' refused.*-221"):
        pm.set_wavelength_nm(1, 1300)
    link.assert_all_consumed()


@pytest.mark.parametrize("sent, answer, call", [
    ("*IDN?", "Keysight,N7744A", lambda pm: pm.identify()),
    (":SENS1:POW:WAV?", "1.2.3", lambda pm: pm.wavelength_nm(1)),
    (":SENS1:POW:WAV?", "NAN", lambda pm: pm.wavelength_nm(1)),
    (":SENS1:FUNC:STAT?", "LOGGING", lambda pm: pm.logging_state(1)),
    (":SYST:ERR?", "no error", lambda pm: pm.errors()),
])
def test_protocol_malformed_answers(sent: str, answer: str, call) -> None:
    pm, link = scripted([(sent, answer)])
    with pytest.raises(ProtocolError):
        call(pm)
    link.assert_all_consumed()
