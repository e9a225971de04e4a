"""The lab procedure is written once: every command the rehearsal runs (`lab/procedure.py`) is
on docs/how-to/lab-bring-up.md verbatim, and torch-backend.md launches torchrun the same way
(issue 34: two procedures on one page disagreed, and a torchrun form hung)."""

from __future__ import annotations

from pathlib import Path

from lab.procedure import elastic_shown, page_commands, shown, torchrun

DOCS = Path(__file__).resolve().parents[2] / "docs" / "how-to"


def _code(page: str) -> str:
    """The page's text."""
    return (DOCS / page).read_text(encoding="utf-8")


def test_every_command_the_rig_runs_is_on_the_page() -> None:
    page = _code("lab-bring-up.md")
    missing = [c for c in page_commands() if c not in page]
    assert not missing, f"lab-bring-up.md lacks the rig's commands: {missing}"


def test_the_page_is_one_procedure() -> None:
    page = _code("lab-bring-up.md")
    assert page.count("useradd") == 1, "one way to make the service user"
    assert "The same path" not in page
    assert "--rdzv-endpoint HOST" not in page


def test_torchrun_is_launched_the_same_way_on_both_pages() -> None:
    form = shown(torchrun(4, 0, "N0_ADDRESS")).replace("--node-rank 0", "--node-rank R")
    assert form in _code("lab-bring-up.md")
    assert form in _code("torch-backend.md")
    assert elastic_shown() in _code("lab-bring-up.md")
    assert elastic_shown() in _code("torch-backend.md")
    assert "--rdzv-endpoint HOST:PORT train.py" not in _code("torch-backend.md")
