"""The docs describe the product as it is, to its users: no prose about how or when the work was done.

Checked: README.md, docs/*.md, examples/*/README.md, scripts/README.md, tests/*/README.md, and the comments
and string literals (docstrings, messages) of the package's Python files, the scripts, the `.clock` files and
the grammar. A failure names `file:line` and the phrase. "Session" is the product's noun (a duplex session):
"the first session in a slot", "a session's arena", "sessions per GPU" are fine; "the fifth session" of the
work is not.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ORDINAL = r"(?:third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\d+(?:st|nd|rd|th))"
HISTORY = {
    "a session of the work": re.compile(
        rf"\b{ORDINAL}\s+session\b"
        r"|\b(?:first|second)\s+session(?:'s)?\s+(?:code|run|runs|bench|fix|GPU|measurement|call|commit|checkout)\b"
        r"|\b(?:since|until|before|after|from|in)\s+the\s+(?:first|second)\s+session\b(?!\s+(?:of|in)\s+(?:a|the|each|its)\b)"
        r"|\b(?:this|last|next|previous|earlier)\s+(?:GPU\s+)?session(?:'s)?\s+(?:code|run|runs|bench|fix|machine|GPU)\b",
        re.I,
    ),
    "the GPU time of the work": re.compile(
        r"\bGPU time (?:was|is|had been) (?:spent|used up|out)\b|\bno GPU time left\b", re.I
    ),
    "a path outside the repository": re.compile(r"\bshared/(?:reference|notes)\b|(?<![\w.])/work/|\bDESIGN\.md\b"),
    "an issue number": re.compile(r"\b(?:issue|issues|PR|pull request)\s+#?\d+\b", re.I),
    "a target of the work": re.compile(
        r"\btargets?\s+(?:(?:was|were|is|are)\s+)?(?:not\s+)?(?:met|missed|reached)\b"
        r"|\(target(?=[\s:])|\btarget:\s*(?:at least|at most|within)\b|\bthe target was\b",
        re.I,
    ),
    "a fix of the work": re.compile(r"\b(?:before|after|until) the fix\b|\bwas not run here\b", re.I),
    "the lab's machines, not a user's": re.compile(r"\bGPU machine\b|\$OUT\b|\bcarried wheels\b", re.I),
}

# Lines in files other branches own, which their owners rewrite: exactly these, each with its phrase. An entry
# that no longer matches fails the test (delete it then).
ALLOWED: set[tuple[str, str]] = set()


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "scripts" / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md"))
    files += sorted((ROOT / "examples").glob("*/README.md"))
    files += sorted((ROOT / "tests").glob("*/README.md"))
    return files


def package_files() -> list[Path]:
    folders = ("dsl", "interpreter", "examples", "scripts", "stdlib", "grammar")
    files = [ROOT / name for name in ("__init__.py", "__main__.py", "tails.py") if (ROOT / name).exists()]
    for folder in folders:
        for pattern in ("*.py", "*.clock", "*.lark"):
            files += sorted((ROOT / folder).rglob(pattern))
    return files


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of what a reader reads: a page's lines; a Python file's comments and string
    literals; a `.clock` or grammar file's comments."""
    text = path.read_text()
    if path.suffix == ".md":
        return list(enumerate(text.splitlines(), 1))
    if path.suffix in (".clock", ".lark"):
        return [(n, line) for n, line in enumerate(text.splitlines(), 1) if re.match(r"\s*(#|//)", line)]
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            found += [(token.start[0] + i, line) for i, line in enumerate(token.string.splitlines())]
    return found


def history(lines: list[tuple[int, str]]) -> list[tuple[int, str, str, str]]:
    """(line, what, phrase, the line) for every phrase about the work."""
    return [
        (number, what, match.group(0), line.strip())
        for number, line in lines
        for what, pattern in HISTORY.items()
        for match in pattern.finditer(line)
    ]


def test_no_prose_about_the_work():
    found, allowed_seen = [], set()
    for path in markdown_files() + package_files():
        relative = path.relative_to(ROOT).as_posix()
        for number, what, phrase, line in history(prose_lines(path)):
            if (relative, line) in ALLOWED:
                allowed_seen.add((relative, line))
                continue
            found.append(f"{relative}:{number}: {what}: {phrase!r}")
    assert not found, "prose about the work, not the product:\n" + "\n".join(found)
    stale = ALLOWED - allowed_seen
    assert not stale, f"allowed lines that no longer say it (remove them from ALLOWED): {sorted(stale)}"


def test_the_phrases_it_catches_and_the_product_sentences_it_leaves():
    caught = [
        "Rows marked * come from runs before the fifth session's bench fix",
        "The Moshi and PersonaPlex rows are from the seventh session.",
        "Since the sixth session DuplexCadence warms up on the caller's stream",
        "it was not run here: the GPU time was spent.",
        "Qwen3-Omni was not rerun (no GPU time left)",
        "Source: shared/reference/model-anatomy.md §1.3.",
        "see DESIGN.md §3",
        "the reliability work of issue #12",
        "DuplexCadence is 1.28x faster (target: at least 1.25x)",
        "bf16 2.58x (target at least 4x; not met)",
        "The target was within 1.15x; all meet it.",
        "The second session's code (185755d) took 1049 ms",
        "measured in the 3rd session",
    ]
    for sentence in caught:
        assert history([(1, sentence)]), sentence
    kept = [
        "the first session in a slot captures that slot's graphs; later sessions in the slot reuse them.",
        "Graphs are captured ahead of time, when a slot's first session starts",
        "MiniCPM-o 4.5 serves 16 sessions per GPU; a session's arena is 312 MiB",
        "a LockstepGroup takes one session slot; the second session joins at any frame",
        "cite upstream as pytorch/pytorch#144455",
        "target: str",
        'f"index {position} is out of range for a list of {len(target.value)}"',
        "a short run that has not settled",
    ]
    for sentence in kept:
        assert not history([(1, sentence)]), sentence


def test_it_reads_comments_and_strings_of_python_and_comments_of_clock_files(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('x = 1  # fine\n"""Docstring."""\ny = "measured in the fifth session"\n# target: at most 23 ms\n')
    assert [(n, what) for n, what, _, _ in history(prose_lines(module))] == [
        (3, "a session of the work"),
        (4, "a target of the work"),
    ]
    clock = tmp_path / "t.clock"
    clock.write_text("# Source: shared/reference/model-anatomy.md\nregion fifth_session : f32[1] on frame\n")
    assert [(n, what) for n, what, _, _ in history(prose_lines(clock))] == [(1, "a path outside the repository")]
