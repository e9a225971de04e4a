"""Device hosts in a generated testbed file (`oddl config new --rack K`, decision record 0036):
every K consecutive lasers of ODDL's shape on one `oddl devices host` (``rack0``, ``rack1``,
…), and the ``command_ms`` that budgets one request per rack instead of every laser from the
controller. Pure text and arithmetic; `oddl.launch.shapes` puts it into the file."""

from __future__ import annotations

import math

RACK_RETUNE_MEASURED_MS: dict[int, tuple[tuple[int, float], ...]] = {
    8: ((16, 27.5), (32, 47.5), (48, 24.6)),
    16: ((16, 24.6), (32, 43.6), (48, 46.3)),
}
"""The slowest retune (ms, the max column, not p50) of N emulated lasers at one slot edge
through device hosts of K lasers each, by K, as (N, ms): `python
benchmarks/bench_retune_scale.py --sizes 16,32,48 --repeats 7 --per-host K` for K = 8 and 16
on the shared 2-vCPU VM, 2026-11-29 01:28 UTC, load average 4.3-4.8 (other engineers' jobs;
docs/results.md, "One controller for a thousand agents"). Every rack's host shares the same
two cores here, so the maxima are noisy (K = 8: 24.6 ms at 48 against 47.5 at 32)."""

LAB_ROUND_TRIP_MS = 5.0
"""One ITLA round trip on a 9600-baud serial line (the lab rule of `retune_budget_ms`)."""
LAB_FAN_OUT_MS = 5.0
"""The controller's one request per rack and its reply over the LAN (not measured)."""


def check_rack(rack: int | None, lasers: int, ports: int) -> str:
    """Why `--rack` cannot be written for this shape ("" if it can, or is not asked for)."""
    if rack is None:
        return ""
    if ports:
        return (f"--rack {rack}: TopoOpt's shape (--ports) has no tunable lasers to put on "
                "device hosts (its circuit switch stays with the controller); drop --rack, or "
                "drop --ports for ODDL's shape")
    if not 1 <= rack <= lasers:
        return (f"--rack {rack}: a rack holds 1 to {lasers} lasers (one a host, --hosts "
                f"{lasers}); give --rack a size in that range, e.g. --rack {min(16, lasers)}")
    return ""


def racks(lasers: int, rack: int) -> list[list[int]]:
    """The lasers' indices, K consecutive a rack (the last rack may hold fewer)."""
    return [list(range(j, min(j + rack, lasers))) for j in range(0, lasers, rack)]


def measured_rack_retune_ms(lasers: int, rack: int) -> float:
    """The slowest racked retune of `lasers` at racks of `rack`, from
    `RACK_RETUNE_MEASURED_MS`, rounded up on both axes: the largest time measured at any size
    up to the first measured size of at least `lasers` (the largest size beyond it), for the
    measured K either side of `rack` (the nearer one beyond the measured range), whichever is
    larger. A step that never falls as N grows, however noisy the maxima."""
    sizes = sorted(RACK_RETUNE_MEASURED_MS)
    below = [k for k in sizes if k <= rack] or sizes[:1]
    above = [k for k in sizes if k >= rack] or sizes[-1:]
    return max(_up_to(RACK_RETUNE_MEASURED_MS[below[-1]], lasers),
               _up_to(RACK_RETUNE_MEASURED_MS[above[0]], lasers))


def _up_to(points: tuple[tuple[int, float], ...], lasers: int) -> float:
    first_above = next((i for i, (n, _) in enumerate(points) if n >= lasers), len(points) - 1)
    return max(t for _, t in points[:first_above + 1])


def rack_budget_ms(lasers: int, rack: int, lab: bool) -> float:
    """``command_ms`` with device hosts: the hand-off and one retune request per rack.
    Emulated: twice the slowest racked retune measured (`measured_rack_retune_ms`). Lab: one
    rack's serial round trips (the lab rule of `retune_budget_ms` for K lasers instead of N:
    20 ms, and 5 ms a laser past four) plus `LAB_FAN_OUT_MS` for the controller's request to
    each rack, every rack on a machine of its own; not measured here."""
    if lab:
        return 20.0 + LAB_ROUND_TRIP_MS * max(0, rack - 4) + LAB_FAN_OUT_MS
    return float(math.ceil(2.0 * measured_rack_retune_ms(lasers, rack)))


def device_hosts_toml(lasers: int, rack: int, lab: bool) -> str:
    """The ``[[device_hosts]]`` entries: rack j drives lasers K·j … K·j + K − 1."""
    if lab:
        head = (f"# Device hosts: every {rack} lasers on their rack's machine, which drives "
                "their serial lines\n# for the controller (one request per rack at a slot "
                "edge; docs/how-to/lab-bring-up.md).\n# On rack0's machine (rack1's, ... "
                "likewise), before the controller starts:\n"
                "#   /opt/oddl/.venv/bin/oddl devices host --config /etc/oddl/testbed.toml "
                "--host rack0 \\\n#       --listen 0.0.0.0:7100 --insecure\n"
                "# (--insecure: its address is on the control network, and its wire is not "
                "authenticated;\n# keep that network to the controller.) `oddl devices "
                "probe` on that machine checks its\n# lasers first. Edit each address to "
                "where the controller reaches the rack's machine.\n")
    else:
        head = (f"# Device hosts: every {rack} lasers on one `oddl devices host` process (one "
                "request per rack\n# at a slot edge); the launcher starts one per entry and "
                "writes the loopback port it\n# listens on into the resolved file, so these "
                "ports are placeholders.\n")
    out = [head]
    for j, members in enumerate(racks(lasers, rack)):
        address = (f'"10.0.1.{1 + j}:7100"    # the rack\'s machine, where its device host '
                   "listens" if lab else f'"127.0.0.1:{7100 + j}"')
        names = ", ".join(f'"laser{k}"' for k in members)
        out.append(f'[[device_hosts]]\nid = "rack{j}"\naddress = {address}\n'
                   f"devices = [{names}]\n")
    return "\n".join(out)
