"""The documentation holds together: every relative link of the README and the pages under docs/
points at a file that exists (and at a heading that exists, for ``#anchors`` into Markdown), and
no project text (docs, code comments, docstrings, messages, tests) speaks in the first person
or of how the project is developed: it says what the project does and what it measured."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md"),
                ROOT / "conf" / "README.md", ROOT / "examples" / "README.md", *(ROOT / "tests" / "data").glob("*/README.md")])
CODE_FOLDERS = ("lightning_ncclx", "tests", "bench", "scripts", "examples", "hydra_plugins", "conf")

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~)")

# Words that speak in the first person, or of the making of the project rather than the project.
FIRST_PERSON = re.compile(r"\b(?:[Ww]e|[Oo]ur|[Oo]urs|[Oo]urselves|[Uu]s|[Mm]y|[Mm]e)\b|\bI\b(?!/O)")
DEVELOPMENT = re.compile(
    r"\b(?:this|that|earlier|previous|next|other|every|each|a|no|one) sessions?\b(?! fixture)|\bsession-start\b"
    r"|\bsessions ran\b|\b(?:this|previous|last|earlier|next) round\b|\bthe round before\b"
    r"|\bthe lead\b(?!\s+(?:rank|process|time))",
    re.IGNORECASE)


def _without_code_blocks(text: str) -> str:
    """The Markdown outside fenced code blocks and inline code spans."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors_of(page: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            slug = github_slug(m[1])
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in _LINK.findall(_without_code_blocks(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors_of(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert page.exists()
    assert broken_links(page) == []


def test_the_readme_is_a_short_tour() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## Two words\n\n[a](missing.md) [b](#two-words) [c](#nowhere) [d](page.md#top)\n"
                    "```\n[e](not-a-link-in-code.md)\n```\n[f](https://example.org/x) ![g](page.md#two-words)\n")
    assert broken_links(page) == ["missing.md: no such file", "#nowhere: no heading #nowhere in page.md"]


def test_headings_become_githubs_anchors() -> None:
    assert github_slug("Drop-in for Lightning's strategies") == "drop-in-for-lightnings-strategies"
    assert github_slug("Across incidents: `lightning-ncclx history`") == "across-incidents-lightning-ncclx-history"
    assert github_slug("Zero code: `LIGHTNING_NCCLX_WATCH=1`") == "zero-code-lightning_ncclx_watch1"


def _python_prose(path: Path) -> list[tuple[int, str]]:
    """Comments, docstrings and sentence-like strings (three words or more) of a Python file."""
    source = path.read_text()
    prose = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value.split()) >= 3:
            prose.append((node.lineno, node.value))
    return prose


def _project_text() -> list[tuple[str, int, str]]:
    texts = [(str(p.relative_to(ROOT)), n, line) for p in PAGES
             for n, line in enumerate(_without_code_blocks(p.read_text()).splitlines(), 1)]
    for folder in CODE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue  # its examples of what is refused
            for line, text in _python_prose(path):
                texts.extend((str(path.relative_to(ROOT)), line + i, re.sub(r"``[^`]*``", "", part))
                             for i, part in enumerate(text.splitlines()))
    return texts


# Being rewritten now (the watchdog runtime and the dump protocol, the analyzer's loader); their
# owners reword these with the rest.
TEMPORARY_ALLOWLIST = frozenset({
    "lightning_ncclx/analysis/load.py",
})


def test_no_project_text_speaks_in_the_first_person_or_of_its_own_making() -> None:
    hits = [f"{where}:{line}: {text.strip()[:120]}" for where, line, text in _project_text()
            if where not in TEMPORARY_ALLOWLIST and (FIRST_PERSON.search(text) or DEVELOPMENT.search(text))]
    assert hits == [], "say what the project does and measured:\n" + "\n".join(hits)


@pytest.mark.parametrize("text", [
    "we read both arrow forms", "# ours is repaired", "while I generated test dumps", "No session so far was lent",
    "the code this session started from", "The previous round's run", "replaced after us: put theirs back",
])
def test_first_person_and_development_talk_are_found(text: str) -> None:
    assert FIRST_PERSON.search(text) or DEVELOPMENT.search(text)


@pytest.mark.parametrize("text", [
    "run the job in its own process session", "made once per test session", "the session fixture runs all ten",
    "the only I/O stage", "one store round trip per step", "the other way round", "US letter", "the lead rank",
])
def test_ordinary_words_are_not_taken_for_it(text: str) -> None:
    assert not FIRST_PERSON.search(text) and not DEVELOPMENT.search(text)
