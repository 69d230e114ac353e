"""The documentation's links hold (issue #32: a docs check that fails on broken links). Every
relative link of README.md and docs/*.md names a file of the repository, and a `#anchor` a
heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens).
Our own check rather than MkDocs --strict: the pages are read on GitHub and in the checkout as
plain Markdown, and this needs no site build or new dependency."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set:
    out, block = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            block = not block
        if not block and line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text)))
    return out


def _links(page: Path):
    block = False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            block = not block
        if not block:
            for m in LINK.finditer(line):
                yield n, m.group(1)


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for n, target in _links(page):
            if re.match(r"[a-z]+:", target):          # http(s), mailto: not checked offline
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}:{n}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}:{n}: {target} (no such heading)")
    assert broken == []


def test_the_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n[a](missing.md) [b](#title) [c](#nope)\n")
    found = [t for _, t in _links(page)]
    assert found == ["missing.md", "#title", "#nope"]
    assert "title" in _anchors(page) and "nope" not in _anchors(page)
    assert not (tmp_path / "missing.md").exists()


def test_readme_is_short_and_every_docs_page_is_linked_from_it():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in text, page.name
