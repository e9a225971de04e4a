"""Tests of the power meter emulator: SCPI parser, error queue, readings, logging (the wire,
faults and CLI: test_powermeter_emulator_wire)."""

from __future__ import annotations

import math
import struct

import pytest
from fakes import FakeClock, Optics

from oddl.drivers.emulators.powermeter import ERROR_QUEUE_SIZE, PowerMeterEmulator
from oddl.drivers.emulators.powermeter_model import TOO_LOW_READING
from oddl.drivers.emulators.scpi import ieee_block, parse_ieee_block


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(500.0)


@pytest.fixture
def optics() -> Optics:
    return Optics()


@pytest.fixture
def emu(clock: FakeClock, optics: Optics) -> PowerMeterEmulator:
    return PowerMeterEmulator(power_source=optics, clock=clock, noise_db=0.0)


def errors(emu: PowerMeterEmulator) -> list[int]:
    """Drain the queue over SCPI and return the codes."""
    codes = []
    while True:
        answer = emu.handle_line("SYST:ERR?")
        assert isinstance(answer, str)
        code = int(answer.split(",")[0])
        if code == 0:
            return codes
        codes.append(code)


def value(emu: PowerMeterEmulator, line: str) -> float:
    answer = emu.handle_line(line)
    assert isinstance(answer, str), (line, answer, emu.error_codes())
    return float(answer)


def fresh(emu: PowerMeterEmulator, ch: int, header: str = "READ{}:POW?") -> float:
    """READ? on a channel that does not measure continuously: a new measurement each time."""
    return value(emu, f":INIT{ch}:CONT OFF;:" + header.format(ch))


# --- identity, common commands, parser ---------------------------------------------------------

def test_idn_names_model_by_channel_count() -> None:
    assert PowerMeterEmulator().handle_line("*IDN?") == \
        "Keysight Technologies,N7744A,EMU0000001,1.0.0-emu"
    eight = PowerMeterEmulator(channels=8, serial_number="MY123")
    assert eight.handle_line("*idn?") == "Keysight Technologies,N7745A,MY123,1.0.0-emu"
    with pytest.raises(ValueError, match="1..8"):
        PowerMeterEmulator(channels=9)


@pytest.mark.parametrize("setting, query", [
    (":SENS1:POW:WAV 1310NM", ":SENS1:POW:WAV?"),
    (":SENSe1:POWer:WAVelength 1310nm", ":SENSe1:POWer:WAVelength?"),
    ("sens1:pow:wav 1.31UM", "SENSE1:POWER:WAVELENGTH?"),
    ("SENS:POW:WAV 1.31E-6", "sens1:chan1:pow:wav?"),
    (":SENSE1:CHANNEL1:POWER:WAVELENGTH 1310 NM", ":SENS:POW:WAV?"),
    ("SENS1:POW:WAV 1310000PM", ":sens1:pow:wav?"),
])
def test_long_short_forms_case_and_colon_are_equivalent(emu: PowerMeterEmulator, setting: str,
                                                         query: str) -> None:
    assert emu.handle_line(setting) is None
    assert value(emu, query) == pytest.approx(1310e-9)
    assert errors(emu) == []


def test_settings_read_back_with_units(emu: PowerMeterEmulator) -> None:
    assert emu.handle_line(":SENS2:POW:ATIM 1MS;:SENS2:POW:RANG:AUTO 0;:SENS2:CORR 0.5DB") is None
    assert value(emu, ":SENS2:POW:ATIM?") == pytest.approx(1e-3)
    assert emu.handle_line(":SENS2:POW:RANG:AUTO?") == "+0"
    assert value(emu, ":SENSe2:CORRection:LOSS:INPut:MAGNitude?") == pytest.approx(0.5)
    assert emu.handle_line(":SENS2:POW:ATIM 250 US;:SENS2:POW:RANG:AUTO ON") is None
    assert value(emu, ":SENS2:POW:ATIM?") == pytest.approx(250e-6)
    assert emu.handle_line(":SENS2:POW:RANG:AUTO?") == "+1"
    assert emu.handle_line(":SENS2:POW:UNIT W;:SENS2:POW:UNIT?") == "+1"
    assert emu.handle_line(":TRIG2:INP SMEasure;:TRIG2:OUTP avg;:TRIG2:INP?;:TRIG2:OUTP?") == \
        "SME;AVG"
    assert emu.handle_line(":INIT2:CONT OFF;:INIT2:CONT?") == "+0"
    assert emu.handle_line(":SENS2:POW:ATIM MAX;:SENS2:POW:WAV MIN") is None
    assert value(emu, ":SENS2:POW:ATIM?") == pytest.approx(10.0)
    assert value(emu, ":SENS2:POW:WAV?") == pytest.approx(1250e-9)
    # other channels are untouched
    assert value(emu, ":SENS1:POW:ATIM?") == pytest.approx(0.1)
    assert errors(emu) == []


