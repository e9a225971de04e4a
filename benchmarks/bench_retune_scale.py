"""The retune of every transmitter at one slot edge, for N transmitters (issue 35).

A slot edge that retunes N lasers is one `DeviceManager.retune` of N channels: the controller
sends every laser its new channel in parallel and waits until each reports locked. Its time
is what the testbed file's `command_ms` must budget (the generated emulated files budget
twice the slowest retune measured, `oddl.launch.shapes.retune_budget_ms`, or with racks
`oddl.launch.racks.rack_budget_ms`). Here N emulated ITLAs (the emulator
host a process of its own, the real driver over its wire protocol) hang on ⌈N/32⌉ WSS of 32 ports;
all N retune at once, --repeats times, to a channel off their current one. Reported: the
wall time, the controller's CPU per retune (what a lab of parallel serial lines would still
pay, in this one process) and the emulator host's CPU (one process for every device: near
100 % means the emulators, not the controller, set the wall time).

With --store the DeviceManager keeps its state in SQLite, as `oddl controller serve --state`
does: every retune then writes each laser's event and verified channel.

With --per-host K the lasers sit in racks of K on device hosts (decision record 0036): one
`oddl devices host` process per rack, each driving its own emulated lasers with the real
driver, and the controller sends one request per rack at the slot edge. Reported besides: the
device hosts' CPU, and one rack's retune alone (what a slot edge costs where each rack has a
machine of its own, as in a lab; here every rack shares the same two cores).

    python benchmarks/bench_retune_scale.py [--sizes 4,16,64,256] [--repeats 5] [--store]
        [--per-host 32] [--json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench_common import emit, percentiles, run_meta
from bench_control_plane import cpu_s

from oddl.common.config import DeviceHostConfig, TestbedConfig, dump_testbed, load_testbed
from oddl.controller.devices import DeviceManager
from oddl.controller.store import Store
from oddl.launch.processes import ProcessGroup, oddl_command
from oddl.launch.shapes import retune_budget_ms
from oddl.launch.testbed import emulators_command

PER_WSS = 32


def wss_bank(n: int) -> str:
    """A testbed file of `n` hosts with a laser each, on ⌈n/32⌉ WSS of 32 ports."""
    out = [f'[testbed]\nname = "retune-{n}"\nseed = 1\n',
           "[grid]\nfirst_thz = 193.1\nspacing_ghz = 100.0\nchannels = 48\n",
           '[controller]\nlisten = "127.0.0.1:0"\n']
    banks = -(-n // PER_WSS)
    for k in range(n):
        out.append(f'[[nodes]]\nid = "n{k}"\nhost = "127.0.0.1"\ntransmitter = "laser{k}"\n'
                   f"rx_channel = {k % PER_WSS + 1}\n")
        out.append(f'[[devices]]\nid = "laser{k}"\nkind = "itla"\nresource = "emulated"\n'
                   "power_dbm = 10.0\npower_range_dbm = [7.0, 13.0]\n")
    for b in range(banks):
        out.append(f'[[devices]]\nid = "wss{b}"\nkind = "wss"\nresource = "emulated"\n'
                   f"ports = {PER_WSS}\nchannels_allowed = [1, 48]\n")
    for k in range(n):
        b, port = divmod(k, PER_WSS)
        out.append(f'[[fibres]]\nfrom = "n{k}.tx"\nto = "wss{b}.in"\n')
        out.append(f'[[fibres]]\nfrom = "wss{b}.{port + 1}"\nto = "n{k}.rx"\n')
    return "\n".join(out)


def start_device_hosts(group: ProcessGroup, path: Path, cfg: TestbedConfig, per_host: int
                       ) -> tuple[TestbedConfig, list[int]]:
    """One `oddl devices host` per rack of `per_host` lasers, each emulating its own lasers
    (from the file at `path`, whose lasers are `emulated`); `cfg` with their addresses, and
    their pids."""
    lasers = [nd.transmitter for nd in cfg.nodes]
    racks = [DeviceHostConfig(f"rack{j}", "127.0.0.1:1", tuple(lasers[i:i + per_host]))
             for j, i in enumerate(range(0, len(lasers), per_host))]
    hosts_file = path.with_suffix(".hosts.toml")
    hosts_file.write_text(dump_testbed(replace(load_testbed(path), device_hosts=tuple(racks))),
                          encoding="utf-8")
    placed = []
    for rack in racks:
        info = group.start(rack.id, oddl_command("devices", "host", "--config", str(hosts_file),
                                                 "--host", rack.id, "--listen", "127.0.0.1:0"),
                           timeout=300)
        placed.append(replace(rack, address=info["address"]))
    return replace(cfg, device_hosts=tuple(placed)), [p.proc.pid for p in group.procs[1:]]


def measure(n: int, repeats: int, workdir: Path, store: bool = False, per_host: int = 0
            ) -> dict[str, Any]:
    path = workdir / f"retune-{n}.toml"
    path.write_text(wss_bank(n), encoding="utf-8")
    resolved = workdir / f"retune-{n}.resolved.toml"
    group = ProcessGroup(workdir)
    group.start("emulators", emulators_command(path, resolved), timeout=300)
    cfg = load_testbed(resolved)
    hosts: list[int] = []
    if per_host:
        cfg, hosts = start_device_hosts(group, path, cfg, per_host)
    dm = DeviceManager(cfg, store=Store(workdir / f"state-{n}.sqlite") if store else None)
    try:
        dm.connect()
        lasers = [nd.transmitter for nd in cfg.nodes]
        for k, tx in enumerate(lasers):
            dm.bring_up(tx, k % PER_WSS + 1)
        emulators = group.procs[0].proc.pid
        c0, e0, h0 = cpu_s(os.getpid()), cpu_s(emulators), sum(cpu_s(p) for p in hosts)
        times = timed_retunes(dm, lasers, repeats, n, 1, f"{n} lasers")
        controller_cpu, emulator_cpu = cpu_s(os.getpid()) - c0, cpu_s(emulators) - e0
        hosts_cpu = sum(cpu_s(p) for p in hosts) - h0
        rack = one_rack(dm, cfg, lasers, repeats, n) if per_host else []
    finally:
        dm.close()
        group.stop_all()
    p = percentiles(times)
    return {"n": n, "retune_p50_ms": round(1e3 * p["p50"], 2),
            "retune_max_ms": round(1e3 * p["max"], 2),
            "controller_cpu_ms": round(1e3 * controller_cpu / repeats, 2),
            "emulator_cpu_pct": round(100 * emulator_cpu / sum(times), 1),
            "budget_ms": retune_budget_ms(n, lab=False), "repeats": repeats, "store": store,
            "per_host": per_host, "hosts_cpu_pct": round(100 * hosts_cpu / sum(times), 1),
            "rack_p50_ms": round(1e3 * percentiles(rack)["p50"], 2) if rack else None,
            "rack_max_ms": round(1e3 * percentiles(rack)["max"], 2) if rack else None}


def one_rack(dm: DeviceManager, cfg: TestbedConfig, lasers: list[str], repeats: int, n: int
             ) -> list[float]:
    """The retune of the first device host's lasers alone, `repeats` times (s each)."""
    rack = [tx for tx in lasers if tx in cfg.device_hosts[0].devices]
    return timed_retunes(dm, rack, repeats, n, 7, "one rack")


