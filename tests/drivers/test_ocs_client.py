"""Lab clients of a Polatis switch against ``ocs_serve``, run as its own process.

No published Polatis client could be kept here unchanged (docs/reference/devices/ocs.md):
wllzhk/Polatis_OST_Controller's ``OXC.py`` has no licence (and imports ``telnetlib``, gone
from Python 3.13); hpn-bristol/devicecontrol-polatis is not on PyPI and no licence for it
could be read. So:

- a plain pyvisa script of the kind labs write (``TCPIP0::host::port::SOCKET``, LF
  terminations, pyvisa-py), run as is;
- the exchanges of ``OXC.py`` (LF-terminated lines on the SCPI socket, one ``read_until``
  LF per query, commands unanswered) and of devicecontrol-polatis's ``ScpiInterface`` (each
  message followed by ``*opc?`` on the same write, answers up to ``\\r\\n1\\r\\n``),
  re-enacted here from what the clients send and expect; their code is not copied.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from collections.abc import Iterator

import pytest
import pyvisa
from helpers import serving, stop_with_sigterm

pytestmark = pytest.mark.e2e

SIZE = 24
DBM = -3.0


@pytest.fixture(scope="module")
def ready() -> Iterator[dict[str, object]]:
    """``python -m oddl.drivers.emulators.ocs_serve`` as a 24x24 unit, as OXC.py expects."""
    argv = [sys.executable, "-m", "oddl.drivers.emulators.ocs_serve", "--listen", "127.0.0.1:0",
            "--size", str(SIZE), "--switch-ms", "1", "--input-dbm", str(DBM)]
    with serving(argv, 30, "ocs_serve") as (proc, line):
        yield json.loads(line)
        assert stop_with_sigterm(proc) == 0


@pytest.fixture
def visa(ready: dict[str, object]) -> Iterator[pyvisa.resources.MessageBasedResource]:
    rm = pyvisa.ResourceManager("@py")
    inst = rm.open_resource(str(ready["resource"]), read_termination="\n",
                            write_termination="\n", timeout=10_000)
    assert isinstance(inst, pyvisa.resources.MessageBasedResource)
    inst.write("*RST")
    inst.write("*CLS")
    try:
        yield inst
    finally:
        inst.close()
        rm.close()


def test_a_plain_pyvisa_script(visa: pyvisa.resources.MessageBasedResource) -> None:
    assert visa.query("*IDN?").strip().startswith(f"Polatis,N-OST-{SIZE}x{SIZE}-")
    visa.write(":OXC:SWITch:CONNect:ONLY (@1,2,3),(@25,26,27)")
    assert visa.query("*OPC?").strip() == "1"
    assert visa.query(":OXC:SWITch:CONNect:STATe?").strip() == "(@1,2,3),(@25,26,27)"
    visa.write(":oxc:swit:conn:add (@4),(@28)")
    visa.write(":oxc:swit:conn:sub (@1),(@25)")
    assert visa.query(":oxc:swit:conn:port? 4").strip() == '"28"'
    assert visa.query(":oxc:swit:conn:port? 1").strip() == '""'
    assert visa.query(":pmon:pow? (@2,26,25)").strip() == "(-3.00,-4.50,-60.00)"
    visa.write(":oxc:swit:conn:add (@2),(@40)")  # 2 is in use: queued, not made
    assert visa.query(":syst:err?").strip() == '-221,"Settings conflict"'
    assert visa.query(":syst:err?").strip() == '0,"No error"'


# ----- OXC.py (wllzhk/Polatis_OST_Controller), re-enacted ------------------------------------

class LineSocket:
    """What telnetlib gave OXC.py: write bytes, read until a byte string or a timeout."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_until(self, end: bytes, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while end not in self.buf and time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                break
            if not chunk:
                break
            self.buf += chunk
        cut = self.buf.find(end)
        size = len(self.buf) if cut < 0 else cut + len(end)
        out, self.buf = self.buf[:size], self.buf[size:]
        return out

    def close(self) -> None:
        self.sock.close()


