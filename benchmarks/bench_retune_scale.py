"""The retune of every transmitter at one slot edge, for N transmitters (issue 35).

A slot edge that retunes N lasers is one `DeviceManager.retune` of N channels: the controller
sends every laser its new channel in parallel and waits until each reports locked. Its time
is what the testbed file's `command_ms` must budget (the emulated files budget
8 + (N − 4) ms, `oddl.launch.shapes.retune_budget_ms`). Here N emulated ITLAs (the emulator
host a process of its own, the real driver over its wire protocol) hang on ⌈N/32⌉ WSS of 32 ports;
all N retune at once, --repeats times, to a channel off their current one. Reported: the
wall time, the controller's CPU per retune (what a lab of parallel serial lines would still
pay, in this one process) and the emulator host's CPU (one process for every device: near
100 % means the emulators, not the controller, set the wall time).

With --store the DeviceManager keeps its state in SQLite, as `oddl controller serve --state`
does: every retune then writes each laser's event and verified channel.

    python benchmarks/bench_retune_scale.py [--sizes 4,16,64,256] [--repeats 5] [--store] [--json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import emit, percentiles, run_meta
from bench_control_plane import cpu_s

from oddl.common.config import load_testbed
from oddl.controller.devices import DeviceManager
from oddl.controller.store import Store
from oddl.launch.processes import ProcessGroup
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


def measure(n: int, repeats: int, workdir: Path, store: bool = False) -> dict[str, Any]:
    path = workdir / f"retune-{n}.toml"
    path.write_text(wss_bank(n), encoding="utf-8")
    resolved = workdir / f"retune-{n}.resolved.toml"
    group = ProcessGroup(workdir)
    group.start("emulators", emulators_command(path, resolved), timeout=300)
    cfg = load_testbed(resolved)
    dm = DeviceManager(cfg, store=Store(workdir / f"state-{n}.sqlite") if store else None)
    try:
        dm.connect()
        lasers = [nd.transmitter for nd in cfg.nodes]
        for k, tx in enumerate(lasers):
            dm.bring_up(tx, k % PER_WSS + 1)
        times = []
        emulators = group.procs[-1].proc.pid
        c0, e0 = cpu_s(os.getpid()), cpu_s(emulators)
        for r in range(repeats):
            target = {tx: (k + r + 1) % PER_WSS + 1 for k, tx in enumerate(lasers)}
            t0 = time.perf_counter()
            errors = dm.retune(target, timeout=max(1.0, n * 0.05))
            times.append(time.perf_counter() - t0)
            if errors:
                raise RuntimeError(f"retune of {n} lasers failed: {errors[0]}")
        controller_cpu, emulator_cpu = cpu_s(os.getpid()) - c0, cpu_s(emulators) - e0
    finally:
        dm.close()
        group.stop_all()
    p = percentiles(times)
    return {"n": n, "retune_p50_ms": round(1e3 * p["p50"], 2),
            "retune_max_ms": round(1e3 * p["max"], 2),
            "controller_cpu_ms": round(1e3 * controller_cpu / repeats, 2),
            "emulator_cpu_pct": round(100 * emulator_cpu / sum(times), 1),
            "budget_ms": retune_budget_ms(n, lab=False), "repeats": repeats, "store": store}


def table(summary: dict[str, Any]) -> list[str]:
    lines = ["retune of all N emulated lasers at one slot edge (DeviceManager.retune)",
             f"{'N':>5} {'p50 ms':>8} {'max ms':>8} {'ctl CPU ms':>10} {'emu CPU %':>9} "
             f"{'command_ms now':>15}"]
    for r in summary["results"]:
        lines.append(f"{r['n']:>5} {r['retune_p50_ms']:>8.1f} {r['retune_max_ms']:>8.1f} "
                     f"{r['controller_cpu_ms']:>10.1f} {r['emulator_cpu_pct']:>9.0f} "
                     f"{r['budget_ms']:>15.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4,16,64,256", help="lasers (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="retunes per size")
    ap.add_argument("--store", action="store_true", help="keep state in SQLite, as a controller")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="oddl-retune-") as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            results.append(measure(n, args.repeats, Path(tmp), args.store))
            print(f"[retune] {results[-1]}", file=sys.stderr, flush=True)
    return emit(run_meta("retune_scale", results=results), args.json, table)


if __name__ == "__main__":
    sys.exit(main())