def timed_retunes(dm: DeviceManager, lasers: list[str], repeats: int, n: int, shift: int,
                  what: str) -> list[float]:
    """`repeats` retunes of `lasers` at once, each to a channel off the last (`shift` apart
    from another series'); the seconds each took. RuntimeError naming `what` if one fails."""
    times = []
    for r in range(repeats):
        target = {tx: (k + r + shift) % PER_WSS + 1 for k, tx in enumerate(lasers)}
        t0 = time.perf_counter()
        errors = dm.retune(target, timeout=max(1.0, n * 0.05))
        times.append(time.perf_counter() - t0)
        if errors:
            raise RuntimeError(f"retune of {what} failed: {errors[0]}")
    return times


def table(summary: dict[str, Any]) -> list[str]:
    lines = ["retune of all N emulated lasers at one slot edge (DeviceManager.retune)",
             f"{'N':>5} {'p50 ms':>8} {'max ms':>8} {'ctl CPU ms':>10} {'emu CPU %':>9} "
             f"{'command_ms now':>15} {'hosts CPU %':>11} {'1 rack p50/max ms':>18}"]
    for r in summary["results"]:
        rack = (f"{r['rack_p50_ms']:.1f}/{r['rack_max_ms']:.1f}" if r.get("rack_p50_ms")
                else "-")
        lines.append(f"{r['n']:>5} {r['retune_p50_ms']:>8.1f} {r['retune_max_ms']:>8.1f} "
                     f"{r['controller_cpu_ms']:>10.1f} {r['emulator_cpu_pct']:>9.0f} "
                     f"{r['budget_ms']:>15.1f} {r.get('hosts_cpu_pct', 0):>11.0f} {rack:>18}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4,16,64,256", help="lasers (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="retunes per size")
    ap.add_argument("--store", action="store_true", help="keep state in SQLite, as a controller")
    ap.add_argument("--per-host", type=int, default=0, metavar="K",
                    help="lasers on device hosts, K per host (decision record 0036)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="oddl-retune-") as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            results.append(measure(n, args.repeats, Path(tmp), args.store, args.per_host))
            print(f"[retune] {results[-1]}", file=sys.stderr, flush=True)
    return emit(run_meta("retune_scale", results=results), args.json, table)


if __name__ == "__main__":
    sys.exit(main())
