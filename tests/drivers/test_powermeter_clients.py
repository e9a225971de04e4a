"""Published lab clients for the N774x meter drive `oddl emulate powermeter`, unchanged.

- PyMeasure's KeysightN7744C driver (tests/clients, MIT) on pyvisa-py, LF terminated;
- AutoSweep's KeysightN7745C (PyPI, MIT), which opens a TCPIP SOCKET with CR terminators and
  its own `pyvisa.ResourceManager()`;
- a plain pyvisa script of the kind labs write (CR-LF out, binary blocks in).

The emulator runs as its own process, started the way a lab user starts it.
"""

from __future__ import annotations

import importlib.util
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import pyvisa
from helpers import first_line, start_child

pytestmark = pytest.mark.e2e

DBM = -7.5
WATTS = 10 ** (DBM / 10) * 1e-3


def _load_pymeasure_client() -> ModuleType:
    pytest.importorskip("pymeasure", reason="pymeasure is in the dev extra")
    path = Path(__file__).parents[1] / "clients" / "pymeasure_keysightN7744C.py"
    spec = importlib.util.spec_from_file_location("pymeasure_keysightN7744C", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def resource() -> Iterator[str]:
    """`oddl emulate powermeter` in its own process; yields the resource string it prints."""
    cmd = [sys.executable, "-m", "oddl", "emulate", "powermeter", "--constant-dbm", str(DBM),
           "--noise-db", "0", "--serial", "MY-CLIENTS"]
    with start_child(cmd, capture_stderr=True) as proc:
        try:
            line = first_line(proc, 30, "oddl emulate powermeter")
            assert line.startswith("TCPIP0::127.0.0.1::") and line.endswith("::SOCKET"), line
            yield line
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- PyMeasure -------------------------------------------------------------------------------

@pytest.fixture
def pymeasure_meter(resource: str) -> Iterator[object]:
    client = _load_pymeasure_client()
    meter = client.KeysightN7744C(resource, visa_library="@py", read_termination="\n",
                                  write_termination="\n", timeout=10_000)
    meter.reset()
    meter.clear()
    try:
        yield meter
    finally:
        meter.adapter.close()


def test_pymeasure_identity_status_and_errors(pymeasure_meter) -> None:
    m = pymeasure_meter
    assert m.id == "Keysight Technologies,N7744A,MY-CLIENTS,1.0.0-emu"
    assert m.check_errors() == []
    m.write("SENS1:POW:WAV 9999NM")            # out of range: an error, as on the meter
    assert int(m.status) & 0x04                # *STB? error-queue bit
    assert m.error[0] == -222
    assert m.error[0] == 0                     # +0,"No error"
    assert m.check_errors() == []
    assert m.complete == "1"                # *OPC?


def test_pymeasure_channel_settings_round_trip(pymeasure_meter) -> None:
    ch = pymeasure_meter.channel_2
    ch.wavelength = 1310
    assert ch.wavelength == pytest.approx(1310)
    assert pymeasure_meter.channel_1.wavelength == pytest.approx(1550)
    ch.averaging_time = 0.001
    assert ch.averaging_time == pytest.approx(0.001)
    ch.range = -20
    assert ch.range == pytest.approx(-20)
    assert ch.auto_range is False              # a manual range ends auto ranging
    ch.auto_range = True
    assert ch.auto_range is True
    ch.auto_gain = False
    assert ch.auto_gain is False
    ch.logging_parameters = (250, 0.002)
    assert ch.logging_parameters == pytest.approx([250, 0.002])
    assert ch.state == ["NONE", "COMPLETE"]
    pymeasure_meter.wavelength_all = 1480
    assert [getattr(pymeasure_meter, f"channel_{n}").wavelength for n in range(1, 5)] == \
        pytest.approx([1480] * 4)
    assert pymeasure_meter.check_errors() == []


def test_pymeasure_power_in_the_channel_unit(pymeasure_meter) -> None:
    ch = pymeasure_meter.channel_3
    ch.power_unit = "Watt"
    assert ch.power_unit == "Watt"
    assert ch.power == pytest.approx(WATTS, rel=1e-6)
    ch.power_unit = "dBm"
    assert ch.power == pytest.approx(DBM, abs=1e-6)
    assert pymeasure_meter.check_errors() == []


def test_pymeasure_zero_time_and_preset(pymeasure_meter) -> None:
    m = pymeasure_meter
    m.write("SENS1:CORR:COLL:ZERO")
    assert m.channel_1.zero == 1               # light on the input: zeroing failed
    hour, minute, second = m.time
    assert 0 <= hour < 24 and 0 <= minute < 60 and 0 <= second < 60
    m.channel_1.auto_gain = False
    m.preset()
    assert m.channel_1.auto_gain is True
    assert m.check_errors() == []


# --- AutoSweep -------------------------------------------------------------------------------

@pytest.fixture
def autosweep_meter(resource: str) -> Iterator[object]:
    optical = pytest.importorskip("autosweep.instruments.optical.KeysightN7745C",
                                  reason="autosweep is in the dev extra")
    meter = optical.KeysightN7745C(resource)   # CR terminators on a SOCKET resource
    meter.com.com.timeout = 10_000
    meter.com.write("*RST")
    meter.clear_errors()                        # loops until exactly +0,"No error"
    try:
        yield meter
    finally:
        meter.close()


def test_autosweep_identity_and_readings(autosweep_meter) -> None:
    d = autosweep_meter
    assert d.idn_ask_dict() == {"vendor": "Keysight Technologies", "model": "N7744A",
                                "serial": "MY-CLIENTS", "version": "1.0.0-emu"}
    d.sense_power_unit(1, "DBM")
    assert d.sense_power_unit_ask_str(1) == "dBm"
    assert d.fetch_power_ask(1) == pytest.approx(DBM, abs=1e-6)
    assert d.read_power(1) == pytest.approx(DBM, abs=1e-6)
    # the ALL blocks are in W whatever the unit (the programming guide's text)
    assert d.fetch_power_all() == pytest.approx([WATTS] * 4, rel=1e-6)
    assert d.read_power_all() == pytest.approx([WATTS] * 4, rel=1e-6)
    d.assert_errors()


def test_autosweep_range_gain_wavelength(autosweep_meter) -> None:
    d = autosweep_meter
    d.sense_power_range_auto(2, "OFF")
    d.sense_power_range_dbm(2, -10)
    assert d.sense_power_range_ask(2) == pytest.approx(-10)
    assert d.sense_power_range_ask_w(2) == pytest.approx(2e-4)
    assert d.sense_power_range_auto_ask(2) == 0
    assert d.sense_power_gain_auto_ask(2) == 1
    d.sense_power_wavelength_nm(1550.5)         # :SENSE:POWER:WAVELENGTH:ALL
    assert d.sense_power_wavelength_ask_nm(4) == pytest.approx(1550.5)
    d.initiate_channel_continuous(2, None, False)
    d.initiate_channel_immediate(2, None)
    d.assert_errors()


def test_autosweep_triggered_logging(autosweep_meter) -> None:
    d = autosweep_meter
    d.set_trigger_configuration("LOOP")
    assert d.ask_trigger_configuration().strip() == "LOOP"
    d.sense_function_state(1, "LOGGING", "STOP")
    d.sense_power_unit(1, "Watt")
    d.trigger_input(1, "CMEASURE")
    d.sense_function_parameter_logging(1, 5, 0.001)
    d.sense_function_state(1, "LOGGING", "START")
    d.assert_errors()
    assert d.sense_function_state_ask(1) == ("LOGGING_STABILITY", "PROGRESS")
    d.trigger_the_input()                        # :TRIGGER NODEA starts the CME run
    deadline = time.monotonic() + 30
    while d.sense_function_state_ask_is_running(1):
        assert time.monotonic() < deadline, "logging never completed"
        time.sleep(0.02)
    values = d.com.com.query_binary_values(":SENSE1:FUNCTION:RESULT?", datatype="f",
                                           is_big_endian=False)
    assert values == pytest.approx([WATTS] * 5, rel=1e-6)   # W: the unit the channel had
    d.assert_errors()


# --- a plain pyvisa script ---------------------------------------------------------------------

def test_plain_pyvisa_script_with_crlf(resource: str) -> None:
    rm = pyvisa.ResourceManager("@py")
    inst = rm.open_resource(resource, read_termination="\r\n", write_termination="\r\n",
                            timeout=10_000)
    try:
        inst.write("*RST;*CLS")
        inst.write(":SENS1:POW:ATIM 0.001 s;:SENS1:POW:WAV 1550 nm")
        assert float(inst.query(":SENS1:POW:ATIM?")) == pytest.approx(1e-3)
        assert float(inst.query(":SENS1:POW:WAV?")) == pytest.approx(1550e-9)
        csv = [float(v) for v in inst.query(":FETC:POW:ALL:CSV?").split(",")]
        assert csv == pytest.approx([DBM] * 4, abs=1e-6)
        inst.write(":SENS2:POW:UNIT W")
        csv = [float(v) for v in inst.query(":READ:POW:ALL:CSV?").split(",")]
        assert csv[1] == pytest.approx(WATTS, rel=1e-6) and csv[0] == pytest.approx(DBM)
        config = inst.query_binary_values(":READ:POW:ALL:CONF?", datatype="H")
        assert list(config) == [1, 1, 2, 1, 3, 1, 4, 1]
        inst.write("FOO")
        assert int(inst.query("*ESR?")) & 0x20   # command error
        assert int(inst.query("*ESR?")) == 0     # read and cleared
        assert inst.query("SYST:ERR?") == '-113,"Undefined header"'
        assert inst.query("SYST:ERR?") == '+0,"No error"'
        raw = struct.pack("<f", WATTS)
        assert bytes(inst.query_binary_values(":FETC:POW:ALL?", datatype="B"))[4:8] == raw
    finally:
        inst.close()
        rm.close()
