"""Every relative link and image in the README and the docs resolves: the file exists, and an anchor
names a heading of the target (GitHub's heading ids). Links inside code are not links."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    "README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*/README.md")),
]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(markdown: str) -> str:
    """The text outside fenced blocks and inline code."""
    markdown = re.sub(r"^```.*?^```[ \t]*$", "", markdown, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", markdown)


def heading_ids(markdown: str) -> set[str]:
    """GitHub's ids: lower case, punctuation dropped (word characters, spaces and hyphens kept),
    spaces as hyphens, `-1`, `-2`... for repeats."""
    ids: set[str] = set()
    for heading in re.findall(
        r"^#{1,6} +(.+?) *#*$", re.sub(r"^```.*?^```[ \t]*$", "", markdown, flags=re.M | re.S), flags=re.M
    ):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in ids:
            n += 1
            candidate = f"{slug}-{n}"
        ids.add(candidate)
    return ids


def test_heading_ids_follow_github():
    assert heading_ids("## 2. Declare its state: `tinyvoc.clock`") == {"2-declare-its-state-tinyvocclock"}
    assert heading_ids("## 7. What to do when…\n### A b\n### A b") == {"7-what-to-do-when", "a-b", "a-b-1"}


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    source = ROOT / page
    text = source.read_text()
    broken = []
    for target in LINK.findall(prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path = (source.parent / unquote(path_part)).resolve() if path_part else source
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in heading_ids(path.read_text()):
            broken.append(f"{target}: no heading '#{anchor}' in {path.relative_to(ROOT)}")
    assert not broken, f"{page}: " + "; ".join(broken)
