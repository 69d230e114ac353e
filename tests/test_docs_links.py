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


def test_the_readmes_quick_commands_run(tmp_path):
    """Every inline `sim5d memory|schedule|collective|topology ...` command of the README with
    no placeholder (SCENARIO, NAME, ...) runs as printed, exit 0: the list had `schedule
    --schedule NAME` (the name is an argument) and a `collective` without its sizes, which
    both exit 2."""
    import re
    import shlex

    from conftest import run_cli

    text = (ROOT / "README.md").read_text()
    cmds = [c for c in re.findall(r"`sim5d ((?:memory|schedule|collective|topology) [^`]*)`", text)
            if not re.search(r"[A-Z]{4,}|\[", c)]
    assert any(c.startswith("schedule ") for c in cmds) and any(c.startswith("collective ") for c in cmds)
    for c in cmds:
        argv = [str(tmp_path / a) if a.endswith(".png") else a for a in shlex.split(c)]
        code, out, err = run_cli(*argv)
        assert code == 0, (c, err[-500:])
