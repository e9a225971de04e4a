"""`oddl topoopt`: choose a job's parallelisation strategy and its topology together (TopoOpt).

    oddl topoopt --model dlrm --nodes 128 --degree 4 --gbps 100
    oddl topoopt --model vgg19 --nodes 16 --degree 4 --gbps 100 --budget 1000 --seed 2 --json
    oddl topoopt --model-file my-model.toml --nodes 64 --degree 4 --gbps 25
    oddl topoopt --model vgg19 --nodes 128 --strategy fc6=4,fc7=4     # evaluate, no search
    oddl topoopt --model dlrm-topoopt --nodes 128 --degree 4 --sweep-bandwidth paper
    oddl topoopt --model dlrm --search ours --rings ours --matching ours --routing ours
    oddl topoopt --list-models

Reports the chosen strategy (a model-parallel degree per layer group), the topology (ring
jumps per all-reduce group size, model-parallel matchings), the predicted iteration time and
the speed-up against a fat-tree of similar cost and against plain data parallelism on
TotientPerms rings. ``--gbps`` is the rate of EACH of the ``--degree`` interfaces (TopoOpt's
convention; `oddl simulate` gives a node ``--gbps`` in total). Progress goes to stderr.
Assumptions: docs/explanation/topoopt.md.

Exit codes: 0 ok, 2 bad input (unknown model, a model file with missing fields, a degree
beyond the transceivers, N a strategy cannot split).

Wire it into a command tree with ``register(subparsers)``; ``main(argv)`` runs it alone.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from oddl.cli.exit_codes import EXIT_OK, EXIT_USAGE
from oddl.cli.shared import json_default, run_alone
from oddl.common.errors import OddlError


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``topoopt`` command to an argparse subparsers object and return its parser."""
    p = subparsers.add_parser(
        "topoopt", help="co-optimise a job's parallelisation strategy and topology (TopoOpt)",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_topoopt)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the topoopt options to a parser."""
    from oddl.offline.topoopt.search_config import DEFAULT_BUDGET

    job = p.add_argument_group("job")
    job.add_argument("--model", help="shipped model (see --list-models)")
    job.add_argument("--model-file", metavar="F", help="model file (TOML or JSON, see "
                     "docs/explanation/topoopt.md); overrides --model")
    job.add_argument("--nodes", type=int, default=128, metavar="N", help="nodes [128]")
    job.add_argument("--strategy", metavar="G=M,...", help="evaluate this strategy instead of "
                     "searching: 'dp' or group=degree pairs, e.g. fc6=4,fc7=4")
    job.add_argument("--list-models", action="store_true", help="list the shipped models")
    net = p.add_argument_group("network")
    net.add_argument("--degree", type=int, default=4, metavar="D",
                     help="interfaces per node [4]")
    net.add_argument("--gbps", type=float, default=100.0, metavar="B",
                     help="rate of each interface, Gbit/s [100]")
    net.add_argument("--transceivers", type=int, default=8, metavar="T",
                     help="transceivers each node has; the degree cannot exceed it [8]")
    net.add_argument("--ft-gbps", type=float, default=0.0, metavar="B",
                     help="host rate of the fat-tree baseline [0: the similar-cost rate]")
    net.add_argument("--latency-us", type=float, default=1.0, help="latency per step, µs [1]")
    net.add_argument("--overlap", type=float, default=0.0,
                     help="fraction of the backward pass hiding the all-reduce, 0..1 [0]")
    net.add_argument("--memory-gb", type=float, default=40.0,
                     help="parameter-state memory per node, GB [40]")
    search = p.add_argument_group("search")
    search.add_argument("--budget", type=int, default=DEFAULT_BUDGET, metavar="K",
                        help=f"annealing iterations [{DEFAULT_BUDGET}]")
    search.add_argument("--seed", type=int, default=1, metavar="S", help="random seed [1]")
    search.add_argument("--max-mp", type=int, default=0, metavar="M",
                        help="largest model-parallel degree tried [0: N]")
    search.add_argument("--split", choices=("proportional", "all-dp"), default="proportional",
                        help="degree split between all-reduce and model-parallel links")
    search.add_argument("--search", choices=("authors", "ours"), default="authors",
                        help="search semantics: the authors' rebuild policy or ours [authors]")
    search.add_argument("--rings", choices=("authors", "ours"), default="authors",
                        help="ring allocation among all-reduce groups [authors]")
    search.add_argument("--matching", choices=("authors", "ours"), default="authors",
                        help="model-parallel links: perfect matchings on the complete graph "
                        "(authors) or maximum-weight matchings on the demand (ours) [authors]")
    search.add_argument("--routing", choices=("authors", "ours"), default="authors",
                        help="model-parallel routing: one shortest path per pair (authors) or "
                        "split over equal-cost next hops (ours) [authors]")
    search.add_argument("--lookahead", action="store_true",
                        help="with --search ours: also try rejected moves on their own "
                        "topology (slower)")
    search.add_argument("--sweep-bandwidth", metavar="B,B,...",
                        help="run the co-optimisation at each interface rate (Gbit/s, or "
                        "'paper' for 10,25,40,100,200) and tabulate it against the fat-trees")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oddl topoopt`` with `argv` (without the command name); return the exit code."""
    return run_alone("oddl topoopt", __doc__, add_arguments, cmd_topoopt, argv)


