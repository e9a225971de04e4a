"""The lab rig's users: a rig that ends while another is up leaves its users to the last one.

Two rehearsals on one machine share the service user `oddl` and the training user; the rig
that made them may end first. These tests run `remove_rig` with the user commands replaced by
a record of what would be removed (the real ones need root and change the machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import rig, users


@pytest.fixture
def removed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(rig, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(users, "remove_made", lambda made: calls.append(list(made)))
    return calls


def _run_dir(root: Path, pid: int) -> Path:
    folder = root / f"oddl-lab-{pid}"
    folder.mkdir()
    return folder


def test_the_last_rig_removes_what_the_first_made(removed: list[list[str]],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    made = ["user:oddl", "group:oddl"]
    first, second = _run_dir(tmp_path, 101), _run_dir(tmp_path, 102)
    monkeypatch.setattr(rig, "other_live_rigs", lambda own: [second])
    problems = rig.remove_rig(first, [], made)
    assert removed == []  # the second rig still needs them
    assert any("left users" in p and "last rig" in p for p in problems)
    assert not first.exists()
    monkeypatch.setattr(rig, "other_live_rigs", lambda own: [])
    assert rig.remove_rig(second, [], []) == []
    assert [sorted(r) for r in removed] == [sorted(made)]  # the second made nothing, yet removes what the first left
    assert not (tmp_path / users.OWED).exists()


def test_a_lone_rig_removes_its_own_and_nothing_is_owed(removed: list[list[str]],
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    monkeypatch.setattr(rig, "other_live_rigs", lambda own: [])
    rig.remove_rig(_run_dir(tmp_path, 103), [], ["user:oddl-trainer"])
    assert removed == [["user:oddl-trainer"]]
    rig.remove_rig(_run_dir(tmp_path, 104), [], [])
    assert removed == [["user:oddl-trainer"]]  # nothing left over to remove twice


def test_owed_users_accumulate_and_a_torn_ledger_is_ignored(tmp_path: Path) -> None:
    users.owe(["user:oddl"], tmp_path)
    users.owe(["user:oddl-trainer", "user:oddl"], tmp_path)
    assert sorted(users.take_owed(tmp_path)) == ["user:oddl", "user:oddl-trainer"]
    assert users.take_owed(tmp_path) == []
    (tmp_path / users.OWED).write_text("[\"user:od", encoding="utf-8")
    assert users.take_owed(tmp_path) == []