def test_compound_line_answers_joined_by_semicolon(emu: PowerMeterEmulator) -> None:
    assert emu.handle_line("*OPC?;:SENS1:POW:UNIT?;*TST?") == "1;+0;0"
    assert emu.handle_line("") is None
    assert emu.handle_line("  ;  ") is None
    assert errors(emu) == []


@pytest.mark.parametrize("line, code", [
    ("FOO", -113),
    (":SENS1:POW:WAVX?", -113),
    ("SENS1::POW:WAV?", -113),
    (":FETC1:POW", -113),                  # query-only header used as a setting
    (":INIT1:IMM?", -113),                 # setting-only header used as a query
    ("*FOO", -113),
    (":SYST1:ERR?", -113),                 # SYSTem takes no suffix
    (":SENS5:POW:WAV?", -114),             # 4-channel meter
    (":SENS0:POW:WAV?", -114),
    (":SENS1:CHAN2:POW:WAV?", -114),
    (":SENS1:POW:WAV", -109),
    (":SENS1:POW:WAV 1310NM,5", -108),
    (":SENS1:POW:WAV? MAX", -108),
    ("*IDN? 1", -108),
    (":SENS1:POW:WAV abc", -104),
    (":SENS1:POW:WAV 1310XX", -131),
    (":SENS1:POW:ATIM 1KS", -131),
    (":SENS1:POW:WAV 2000NM", -222),
    (":SENS1:POW:WAV 1550", -222),          # base unit is metres
    (":SENS1:POW:ATIM 0.1US", -222),
    (":SENS1:POW:WAV 1E999", -222),
    (":SENS1:FUNC:PAR:LOGG 0,1MS", -222),
    (":SENS1:POW:UNIT 2", -224),
    (":SENS1:POW:RANG:AUTO MAYBE", -224),
    (":TRIG1:INP NOW", -224),
    (":SENS1:FUNC:STAT LOGG,GO", -224),
    (":SENS1:POW:WAV\x011310NM", -101),
    ("*IDN?\u00e9", -101),
])
def test_bad_input_queues_the_standard_code(emu: PowerMeterEmulator, line: str,
                                            code: int) -> None:
    assert emu.handle_line(line) is None   # no answer, no exception
    assert errors(emu) == [code]
    assert emu.handle_line(":SENS1:POW:WAV?") is not None  # still serving


def test_error_queue_order_messages_cls_and_overflow(emu: PowerMeterEmulator) -> None:
    emu.handle_line("FOO;:SENS1:POW:WAV 1NM")
    assert emu.handle_line("SYST:ERR:COUN?") == "+2"
    assert emu.handle_line("SYSTem:ERRor:NEXT?") == '-113,"Undefined header"'
    assert emu.handle_line(":syst:err?") == '-222,"Data out of range"'
    assert emu.handle_line("SYST:ERR?") == '+0,"No error"'   # Keysight signs the code
    emu.handle_line("FOO")
    emu.handle_line("*CLS")
    assert errors(emu) == []
    for _ in range(ERROR_QUEUE_SIZE + 5):
        emu.handle_line("FOO")
    codes = errors(emu)
    assert len(codes) == ERROR_QUEUE_SIZE
    assert codes[-1] == -350 and set(codes[:-1]) == {-113}


def test_rst_restores_defaults_but_keeps_error_queue(emu: PowerMeterEmulator) -> None:
    emu.handle_line(":SENS3:POW:WAV 1310NM;:SENS3:POW:UNIT 1;:INIT3:CONT 0;FOO")
    assert emu.handle_line("*RST") is None
    assert value(emu, ":SENS3:POW:WAV?") == pytest.approx(1550e-9)
    assert emu.handle_line(":SENS3:POW:UNIT?;:INIT3:CONT?;:TRIG3:INP?") == "+0;+1;IGN"
    assert errors(emu) == [-113]


# --- readings follow the optics --------------------------------------------------------------