def cmd_topoopt(args: argparse.Namespace) -> int:
    """The ``oddl topoopt`` command."""
    from oddl.offline.topoopt.evaluation import NetParams
    from oddl.offline.topoopt.job_model import Memory, parse_strategy
    from oddl.offline.topoopt.search import co_optimise, evaluate_strategy
    from oddl.offline.topoopt.search_config import SearchConfig, SearchProgress

    def progress(p: SearchProgress) -> None:
        print(f"topoopt: {p.network}: iteration {p.iteration}/{p.budget}, best "
              f"{p.best_s * 1e3:.3f} ms, {p.accepted} accepted, {p.topologies} topologies "
              f"({p.elapsed_s:.1f} s)", file=sys.stderr, flush=True)

    try:
        if args.list_models:
            return _list_models(args.json)
        model = _model(args)
        if not 0.0 <= args.overlap <= 1.0:
            raise OddlError(f"--overlap must be in [0, 1]; got {args.overlap}")
        if not (math.isfinite(args.latency_us) and args.latency_us >= 0):
            raise OddlError(f"--latency-us must be >= 0; got {args.latency_us}")
        cfg = SearchConfig(nodes=args.nodes, degree=args.degree, gbps=args.gbps,
                           transceivers=args.transceivers, budget=args.budget, seed=args.seed,
                           split=args.split, search=args.search, rings=args.rings,
                           matching=args.matching, routing=args.routing,
                           lookahead=args.lookahead, max_mp=args.max_mp,
                           ft_gbps=args.ft_gbps, memory=Memory(gb=args.memory_gb),
                           net=NetParams(latency_us=args.latency_us, overlap=args.overlap))
        cfg.validate()
        if args.sweep_bandwidth:
            return _sweep(args, model, cfg, progress)
        if args.strategy:
            result = evaluate_strategy(model, cfg, parse_strategy(model, args.strategy,
                                                                  args.nodes))
        else:
            result = co_optimise(model, cfg, None if args.quiet else progress)
    except OddlError as exc:
        print(f"oddl topoopt: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(result.as_dict(), default=json_default) if args.json
          else format_result(result, searched=not args.strategy))
    return EXIT_OK


def _sweep(args: argparse.Namespace, model: Any, cfg: Any, progress: Any) -> int:
    from oddl.offline.topoopt.sweep import (
        format_sweep,
        parse_rates,
        sweep_as_dict,
        sweep_bandwidth,
    )

    if args.strategy:
        raise OddlError("--sweep-bandwidth searches at every rate; drop --strategy")
    rates = parse_rates(args.sweep_bandwidth)
    note = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    results = sweep_bandwidth(model, cfg, rates, note)
    print(json.dumps(sweep_as_dict(results), default=json_default) if args.json
          else format_sweep(results))
    return EXIT_OK


def _model(args: argparse.Namespace) -> Any:
    from oddl.offline.topoopt.model_files import load_model_file
    from oddl.offline.topoopt.model_zoo import get_model

    if args.model_file:
        return load_model_file(args.model_file)
    if not args.model:
        raise OddlError("give --model NAME (see --list-models) or --model-file FILE")
    return get_model(args.model)