def test_the_oxc_py_demo_sequence(ready: dict[str, object]) -> None:
    """OXC.py's __main__: check_com, init_connection 1..23 -> 25..47, add (15, 38), query 15.

    Its query waits 1 s for a line; ours waits 10 s (a loaded machine must not fail it)."""
    link = LineSocket(int(str(ready["port"])))
    try:
        link.write(b"*RST\n*CLS\n")
        link.write(b"*idn?\n")
        assert b"Polatis,N-OST-24x24-LA1-DMHNS" in link.read_until(b"\n", 10)
        ingress, egress = list(range(1, 24)), list(range(25, 48))
        link.write((":oxc:swit:conn:only (@" + ",".join(map(str, ingress)) + "),(@"
                    + ",".join(map(str, egress)) + ")\n").encode("ascii"))
        link.write(b"oxc:swit:conn:add (@15),(@38)\n")  # 15 and 38 are both in use already
        link.write(b"oxc:swit:conn:port? 15\n")
        assert link.read_until(b"\n", 10) == b'"39"\r\n'  # the add changed nothing
        link.write(b":syst:err?\n")
        assert link.read_until(b"\n", 10) == b'-221,"Settings conflict"\r\n'
    finally:
        link.close()


# ----- devicecontrol-polatis (hpn-bristol), re-enacted ------------------------------------------

class OpcSession:
    """devicecontrol-polatis's exchange: every message with ``*opc?`` behind it."""

    def __init__(self, port: int) -> None:
        self.link = LineSocket(port)
        self.link.write(b"*opc?\n")  # the session starts in step
        assert self.link.read_until(b"1\r\n", 10).endswith(b"1\r\n")

    def query(self, message: str) -> str:
        self.link.write(f"{message}\r\n*opc?\n".encode("ascii"))
        got = self.link.read_until(b"\r\n1\r\n", 10)
        assert got.endswith(b"\r\n1\r\n"), got
        return got[:-5].decode("ascii").strip()

    def command(self, message: str) -> None:
        self.link.write(f"{message}\r\n*opc?\n".encode("ascii"))
        assert self.link.read_until(b"1\r\n", 10) == b"1\r\n"


def decode_state(text: str) -> dict[int, int]:
    ingress, egress = ([int(p) for p in part.strip("(@)").split(",") if p]
                       for part in text.split("),("))
    return dict(zip(ingress, egress, strict=True))


def test_the_devicecontrol_polatis_exchange(ready: dict[str, object]) -> None:
    s = OpcSession(int(str(ready["port"])))
    try:
        s.command("*rst")
        idn = tuple(s.query("*idn?").split(","))
        m = re.findall(r"-(\d+)x(\d+)-", idn[1], re.I)
        assert idn[0] == "Polatis" and (int(m[0][0]), int(m[0][1])) == (SIZE, SIZE)
        assert decode_state(s.query("oxc:swit:conn:stat?")) == {}
        s.command("oxc:swit:conn:add (@1,3),(@26,27)")  # connect({1: 26, 3: 27})
        assert decode_state(s.query("oxc:swit:conn:stat?")) == {1: 26, 3: 27}
        s.command("oxc:swit:conn:add (@4),(@28)")
        powers = [float(p) for p in s.query(":pmon:pow? (@26,27,30)").strip("()").split(",")]
        assert powers == [DBM - 1.5, DBM - 1.5, -60.0]
        s.command("oxc:swit:conn:sub (@1,3),(@26,27)")
        assert decode_state(s.query("oxc:swit:conn:stat?")) == {4: 28}
        s.command("oxc:swit:conn:only (@7),(@31)")
        assert decode_state(s.query("oxc:swit:conn:stat?")) == {7: 31}
        s.command("oxc:swit:disc:all")
        assert decode_state(s.query("oxc:swit:conn:stat?")) == {}
    finally:
        s.link.close()
