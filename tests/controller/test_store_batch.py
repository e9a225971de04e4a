"""The store's batch: many writes, one transaction (a retune of N lasers, ADR 0034)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oddl.controller.store import Store
from oddl.drivers.interfaces import Route


def test_a_batch_commits_all_its_writes_or_none(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.sqlite")
    with pytest.raises(RuntimeError), store.batch():
        store.save_channel("laser0", 3, 1)
        store.add_event(1, "laser0", "tune ch 3", True, "")
        raise RuntimeError("the retune failed half way")
    assert store.verified()[0] == {} and store.events() == []
    store.save_settings({"laser0": 5, "laser1": 6}, {"wss0": {5: Route(2, 0.0)}}, {},
                        ["laser0", "wss0"], 2)
    channels, tables, stamps = store.verified()
    assert channels == {"laser0": 5} and tables == {"wss0": {5: Route(2, 0.0)}}
    assert stamps == {"laser0": 2, "wss0": 2}
    again = Store(tmp_path / "state.sqlite")  # committed: another connection reads it
    assert again.verified()[0] == {"laser0": 5}
    store.close()
    again.close()
