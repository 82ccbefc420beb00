"""The docs hold together: every "docs/PAGE.md §Heading" citation in the repository names a
heading of that page, every relative Markdown link resolves (file and anchor), nothing points
outside the repository, ARCHITECTURE.md's diagram is its source file's, and README stays a
front page. Each check is a function tried first on a planted fault, so it can fail.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_CITATION = re.compile(r"docs/([a-z0-9-]+\.md) §((?:[^\n]|\n[ \t#]*){1,80})")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_OUTSIDE = re.compile(r"\.\./shared|shared/spec|/work/|spec §")
_MERMAID = re.compile(r"```mermaid\n(.*?)```", re.S)


def _tracked(*patterns: str) -> list[Path]:
    """The repository's files (as git tracks them) matching ``patterns``, but this one (its
    planted faults)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", *patterns], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    files = [ROOT / n for n in names.split("\0") if n and (ROOT / n).is_file()]
    return [f for f in files if f != Path(__file__).resolve()]


def headings(page: str) -> list[str]:
    """A Markdown text's heading titles."""
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", page, re.M)]


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def bad_citations(text: str, pages: dict[str, str]) -> Iterator[str]:
    """The citations in ``text`` whose page is missing or has no heading they start with."""
    for match in _CITATION.finditer(text):
        page, cited = match.group(1), re.sub(r"\s*\n[ \t#]*", " ", match.group(2))
        if cited.startswith("<heading>"):  # how a docs page tells the form of a citation
            continue
        titles = headings(pages.get(page, ""))
        if not any(re.match(re.escape(t) + r"(\W|$)", cited) for t in titles):
            yield f"docs/{page} §{cited[:40]}"


def bad_links(text: str, where: Path) -> Iterator[str]:
    """The relative links in Markdown ``text`` (of the file ``where``) whose file or anchor
    does not exist."""
    for match in _LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        name, _, anchor = target.partition("#")
        path = (where.parent / name).resolve() if name else where
        if not path.exists() or (
            anchor
            and path.suffix == ".md"
            and anchor not in {slug(t) for t in headings(path.read_text())}
        ):
            yield target


def test_the_checks_find_what_is_planted(tmp_path: Path) -> None:
    pages = {"p.md": "# P\n## Reading JSONL\n"}
    good = "see docs/p.md §Reading JSONL, and docs/p.md §Reading\n    # JSONL)."
    assert list(bad_citations(good, pages)) == []
    assert list(bad_citations("docs/p.md §Reading CSV", pages)) == ["docs/p.md §Reading CSV"]
    assert list(bad_citations("docs/q.md §Reading JSONL", pages)) != []
    page = tmp_path / "a.md"
    page.write_text("# A\n## Two words\n[ok](a.md#two-words) [self](#a)\n")
    assert list(bad_links(page.read_text(), page)) == []
    assert list(bad_links("[x](b.md) [y](a.md#three)", page)) == ["b.md", "a.md#three"]
    assert _OUTSIDE.search("see ../shared/spec/x.md") and _OUTSIDE.search("/work/main/x")


def test_every_citation_names_a_heading_of_a_docs_page() -> None:
    pages = {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md")}
    found = {
        str(f.relative_to(ROOT)): bad
        for f in _tracked("*.py", "*.md", "*.toml", "*.yml", "*.yaml", "Makefile")
        if (bad := list(bad_citations(f.read_text(errors="replace"), pages)))
    }
    assert found == {}


def test_every_relative_link_of_the_docs_resolves() -> None:
    found = {
        str(f.relative_to(ROOT)): bad
        for f in _tracked("*.md")
        if (bad := list(bad_links(f.read_text(), f)))
    }
    assert found == {}


def test_nothing_points_outside_the_repository() -> None:
    found = [
        f"{f.relative_to(ROOT)}:{n}"
        for f in _tracked()
        if f.suffix not in (".png", ".jsonl", ".json")
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert found == []


def test_the_architecture_diagram_is_its_source_file() -> None:
    [drawn] = _MERMAID.findall((ROOT / "ARCHITECTURE.md").read_text())
    assert drawn == (ROOT / "docs" / "architecture.mmd").read_text()


@pytest.mark.parametrize("name", ["README.md"])
def test_the_front_page_stays_short(name: str) -> None:
    assert len((ROOT / name).read_text().splitlines()) <= 300
