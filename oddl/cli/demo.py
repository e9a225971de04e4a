"""Registers the `oddl demo` command (and `--train`); the demos themselves are `oddl.demo.run` and
`oddl.demo.train`."""

from __future__ import annotations

import argparse


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the emulated four-node testbed end to end (`--train`: PyTorch DDP on digits)."""
    if args.train:
        from oddl.demo.train import run_train

        return run_train(args)
    from oddl.demo.run import run_demo

    return run_demo(args)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `oddl demo`."""
    demo = sub.add_parser("demo", help="run the emulated four-node testbed end to end")
    demo.add_argument("--config", default=None, help="testbed file (default: the emulated "
                      "four-node testbed)")
    demo.add_argument("--iterations", type=int, default=20)
    demo.add_argument("--collective", default=None,
                      help="the all-reduce the demo trains with (default: ring; topoopt on a "
                      "testbed whose hosts' ports go to a circuit switch)")
    demo.add_argument("--params", type=int, default=1_000_000,
                      help="model parameters (gradient elements)")
    demo.add_argument("--run-dir", default=None, help="where logs go (default runs/<time>)")
    demo.add_argument("--json", action="store_true")
    demo.add_argument("--trace", metavar="DIR", help="every process records its timeline "
                      "into DIR/<process>.trace.json (docs/how-to/trace-a-run.md)")
    demo.add_argument("--train", action="store_true", help="train a CNN on scikit-learn's "
                      "digits with PyTorch DDP through the agents, then over gloo as baseline "
                      "(needs the torch extra: pip install '.[torch]')")
    demo.add_argument("--epochs", type=int, default=5, help="epochs with --train")
    demo.add_argument("--backend", choices=["hook", "oddl"], default="hook",
                      help="with --train: hook (DDP over gloo with the optical comm hook) or "
                      "oddl (DDP with no hook over the oddl torch.distributed backend)")
    demo.set_defaults(func=cmd_demo)
