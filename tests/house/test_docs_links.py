"""The docs hold together: every local link in the markdown resolves, and every `docs/...` path
that code, tests, tooling or docs name exists (a moved page breaks here, not for a reader)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
"""The target of a markdown link or image: `[text](target)`."""

DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*[\w/]")
"""A path into docs/ as code, tests, tooling and prose name it (`docs/explanation/clocks.md`)."""


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                            check=False)
    if listed.returncode != 0:  # not a git checkout (an sdist): walk the tree instead
        return [p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts
                and ".venv" not in p.parts]
    return [ROOT / name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _is_local(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:", target)


def _anchors(page: Path) -> set[str]:
    """The anchors a renderer gives the page's headings (GitHub's rule: lower case, no
    punctuation but hyphens, spaces to hyphens)."""
    in_code, anchors = False, set()
    for line in page.read_text(encoding="utf-8").splitlines():
        in_code ^= line.startswith("```")
        if not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_local_markdown_link_resolves() -> None:
    broken = []
    for page in _markdown_files():
        for target in MARKDOWN_LINK.findall(page.read_text(encoding="utf-8")):
            if not _is_local(target):
                continue
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links to files or headings that do not exist:\n" + "\n".join(broken)


def test_every_docs_path_named_in_the_tree_exists() -> None:
    missing = []
    for file in _tracked_text_files():
        if file.suffix in {".png", ".json", ".whl", ".gz"} and file.name != "oddl.json":
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for path in DOCS_PATH.findall(text):
            if not (ROOT / path.rstrip(".")).exists():
                missing.append(f"{file.relative_to(ROOT)}: {path}")
    assert not missing, "docs paths that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_docs_map_links_every_page() -> None:
    """docs/README.md is the map: a page it does not link is a page nobody finds."""
    map_text = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {(ROOT / "docs" / t.split("#", 1)[0]).resolve()
              for t in MARKDOWN_LINK.findall(map_text) if _is_local(t)}
    pages = [p for p in (ROOT / "docs").rglob("*.md")
             if p.name != "README.md" and "decisions" not in p.parts]
    unlisted = [str(p.relative_to(ROOT)) for p in pages if p.resolve() not in linked]
    assert not unlisted, "pages the map does not link: " + ", ".join(sorted(unlisted))
