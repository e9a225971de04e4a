"""The registry of collectives: builders by name (`register_collective`, `make_plan`).

A builder is ``f(n_ranks, n_elems, **params) -> Plan`` (`oddl.controller.scheduling.plan`);
`check_sizes` is the argument check every builder starts with. Pure.
"""

from __future__ import annotations

import difflib
import inspect
import operator
from collections.abc import Callable

from oddl.common.errors import PlanError
from oddl.controller.scheduling.plan import Plan

CollectiveBuilder = Callable[..., Plan]
"""``f(n_ranks, n_elems, **params) -> Plan``."""

COLLECTIVES: dict[str, CollectiveBuilder] = {}
"""Registered collectives by name; add one with `register_collective`."""


def register_collective(name: str) -> Callable[[CollectiveBuilder], CollectiveBuilder]:
    """Register a plan builder under `name` (a decorator)."""

    def add(fn: CollectiveBuilder) -> CollectiveBuilder:
        if name in COLLECTIVES:
            raise PlanError(f"collective {name!r} is already registered; pick another name")
        COLLECTIVES[name] = fn
        return fn

    return add


def make_plan(name: str, n_ranks: int, n_elems: int, /, **params: object) -> Plan:
    """Build the plan of the collective registered as `name`."""
    fn = COLLECTIVES.get(name)
    if fn is None:
        close = difflib.get_close_matches(name, COLLECTIVES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise PlanError(
            f"unknown collective {name!r}; {hint}known: {', '.join(sorted(COLLECTIVES))}"
        )
    try:
        inspect.signature(fn).bind(n_ranks, n_elems, **params)
    except TypeError as exc:
        accepted = [p for p in list(inspect.signature(fn).parameters)[2:]]
        raise PlanError(
            f"collective {name!r} does not take parameters {sorted(params)}; it takes "
            f"{accepted or 'none'} ({exc})"
        ) from None
    return fn(n_ranks, n_elems, **params)


def check_sizes(name: str, n_ranks: int, n_elems: int) -> tuple[int, int]:
    """(n_ranks, n_elems) as ints, or PlanError naming collective `name` and the bad value."""
    try:
        n, e = operator.index(n_ranks), operator.index(n_elems)
    except TypeError:
        raise PlanError(
            f"{name} needs integer n_ranks and n_elems; got {n_ranks!r} and {n_elems!r}"
        ) from None
    if n < 1:
        raise PlanError(f"{name} needs at least 1 rank; got {n}")
    if e < 0:
        raise PlanError(f"{name} needs n_elems >= 0; got {e}")
    return n, e