def _list_models(as_json: bool) -> int:
    from oddl.offline.topoopt.model_zoo import MODELS

    if as_json:
        print(json.dumps({"models": [m.as_dict() for m in MODELS.values()]}))
        return EXIT_OK
    print(f"{'model':14} {'parameters':>15} {'groups':>6} {'batch':>6} {'compute ms':>11}")
    for m in MODELS.values():
        print(f"{m.name:14} {m.params:>15,} {len(m.groups):>6} {m.batch:>6} "
              f"{m.compute_s * 1e3:>11.2f}")
        print(f"{'':14} groups: {', '.join(g.name for g in m.groups)}")
    print("sources and assumptions: docs/explanation/topoopt.md")
    return EXIT_OK


def format_result(r: Any, searched: bool = True) -> str:
    """The co-optimisation for people."""
    from oddl.offline.topoopt.job_model import describe

    m, cfg, best = r.model, r.config, r.topoopt
    topo = best.topology
    st = r.stats
    lines = [
        f"oddl topoopt — {m.name}: {m.params:,} parameters in {len(m.groups)} groups, batch "
        f"{m.batch} per node; {cfg.nodes} nodes, degree {cfg.degree} × {cfg.gbps:g} Gbit/s",
    ]
    if searched:
        how = (f"seed {cfg.seed}, {cfg.search} search"
               + (", lookahead" if cfg.lookahead else ""))
        lines.append(
            f"search: {st.iterations} iterations ({how}) in {st.elapsed_s:.1f} s; "
            f"{st.topologies_built} topologies built, {st.rebuilds} rebuilds, {st.accepted} "
            f"moves accepted, best found at iteration {st.best_at}")
    else:
        lines.append("strategy given (no search)")
    lines += ["", f"strategy: {describe(m, best.strategy)}",
              f"  {'group':14}{'kind':>10}{'parameters':>16}{'degree':>8}"]
    for g, d in zip(m.groups, best.strategy, strict=True):
        how = "data parallel" if d == 1 else f"sharded over {d}"
        lines.append(f"  {g.name:14}{g.kind:>10}{g.params:>16,}{d:>8}  {how}")
    lines += ["", f"topology: {topo.d_ar} all-reduce + {topo.d_mp} model-parallel interfaces per "
              f"node ({topo.interfaces_used} of {cfg.degree} wired); diameter {topo.diameter}"]
    rings = "; ".join(f"groups of {cfg.nodes // k}: {', '.join(map(str, j))}"
                      for k, j in sorted(topo.ring_jumps.items())) or "none"
    lines.append(f"  ring jumps (i → i+p): {' '.join(map(str, topo.jumps))} ({rings})")
    if topo.matchings:
        first = " ".join(f"{a}-{b}" for a, b in topo.matchings[0][:6])
        lines.append(f"  matchings: {len(topo.matchings)} rounds of {len(topo.matchings[0])} "
                     f"pairs, repeating every {topo.period} nodes (round 1: {first} …)")
    b = best.breakdown
    lines += ["", f"predicted iteration: {b.iteration_s * 1e3:.2f} ms = compute "
              f"{b.compute_s * 1e3:.2f} + model-parallel {b.mp_s * 1e3:.2f} + all-reduce "
              f"{b.allreduce_s * 1e3:.2f} + reduce {b.reduce_s * 1e3:.2f}"
              + (f" − hidden {b.hidden_s * 1e3:.2f}" if b.hidden_s else ""), ""]
    rows = [("TopoOpt (co-optimised)", best),
            ("data parallel on TotientPerms rings", r.dp_rings),
            (f"fat-tree, similar cost ({r.fat_tree.gbps:.1f} Gbit/s)", r.fat_tree),
            ("  same, data parallel", r.fat_tree_dp),
            (f"fat-tree, equal bandwidth ({r.fat_tree_equal_bw.gbps:g} Gbit/s)",
             r.fat_tree_equal_bw)]
    lines.append(f"{'network':44}{'strategy':30}{'iteration ms':>13}{'TopoOpt ×':>11}")
    for label, o in rows:
        strat = describe(m, o.strategy)
        strat = strat if len(strat) <= 28 else strat[:27] + "…"
        ratio = o.iteration_s / best.iteration_s
        lines.append(f"{label:44}{strat:30}{o.iteration_s * 1e3:>13.2f}{ratio:>10.2f}×")
    lines += ["", f"speed-up: {r.speedup_vs_fat_tree:.2f}× vs the similar-cost fat-tree, "
              f"{r.speedup_vs_dp_rings:.2f}× vs data parallel on TotientPerms rings "
              "(paper: up to 3.4×, 3× for DLRM, vs a similar-cost fat-tree; docs/explanation/topoopt.md "
              "compares)"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
