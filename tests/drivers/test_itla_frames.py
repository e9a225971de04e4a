"""The ITLA frame codec and register map (pure: no link, no driver)."""

from __future__ import annotations

import pytest

from oddl.common.errors import DeviceError, ProtocolError
from oddl.drivers.itla_frames import (
    Reply,
    Status,
    bip4,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
    split_mhz,
)
from oddl.drivers.itla_registers import Access, ItlaStatus, register


@pytest.mark.parametrize(("register_", "data", "write", "expected"), [
    (0x00, 0, False, "00 00 00 00"),     # read NOP
    (0x30, 0, False, "30 30 00 00"),     # read Channel
    (0x01, 0, False, "10 01 00 00"),     # read DevTyp
    (0x32, 0x0008, True, "81 32 00 08"),  # enable output
    (0x31, 1300, True, "31 31 05 14"),   # PWR = 13.00 dBm
])
def test_worked_frames_from_the_msa(register_: int, data: int, write: bool, expected: str) -> None:
    frame = encode_request(register_, data, write)
    assert frame.hex(" ") == expected
    assert frame[0] >> 4 == bip4(*frame)
    req = decode_request(frame)
    assert (req.register, req.data, req.write, req.last_response) == (register_, data, write, False)


def test_checksum_ignores_its_own_nibble() -> None:
    assert bip4(0x81, 0x32, 0x00, 0x08) == bip4(0x01, 0x32, 0x00, 0x08) == 0x8


def test_request_flags_and_negative_data() -> None:
    assert encode_request(0x30, last_response=True).hex(" ") == "b8 30 00 00"
    assert encode_request(0x31, -100, True)[2:] == b"\xff\x9c"
    with pytest.raises(ValueError):
        encode_request(0x31, 0x10000, True)
    with pytest.raises(ValueError):
        encode_request(0x100)


@pytest.mark.parametrize("status", list(Status))
def test_reply_round_trip(status: Status) -> None:
    frame = encode_reply(0x42, 0xFF38, status)
    reply = decode_reply(frame)
    assert reply == Reply(status, False, 0x42, 0xFF38)
    assert reply.signed == -200


def test_reply_flags_and_worked_reply() -> None:
    assert decode_reply(bytes.fromhex("90 32 00 08")) == Reply(Status.OK, False, 0x32, 8)
    assert decode_reply(bytes.fromhex("a3 32 00 08")).status is Status.CP
    ce = decode_reply(encode_reply(0x30, ce=True))
    assert ce.ce and ce.status is Status.OK


def test_bad_replies_raise_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="checksum"):
        decode_reply(bytes.fromhex("00 30 00 05"))
    with pytest.raises(ProtocolError, match="4 bytes"):
        decode_reply(b"\x90\x32\x00")
    with pytest.raises(ProtocolError, match="checksum"):
        decode_request(bytes.fromhex("01 32 00 08"))


def test_register_table_by_name_alias_and_address() -> None:
    assert register("channel").address == 0x30
    assert register("PWR").signed and register("PWR").units == "dBm*100"
    assert register("LF1").access is Access.RO
    assert register("AEA-EAR") is register("EAR") is register(0x0B)
    assert register("SerNo").aea
    assert register(0xE0).name == "0xE0" and register(0xE0).access is Access.RW
    names = {r: register(r).address for r in ("NOP", "DevTyp", "MFGR", "Model", "SerNo",
             "MFGDate", "Release", "RelBack", "GenCfg", "EAC", "EA", "EAR", "IOCap", "LstResp",
             "StatusF", "StatusW", "Channel", "PWR", "ResEna", "MCB", "GRID", "FCF1", "FCF2",
             "LF1", "LF2", "OOP", "CTemp", "FTFR", "OPSL", "OPSH", "LFL1", "LFL2", "LFH1",
             "LFH2", "LGrid", "FTF", "ChannelH", "GRID2", "FCF3", "LF3")}
    assert names["ChannelH"] == 0x65 and names["FCF3"] == 0x67 and names["LGrid"] == 0x56
    with pytest.raises(DeviceError, match="unknown ITLA register"):
        register("Bogus")


def test_split_mhz() -> None:
    assert split_mhz(193_100_000) == (193, 1000, 0)
    assert split_mhz(193_412_345) == (193, 4123, 45)


def test_status_decoding() -> None:
    st = ItlaStatus(statusf=0x1000 | 0x20, statusw=0x1000, nop=0x0010)
    assert st.output_disabled and not st.locked and st.latched == ("MRL",)
    tuning = ItlaStatus(statusf=0x4500, statusw=0x4500, nop=0x0203)
    assert tuning.pending and tuning.pending_flags == 2 and tuning.error.mnemonic == "RVE"
    assert tuning.alarms == ("FPWR", "FFREQ", "ALM", "WPWR", "WFREQ")
    assert ItlaStatus(0, 0, 0x10).locked
