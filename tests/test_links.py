"""No dead links: every relative link in README.md and docs/*.md reaches a file of the repository
(and a heading, where it names an anchor), and no source file cites a repository file that is
not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted(p for folder in ("dspark_bench", "benchmarks", "tests") for p in (ROOT / folder).rglob("*")
                 if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts)
# Files that live outside this repository: a citation of one is a dead link.
OUTSIDE = ("DESIGN.md", "STYLE.md")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and [text](target "title")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
DOC_PATH = re.compile(r"\bdocs/[\w.-]+\.md\b")


def prose(text: str) -> str:
    """The page without its code blocks and code spans, where brackets are not links."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but hyphens and spaces dropped,
    spaces to hyphens (markdown emphasis and code marks are punctuation too)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's slug, numbered -1, -2 ... when repeated, as GitHub numbers them."""
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        result.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return result


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def broken(page: Path, target: str) -> str | None:
    """Why a relative link of `page` is dead, or None."""
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if not file.exists():
        return f"{file.relative_to(ROOT) if file.is_relative_to(ROOT) else file} does not exist"
    if not file.is_relative_to(ROOT):
        return "points outside the repository"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"{file.relative_to(ROOT)} has no heading #{anchor}"
    return None


def test_slug_follows_github():
    assert slug("Sweeps, replay, reports and calibration") == "sweeps-replay-reports-and-calibration"
    assert slug("`calibrate`, and decoding with a calibration") == "calibrate-and-decoding-with-a-calibration"
    assert slug("llama.cpp, for real") == "llamacpp-for-real"
    assert slug("On a GPU: `--draft-mode`, `benchmarks/gpu.sh`") == "on-a-gpu---draft-mode-benchmarksgpush"


def test_pages_found():
    assert (ROOT / "README.md") in PAGES and len(PAGES) > 5
    assert any(links(page) for page in PAGES)  # the link pattern matches what the pages use


def test_every_relative_link_resolves():
    dead = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
                continue
            reason = broken(page, target)
            if reason:
                dead.append(f"{page.relative_to(ROOT)}: ({target}) — {reason}")
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_no_source_cites_a_missing_file():
    dead = []
    for source in SOURCES:
        if source == Path(__file__).resolve():
            continue  # this file names them to look for them
        for number, line in enumerate(source.read_text().splitlines(), 1):
            where = f"{source.relative_to(ROOT)}:{number}"
            dead += [f"{where}: cites {name}, which is not in the repository" for name in OUTSIDE if name in line]
            dead += [f"{where}: cites {path}, which does not exist" for path in DOC_PATH.findall(line)
                     if not (ROOT / path).is_file()]
    assert SOURCES and not dead, "citations of missing files:\n" + "\n".join(dead)
