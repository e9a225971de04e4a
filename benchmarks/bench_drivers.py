"""Driver round trips against the emulators, and a full verified reconfiguration.

- ITLA NOP and WSS `RRA?` round trips through the real drivers over `socket://`, against a
  same-run baseline: a raw 4-byte TCP echo on loopback (the floor any serial-over-TCP driver
  pays).
- A full reconfiguration of the emulated four-node testbed (four transmitters retuned and a new
  WSS table), from request to verified read-back, minus the configured device delays
  (time-to-lock and WSS settle): the controller's own overhead.

    python benchmarks/bench_drivers.py [--repeats 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time

import numpy as np

from oddl.common.config import load_testbed
from oddl.controller.device_types import Configuration
from oddl.controller.devices import DeviceManager
from oddl.controller.server import default_configuration
from oddl.drivers.emulators.host import start_emulated_testbed
from oddl.drivers.emulators.itla import ItlaEmulator
from oddl.drivers.emulators.itla_serve import itla_connection_handler
from oddl.drivers.emulators.tcpserve import TcpEmulatorServer
from oddl.drivers.emulators.wss import WssEmulator
from oddl.drivers.emulators.wss_serve import wss_connection_handler
from oddl.drivers.interfaces import Route
from oddl.drivers.itla import ItlaDriver
from oddl.drivers.transport import SerialTransport
from oddl.drivers.wss import FlexgridWss
from oddl.drivers.wss_codec import WssLimits
from oddl.launch.testbed import DEFAULT_TESTBED


def _stats(samples: list[float]) -> dict[str, float]:
    a = np.array(samples) * 1e6
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99))}


def _echo_baseline(repeats: int) -> list[float]:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := conn.recv(4):
            conn.sendall(data)
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        c.sendall(b"\x00\x00\x00\x00")
        got = b""
        while len(got) < 4:
            got += c.recv(4 - len(got))
        out.append(time.perf_counter() - t0)
    c.close()
    srv.close()
    return out


def _round_trips(repeats: int) -> dict[str, dict[str, float]]:
    base = _echo_baseline(repeats)
    itla_srv = TcpEmulatorServer(itla_connection_handler(ItlaEmulator()))
    # the testbed's 48-channel plan numbered from 1, as the emulator host serves it
    wss_srv = TcpEmulatorServer(wss_connection_handler(
        WssEmulator(settle_s=0.001, first_channel=1, channels=48, spacing_ghz=100.0,
                    first_thz=193.1)))
    laser = ItlaDriver(SerialTransport(itla_srv.url, timeout=0.5))
    wss = FlexgridWss(SerialTransport(wss_srv.url, timeout=0.5, baudrate=115200),
                      limits=WssLimits(channels=48, ports=4))
    try:
        itla_t, wss_t = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            laser.link.nop()
            itla_t.append(time.perf_counter() - t0)
        for _ in range(repeats):
            t0 = time.perf_counter()
            wss.read_active()
            wss_t.append(time.perf_counter() - t0)
    finally:
        laser.close()
        wss.close()
        itla_srv.close()
        wss_srv.close()
    b = _stats(base)
    out = {"tcp_echo_baseline": b, "itla_nop": _stats(itla_t), "wss_rra": _stats(wss_t)}
    for k in ("itla_nop", "wss_rra"):
        out[k]["ratio_p50"] = out[k]["p50_us"] / b["p50_us"]
    return out


def _reconfiguration(repeats: int) -> dict[str, float]:
    cfg = load_testbed(DEFAULT_TESTBED)
    tb = start_emulated_testbed(cfg)
    dm = DeviceManager(tb.resolved)
    try:
        dm.connect()
        dm.initialise(default_configuration(tb.resolved))
        tune_s = cfg.timing.laser_tune_ms / 1e3
        settle_s = cfg.timing.wss_settle_ms / 1e3
        lasers = [n.transmitter for n in cfg.nodes]
        overheads = []
        for i in range(repeats):
            # every transmitter to the next node's channel, and a WSS table with new attenuations
            channels = {tx: cfg.nodes[(k + 1 + i) % len(cfg.nodes)].rx_channel
                        for k, tx in enumerate(lasers)}
            table = {n.rx_channel: Route(cfg.attachment(n.id).out_port, 0.5 * ((i + 1) % 2))
                     for n in cfg.nodes}
            t0 = time.perf_counter()
            dm.transact(Configuration(channels, {"wss0": table}), reason="bench")
            overheads.append(time.perf_counter() - t0 - max(tune_s, settle_s))
        a = np.array(overheads) * 1e3
        return {"overhead_ms_p50": float(np.percentile(a, 50)),
                "overhead_ms_p99": float(np.percentile(a, 99)),
                "device_delay_ms": max(tune_s, settle_s) * 1e3, "repeats": repeats}
    finally:
        dm.close()
        tb.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--reconfigurations", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rt = _round_trips(args.repeats)
    r = _reconfiguration(args.reconfigurations)
    if args.json:
        print(json.dumps({"round_trips": rt, "reconfiguration": r}))
        return 0
    print(f"{'round trip':<22}{'p50 µs':>10}{'p99 µs':>10}{'p50 / TCP echo':>16}")
    for k, v in rt.items():
        print(f"{k:<22}{v['p50_us']:>10.1f}{v['p99_us']:>10.1f}{v.get('ratio_p50', 1.0):>16.2f}")
    print(f"full 4-node reconfiguration, request to verified, minus {r['device_delay_ms']:.0f} ms "
          f"of device delay: p50 {r['overhead_ms_p50']:.2f} ms, p99 {r['overhead_ms_p99']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