def test_read_follows_power_source(emu: PowerMeterEmulator, optics: Optics) -> None:
    optics.dbm[1] = -3.0
    assert fresh(emu, 1) == pytest.approx(-3.0)
    optics.dbm[1] = -12.5   # e.g. the WSS attenuates the channel
    assert fresh(emu, 1) == pytest.approx(-12.5)
    optics.dbm[2] = -7.0    # light arrives on another port: channel 1 goes dark
    optics.dbm[1] = None
    assert fresh(emu, 1) == TOO_LOW_READING
    assert fresh(emu, 2, "READ{}:SCALar:POWer:DC?") == pytest.approx(-7.0)
    assert fresh(emu, 3) > 1e20


def test_no_power_source_means_dark_and_floor_means_too_low() -> None:
    assert value(PowerMeterEmulator(), ":READ1:POW?") == TOO_LOW_READING
    emu = PowerMeterEmulator(power_source=lambda ch: -85.0, noise_floor_dbm=-80.0)
    assert fresh(emu, 1) == TOO_LOW_READING
    emu = PowerMeterEmulator(power_source=lambda ch: -75.0, noise_floor_dbm=-80.0,
                             noise_db=0.0)
    assert fresh(emu, 1) == pytest.approx(-75.0)


def test_watt_unit_and_correction(emu: PowerMeterEmulator, optics: Optics) -> None:
    optics.dbm[1] = 0.0
    emu.handle_line(":SENS1:POW:UNIT 1")
    assert fresh(emu, 1) == pytest.approx(1e-3)
    emu.handle_line(":SENS1:POW:UNIT DBM;:SENS1:CORR 1.5DB")
    assert fresh(emu, 1) == pytest.approx(1.5)
    optics.dbm[1] = None
    emu.handle_line(":SENS1:POW:UNIT W")
    assert abs(fresh(emu, 1)) < 1e-9   # floor noise, not the dBm sentinel


def test_noise_is_seeded_and_small(optics: Optics) -> None:
    optics.dbm[1] = -10.0
    a = PowerMeterEmulator(power_source=optics, seed=7, noise_db=0.05)
    b = PowerMeterEmulator(power_source=optics, seed=7, noise_db=0.05)
    ra = [fresh(a, 1) for _ in range(20)]
    rb = [fresh(b, 1) for _ in range(20)]
    assert ra == rb
    assert len(set(ra)) > 1
    assert all(abs(r + 10.0) < 0.5 for r in ra)


def test_fetch_updates_once_per_averaging_period(emu: PowerMeterEmulator, optics: Optics,
                                                 clock: FakeClock) -> None:
    optics.dbm[1] = -3.0
    assert value(emu, ":FETC1:POW?") == pytest.approx(-3.0)
    optics.dbm[1] = -4.0
    assert value(emu, ":FETC1:POW?") == pytest.approx(-3.0)   # same 100 ms period
    clock.t += 0.1
    assert value(emu, ":FETC1:POW?") == pytest.approx(-4.0)


def test_single_measurements_hold_until_initiated(emu: PowerMeterEmulator, optics: Optics,
                                                  clock: FakeClock) -> None:
    optics.dbm[1] = -3.0
    emu.handle_line(":INIT1:CONT OFF")
    optics.dbm[1] = -6.0
    clock.t += 5
    assert value(emu, ":FETC1:POW?") == pytest.approx(-3.0)
    emu.handle_line(":INIT1:IMM")
    assert value(emu, ":FETC1:POW?") == pytest.approx(-6.0)
    optics.dbm[1] = -9.0
    emu.handle_line(":INIT1")
    assert value(emu, ":FETC1:POW?") == pytest.approx(-9.0)
    assert errors(emu) == []


def test_failing_power_source_is_a_device_error_not_a_crash() -> None:
    def broken(channel: int) -> float | None:
        raise RuntimeError("laser model bug")

    emu = PowerMeterEmulator(power_source=broken)
    assert emu.handle_line(":READ1:POW?") is None
    assert errors(emu) == [-300]


# --- logging -------------------------------------------------------------------------------

def block_floats(answer: object) -> list[float]:
    assert isinstance(answer, bytes)
    payload = parse_ieee_block(answer)
    return list(struct.unpack(f"<{len(payload) // 4}f", payload))


