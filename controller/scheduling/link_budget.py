"""The insertion-loss budget of one lightpath on an optical ring (WRHT's feasibility check).

`LinkBudget` holds the losses and powers; `link_budget` evaluates a path that passes `h`
intermediate nodes (`BudgetCheck`). Used by `oddl.controller.scheduling.wrht`. Pure.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from oddl.common.errors import PlanError


@dataclass(frozen=True)
class LinkBudget:
    """Insertion-loss budget of one lightpath from a member to its root (dB, dBm, km).

    A path that passes `h` intermediate nodes crosses h+1 fibre spans and loses
    ``il_mod + il_drop + h·il_through + (h+1)·span_km·alpha_db_per_km + il_cpl`` dB; it works
    when ``p_tx − loss ≥ s_rx + margin``.

    Defaults [reconstruction]: the ring values of docs/sources.md §2 at their pessimistic end
    (drop 1 dB, pass-through 0.02 dB per node) with fibre spans of 10 m at 0.25 dB/km instead
    of on-chip waveguide; an ITLA-class laser (10 dBm), a 4 dB modulator, 3 dB of
    fibre-to-chip coupling, a −18 dBm receiver and a 3 dB margin. Keep them configurable.
    """

    p_tx_dbm: float = 10.0
    il_mod_db: float = 4.0
    il_drop_db: float = 1.0
    il_through_db: float = 0.02
    il_cpl_db: float = 3.0
    span_km: float = 0.01
    alpha_db_per_km: float = 0.25
    s_rx_dbm: float = -18.0
    margin_db: float = 3.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not math.isfinite(value):
                raise PlanError(f"link budget {name} must be finite; got {value}")
        for name in (
            "il_mod_db",
            "il_drop_db",
            "il_through_db",
            "il_cpl_db",
            "span_km",
            "alpha_db_per_km",
            "margin_db",
        ):
            if getattr(self, name) < 0:
                raise PlanError(f"link budget {name} must be >= 0; got {getattr(self, name)}")

    @property
    def required_dbm(self) -> float:
        """Lowest received power that works: receiver sensitivity plus margin."""
        return self.s_rx_dbm + self.margin_db

    def loss_db(self, hops: int) -> float:
        """Return the insertion loss of a path passing `hops` intermediate nodes."""
        return (
            self.il_mod_db
            + self.il_drop_db
            + hops * self.il_through_db
            + (hops + 1) * self.span_km * self.alpha_db_per_km
            + self.il_cpl_db
        )

    def max_hops(self) -> int | None:
        """Return the most intermediate nodes a path may pass (None: unbounded; −1: none works)."""
        per_hop = self.il_through_db + self.span_km * self.alpha_db_per_km
        spare = self.p_tx_dbm - self.required_dbm - self.loss_db(0)
        if spare < 0:
            return -1
        return None if per_hop == 0 else math.floor(spare / per_hop + 1e-9)


@dataclass(frozen=True)
class BudgetCheck:
    """The link budget evaluated for one path length."""

    hops: int
    loss_db: float
    rx_dbm: float
    required_dbm: float

    @property
    def slack_db(self) -> float:
        """Received power above the requirement (negative: the path fails)."""
        return self.rx_dbm - self.required_dbm

    @property
    def ok(self) -> bool:
        """Whether the path closes."""
        return self.slack_db >= -1e-12


def link_budget(hops: int, budget: LinkBudget | None = None) -> BudgetCheck:
    """Check ``P_tx − (IL_mod + IL_drop + h·IL_through + L·α + IL_cpl) ≥ S_rx + margin``."""
    b = budget or LinkBudget()
    h = operator.index(hops)
    if h < 0:
        raise PlanError(f"a path passes >= 0 intermediate nodes; got {h}")
    loss = b.loss_db(h)
    return BudgetCheck(h, loss, b.p_tx_dbm - loss, b.required_dbm)
