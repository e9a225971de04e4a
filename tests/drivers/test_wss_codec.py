"""The flexgrid WSS codec and checksum framing (pure: no link, no driver)."""

from __future__ import annotations

import pytest

from oddl.common.errors import ProtocolError
from oddl.drivers.interfaces import BLOCKED_DB, Route
from oddl.drivers.wss_codec import (
    WssErrorReply,
    format_attenuation,
    format_table,
    format_ura,
    parse_error_line,
    parse_rra,
)
from oddl.drivers.wss_protocol import (
    ERROR_MEANINGS,
    ChecksumError,
    WssErrorCode,
    checksum,
    frame,
    unframe,
)


def test_format_attenuation_one_decimal() -> None:
    assert format_attenuation(0) == "0.0"
    assert format_attenuation(12.5) == "12.5"
    assert format_attenuation(BLOCKED_DB) == "99.9"


def test_format_ura_sorted_by_channel() -> None:
    table = {54: Route(3, BLOCKED_DB), 52: Route(3, 0.0), 53: Route(1, 2.5)}
    assert format_table(table) == "52,3,0.0;53,1,2.5;54,3,99.9"
    assert format_ura(table) == "URA 52,3,0.0;53,1,2.5;54,3,99.9"


def test_parse_rra_round_trips_format_table() -> None:
    table = {0: Route(99, BLOCKED_DB), 2: Route(4, 0.0), 3: Route(2, 17.3), 4: Route(99, 0.0)}
    assert parse_rra(format_table(table)) == table


@pytest.mark.parametrize("line, expected", [
    ("1,2,0.0", {1: Route(2, 0.0)}),
    ("1,2,0.0;", {1: Route(2, 0.0)}),
    ("0,99,99.9", {0: Route(99, BLOCKED_DB)}),
    (" 1,2,0 ; 5,99,99.9 ", {1: Route(2, 0.0), 5: Route(99, BLOCKED_DB)}),
])
def test_parse_rra_accepts(line: str, expected: dict[int, Route]) -> None:
    assert parse_rra(line) == expected


def test_parse_rra_joins_several_lines() -> None:
    assert parse_rra(["0,1,0.0;1,2,0.5;", "2,99,99.9"]) == {
        0: Route(1, 0.0), 1: Route(2, 0.5), 2: Route(99, BLOCKED_DB)}
    with pytest.raises(ProtocolError, match="twice"):
        parse_rra(["0,1,0.0", "0,2,0.0"])


@pytest.mark.parametrize("line", [
    "", ";", "1,2", "1,2,0.0,7", "a,2,0.0", "1,2,-1.0", "1,2,0.0;;2,1,0.0",
    "1,2,0.0;1,3,0.0", "1,2,nan", "1;2;3", "OK",
])
def test_parse_rra_rejects_with_protocol_error(line: str) -> None:
    with pytest.raises(ProtocolError, match="wss-a"):
        parse_rra(line, device="wss-a")


@pytest.mark.parametrize("line, code", [
    ("CER", WssErrorCode.CER), ("AER", WssErrorCode.AER), ("RER", WssErrorCode.RER),
    ("VER", WssErrorCode.VER), ("ver ", WssErrorCode.VER), ("^RER$FF17", WssErrorCode.RER),
])
def test_parse_error_line(line: str, code: WssErrorCode) -> None:
    assert parse_error_line(line) == WssErrorReply(code, ERROR_MEANINGS[code])


@pytest.mark.parametrize("line", ["OK", "URA 1,1,0.0", "CERT", "ERR 3 x", "SN000001", "",
                                  "^RER$0000", "^OK$FF66"])
def test_parse_error_line_none_for_other_lines(line: str) -> None:
    assert parse_error_line(line) is None


# --- checksum framing -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, framed", [
    ("OK", "^OK$FF66"),          # the reply the manual and the FUTEBOL client show
    ("CHW 0", "^CHW 0$FECE"),    # the FUTEBOL client's own example
    ("CER", "^CER$FF26"),
])
def test_checksum_framing(text: str, framed: str) -> None:
    assert checksum(text) == int(framed[-4:], 16)
    assert frame(text) == framed
    assert unframe(framed) == (text, True)
    assert unframe(text) == (text, False)


@pytest.mark.parametrize("line", ["^OK$FF67", "^OK", "^OK$GG66", "^OK$FF6"])
def test_unframe_rejects_bad_frames(line: str) -> None:
    with pytest.raises(ChecksumError):
        unframe(line)