def test_logging_block_format_and_values(emu: PowerMeterEmulator, optics: Optics,
                                         clock: FakeClock) -> None:
    optics.dbm[1] = -10.0
    emu.handle_line(":SENS1:FUNC:PAR:LOGG 5,1MS")
    assert emu.handle_line(":SENS1:FUNC:PAR:LOGG?") == "+5,+1.00000000E-03"
    emu.handle_line(":SENS1:FUNC:STAT LOGG,STAR")
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    assert emu.handle_line(":SENS1:FUNC:RES?") is None
    assert errors(emu) == [-230]
    clock.t += 0.002
    emu.handle_line("*OPC?")   # samples are drawn when the emulator is next asked
    optics.dbm[1] = -20.0
    clock.t += 0.003
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    answer = emu.handle_line(":SENS1:FUNC:RES?")
    assert isinstance(answer, bytes) and answer.startswith(b"#220")
    # the samples are in the unit the channel is set to: dBm here
    assert block_floats(answer) == [-10.0, -10.0, -20.0, -20.0, -20.0]
    emu.handle_line(":SENS1:POW:UNIT W;:SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 0.005
    w_20 = struct.unpack("<f", struct.pack("<f", 1e-5))[0]
    assert block_floats(emu.handle_line(":SENS1:FUNC:RES?")) == [w_20] * 5
    emu.handle_line(":SENS1:POW:UNIT DBM;:SENS1:POW:REF -25DBM;:SENS1:POW:REF:STAT ON;"
                    ":SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 0.005
    assert block_floats(emu.handle_line(":SENS1:FUNC:RES?")) == [5.0] * 5   # dB, relative
    optics.dbm[1] = None
    emu.handle_line(":SENS1:POW:REF:STAT OFF;:SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 0.005
    too_low = struct.unpack("<f", struct.pack("<f", TOO_LOW_READING))[0]
    assert block_floats(emu.handle_line(":SENS1:FUNC:RES?")) == [too_low] * 5
    assert errors(emu) == []


def test_block_helpers_round_trip() -> None:
    assert ieee_block(b"") == b"#10"
    assert parse_ieee_block(ieee_block(b"x" * 1234)) == b"x" * 1234
    for bad in (b"", b"#", b"#0", b"12", b"#2a1x", b"#15abc"):
        with pytest.raises(ValueError):
            parse_ieee_block(bad)


def test_empty_result_before_any_logging(emu: PowerMeterEmulator) -> None:
    assert emu.handle_line(":SENS2:FUNC:RES?") == b"#10"
    assert emu.handle_line(":SENS2:FUNC:STAT?") == "NONE,COMPLETE"


def test_logging_on_triggers(emu: PowerMeterEmulator, optics: Optics,
                             clock: FakeClock) -> None:
    optics.dbm[2] = 0.0
    emu.handle_line(":TRIG2:INP SME;:SENS2:FUNC:PAR:LOGG 3,1MS;:SENS2:FUNC:STAT LOGG,STAR")
    clock.t += 10
    emu.trigger(2)
    emu.trigger(2)
    assert emu.handle_line(":SENS2:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    emu.trigger(2)
    assert emu.handle_line(":SENS2:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    assert len(block_floats(emu.handle_line(":SENS2:FUNC:RES?"))) == 3

    emu.handle_line(":TRIG3:INP CME;:SENS3:FUNC:PAR:LOGG 2,1S;:SENS3:FUNC:STAT LOGG,STAR")
    clock.t += 10
    assert emu.handle_line(":SENS3:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    emu.trigger(3)
    clock.t += 2
    assert emu.handle_line(":SENS3:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    assert errors(emu) == []


def test_setting_or_stop_ends_logging_with_partial_data(emu: PowerMeterEmulator,
                                                        optics: Optics,
                                                        clock: FakeClock) -> None:
    optics.dbm[1] = -1.0
    emu.handle_line(":SENS1:FUNC:PAR:LOGG 10,1S;:SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 3
    emu.handle_line(":SENS1:POW:WAV 1310NM")
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "NONE,COMPLETE"
    assert len(block_floats(emu.handle_line(":SENS1:FUNC:RES?"))) == 3
    emu.handle_line(":SENS1:FUNC:STAT LOGG,STAR")
    clock.t += 1
    emu.handle_line(":SENS1:FUNC:STAT LOGG,STOP")
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "NONE,COMPLETE"
    assert len(block_floats(emu.handle_line(":SENS1:FUNC:RES?"))) == 1
    # a rejected setting does not stop a run
    emu.handle_line(":SENS1:FUNC:STAT LOGG,STAR;:SENS1:POW:WAV 1NM")
    assert emu.handle_line(":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
    assert errors(emu) == [-222]


def test_nan_power_reads_as_no_light() -> None:
    emu = PowerMeterEmulator(power_source=lambda ch: math.nan)
    assert value(emu, ":READ1:POW?") == TOO_LOW_READING
