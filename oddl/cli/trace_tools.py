"""`oddl trace merge | summary | plot`: reading recorded timelines (docs/how-to/read-a-trace.md)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from oddl.cli.exit_codes import EXIT_OK


def register(sub: Any) -> Any:
    """Add the `trace` command group: the recording switch (`start`, `stop`:
    oddl/cli/trace_switch.py) and the readers; return its sub-parsers."""
    from oddl.cli.trace_switch import add_switch_commands

    trace = sub.add_parser("trace", help="record, merge, summarise and plot timelines "
                           "(Chrome trace JSON, Perfetto)")
    group = trace.add_subparsers(dest="trace_cmd", required=True)
    add_switch_commands(group)
    register_readers(group)
    return group


def register_readers(group: Any) -> None:
    """`merge`, `summary` and `plot` under an existing `trace` group."""
    merge = group.add_parser(
        "merge", help="merge oddl trace files and PyTorch profiler traces onto one time axis",
        description="oddl trace merge runs/trace -o runs/trace/timeline.json "
                    "[rank0_profile.json ...]")
    merge.add_argument("inputs", nargs="+", metavar="DIR|FILE",
                       help="a directory (its *.trace.json files) or trace files, including "
                            "torch.profiler export_chrome_trace() files")
    merge.add_argument("-o", "--out", required=True, help="the merged Chrome trace to write")
    merge.add_argument("--json", action="store_true", help="print what was merged as JSON")
    merge.set_defaults(func=cmd_merge)
    summary = group.add_parser("summary", help="gate error, utilisation, guard time and "
                               "faults per collective and slot")
    summary.add_argument("file", metavar="FILE|DIR", help="a merged timeline, one process's "
                         "trace, or a trace directory (merged in memory)")
    summary.add_argument("--testbed", metavar="TOML",
                         help="refuse a trace recorded against another testbed file")
    summary.add_argument("--json", action="store_true")
    summary.set_defaults(func=cmd_summary)
    plot = group.add_parser("plot", help="per node: circuits, wavelengths, slots, data moved "
                            "and retunes over time (PNG)")
    plot.add_argument("file", metavar="FILE|DIR")
    plot.add_argument("--out", required=True, help="the PNG to write")
    plot.add_argument("--testbed", metavar="TOML",
                      help="refuse a trace recorded against another testbed file")
    plot.add_argument("--job", help="only this job (its id, as the summary prints it)")
    plot.add_argument("--seq", type=int, help="only this collective sequence number")
    plot.add_argument("--title", default="")
    plot.add_argument("--json", action="store_true")
    plot.set_defaults(func=cmd_plot)


def _check_testbed(doc: dict[str, Any], source: str, testbed: str | None) -> None:
    if not testbed:
        return
    from oddl.trace.files import TraceFileError

    try:
        digest = hashlib.sha256(Path(testbed).read_bytes()).hexdigest()
    except OSError as exc:
        raise TraceFileError(f"{testbed}: cannot read the testbed file ({exc.strerror}); "
                             "give the path of the TOML the run used") from None
    recorded = str(doc.get("oddl", {}).get("testbed_sha256", ""))
    if recorded != digest:
        raise TraceFileError(
            f"{source}: recorded on another testbed (testbed file sha256 {recorded[:12] or '?'}"
            f"…) than {testbed} ({digest[:12]}…); give the testbed file of that run, or "
            "leave --testbed out")


def cmd_merge(args: argparse.Namespace) -> int:
    """Merge, write atomically, say what went in (and what the recorders dropped)."""
    from oddl.trace.merge import merge_paths, write_json

    doc = merge_paths(args.inputs)
    write_json(doc, args.out)
    head = doc["oddl"]
    report = {"out": args.out, "events": len(doc["traceEvents"]),
              "base_time_ns": doc["baseTimeNanoseconds"], "dropped": head["dropped"],
              "sources": [{k: s.get(k) for k in ("file", "process", "kind", "shift_us",
                                                 "dropped")} for s in head["sources"]]}
    if args.json:
        print(json.dumps(report))
        return EXIT_OK
    print(f"{args.out}: {report['events']} events from {len(head['sources'])} files")
    for s in report["sources"]:
        print(f"  {s['file']} ({s['process']}, {s['kind']}): shifted {s['shift_us']:+,.3f} µs")
    if head["dropped"]:
        print(f"warning: the recorders dropped {head['dropped']} events (their buffers were "
              "full); the timeline misses them", file=sys.stderr)
    return EXIT_OK


def cmd_summary(args: argparse.Namespace) -> int:
    """Print the summary (text or --json)."""
    from oddl.trace.merge import timeline_of
    from oddl.trace.summary import summarise
    from oddl.trace.summary_text import format_summary

    doc = timeline_of(args.file)
    _check_testbed(doc, args.file, args.testbed)
    summary = summarise(doc)
    print(json.dumps(summary) if args.json else format_summary(summary, args.file))
    return EXIT_OK


def cmd_plot(args: argparse.Namespace) -> int:
    """Draw the timeline into a PNG."""
    from oddl.trace.files import TraceFileError
    from oddl.trace.merge import timeline_of
    from oddl.trace.plot import plot_timeline, select

    doc = timeline_of(args.file)
    _check_testbed(doc, args.file, args.testbed)
    try:
        doc = select(doc, args.job, args.seq)
    except ValueError as exc:
        raise TraceFileError(f"{args.file}: {exc}; pick one of them with --job/--seq") from None
    rows = plot_timeline(doc, args.out, args.title)
    if args.json:
        print(json.dumps({"out": args.out, "nodes": rows}))
    else:
        print(f"{args.out}: {rows} node rows")
    return EXIT_OK
