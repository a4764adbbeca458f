"""The example programs: every file in tests/clock/good checks clean (no error, no warning), every
file in tests/clock/bad produces exactly the diagnostics written inline on its lines, mypy-style, and
so does every ```clock block of docs/language.md (a block without expectations checks clean).

Expectation syntax, in a comment on the offending line:

    read kv last 300  # E: retention-too-short          an error on this line, any column
    read kv last 300  # E: retention-too-short @5       an error at line:5 exactly
    region r : ...    # W: unused-region                a warning
    # flags: --param B=2.5  # E: param-override @file   command-line flags (--param, --limit);
                                                        `@file` expects a diagnostic without a position

A line may carry several expectations. Expectations may also sit in the helper files a bad file
imports (files under bad/lib/ and bad/_*.clock are helpers, not tests of their own): a diagnostic is
matched against the expectations of the file it points into.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import attrs
import pytest

from duplexcadence.dsl import messages
from duplexcadence.dsl.frontend import check_file
from duplexcadence.dsl.limits import DEFAULT_LIMITS, Limits, parse_limits
from duplexcadence.interpreter.cli.main import parse_params

HERE = Path(__file__).parent
DOCS = HERE.parents[1] / "docs" / "language.md"
GOOD = sorted((HERE / "good").glob("*.clock"))
BAD = sorted(p for p in (HERE / "bad").glob("*.clock") if not p.name.startswith("_"))
EXPECTATION = re.compile(r"#\s*([EW]):\s*([a-z][a-z-]*)(?:\s*@(\d+|file))?")
FLAGS = re.compile(r"#\s*flags:\s*([^#]*)")

RUNTIME_ONLY = {messages.BINDING_MISMATCH, messages.CAPTURE_BLOCKED, messages.BUDGET, messages.CANNOT_PLAN}
"""Codes that need a model or a plan: `dsl check` alone never produces them."""


@attrs.frozen
class Expected:
    severity: str  # "E" or "W"
    code: str
    path: str
    line: int | None  # None: a diagnostic without a position (`@file`)
    column: int | None

    def matches(self, found: Found) -> bool:
        if (self.severity, self.code) != (found.severity, found.code):
            return False
        if self.line is None:
            return found.line is None
        return (found.path, found.line) == (self.path, self.line) and self.column in (None, found.column)

    def __str__(self) -> str:
        where = "(no position)" if self.line is None else f"{Path(self.path).name}:{self.line}"
        where += f":{self.column}" if self.column is not None else ""
        return f"{where} {self.severity}: {self.code}"


@attrs.frozen
class Found:
    severity: str
    code: str
    path: str | None
    line: int | None
    column: int | None
    message: str

    def __str__(self) -> str:
        where = "(no position)" if self.line is None else f"{Path(self.path).name}:{self.line}:{self.column}"
        return f"{where} {self.severity}: {self.code}: {self.message}"


def expectations(path: str, text: str) -> list[Expected]:
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        for severity, code, where in EXPECTATION.findall(line):
            if where == "file":
                found.append(Expected(severity, code, path, None, None))
            else:
                found.append(Expected(severity, code, path, number, int(where) if where else None))
    return found


def flags(text: str) -> tuple[dict[str, str], Limits]:
    """The `--param` overrides and `--limit` values of a `# flags:` comment."""
    match = FLAGS.search(text)
    if match is None:
        return {}, DEFAULT_LIMITS
    words = shlex.split(match.group(1))
    overrides, problems = parse_params([words[i + 1] for i, word in enumerate(words) if word == "--param"])
    assert not problems, problems
    limits, wrong = parse_limits([words[i + 1] for i, word in enumerate(words) if word == "--limit"])
    assert not wrong, wrong
    return overrides, limits


def doc_blocks() -> list[tuple[int, str]]:
    """The ```clock blocks of docs/language.md, with the line each starts on."""
    text = DOCS.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"```clock\n(.*?)```", text, re.S)]


def run(path: Path, text: str | None = None) -> tuple[list[Expected], list[Found]]:
    if text is None:
        text = path.read_bytes().decode("utf-8", errors="replace")
        overrides, limits = flags(text)
        result = check_file(str(path), overrides, limits=limits)
    else:
        overrides, limits = flags(text)
        result = check_file(str(path), overrides, text=text, limits=limits)
    expected = expectations(str(path), text)
    for key, source in result.sources.items():
        if Path(key) != path:
            expected += expectations(source.path, source.text)
    found = [
        Found(
            "E" if d.severity is messages.Severity.ERROR else "W",
            d.code.name,
            d.span.path if d.span else None,
            d.span.line if d.span else None,
            d.span.column if d.span else None,
            d.message,
        )
        for d in result.diagnostics
    ]
    return expected, found


def mismatches(expected: list[Expected], found: list[Found]) -> tuple[list[Expected], list[Found]]:
    """Expectations without a diagnostic, and diagnostics without an expectation (a one-to-one match,
    exact-column expectations first)."""
    unmatched = list(found)
    missing = []
    for expectation in sorted(expected, key=lambda e: e.column is None):
        match = next((f for f in unmatched if expectation.matches(f)), None)
        if match is None:
            missing.append(expectation)
        else:
            unmatched.remove(match)
    return missing, unmatched


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_good_file_checks_clean(path: Path) -> None:
    result = check_file(str(path))
    assert result.diagnostics == (), "\n".join(f"{d.span}: {d.message} [{d.code.name}]" for d in result.diagnostics)
    assert result.program is not None


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_bad_file_gives_exactly_its_expected_diagnostics(path: Path) -> None:
    expected, found = run(path)
    assert expected, f"{path.name} has no `# E:` expectations"
    missing, unexpected = mismatches(expected, found)
    report = ["expected but not reported:"] + [f"  {e}" for e in missing]
    report += ["reported but not expected:"] + [f"  {f}" for f in unexpected]
    assert not missing and not unexpected, "\n".join(report)


@pytest.mark.parametrize("line,block", doc_blocks(), ids=lambda value: f"line{value}" if isinstance(value, int) else "")
def test_language_reference_examples_give_exactly_their_expected_diagnostics(line: int, block: str) -> None:
    path = HERE / f"language.md-line{line}.clock"  # beside the tests: `use` resolves like for a good file
    expected, found = run(path, block)
    missing, unexpected = mismatches(expected, found)
    report = ["expected but not reported:"] + [f"  {e}" for e in missing]
    report += ["reported but not expected:"] + [f"  {f}" for f in unexpected]
    assert not missing and not unexpected, "\n".join(report)


def test_the_language_reference_has_an_example_for_every_check_code() -> None:
    covered = {code for _, block in doc_blocks() for _, code, _ in EXPECTATION.findall(block)}
    wanted = {code.name for code in messages.ALL_CODES if code not in RUNTIME_ONLY}
    # unreadable-file, import-cycle and empty-file need files of their own: shown as `text` blocks
    assert wanted - covered == {"unreadable-file", "import-cycle", "empty-file"}
    text = DOCS.read_text(encoding="utf-8")
    assert all(f"### `{code.name}`" in text for code in messages.ALL_CODES), "a code has no section"


def test_every_check_code_has_a_bad_file() -> None:
    covered = set()
    for path in BAD:
        text = path.read_bytes().decode("utf-8", errors="replace")
        covered |= {code for _, code, _ in EXPECTATION.findall(text)}
    for helper in (HERE / "bad").rglob("*.clock"):
        covered |= {code for _, code, _ in EXPECTATION.findall(helper.read_bytes().decode("utf-8", "replace"))}
    wanted = {code.name for code in messages.ALL_CODES if code not in RUNTIME_ONLY}
    assert wanted - covered == set(), f"codes without a bad file: {sorted(wanted - covered)}"
    assert covered - {code.name for code in messages.ALL_CODES} == set(), "expectations name unknown codes"


def test_a_missing_expectation_is_caught() -> None:
    """The matcher itself: an extra or a missing diagnostic fails, a column must match when given."""
    path = str(HERE / "bad" / "x.clock")
    diagnostic = Found("E", "syntax", path, 3, 7, "...")
    assert mismatches([Expected("E", "syntax", path, 3, None)], [diagnostic]) == ([], [])
    assert mismatches([Expected("E", "syntax", path, 3, 8)], [diagnostic])[0]
    assert mismatches([], [diagnostic])[1] == [diagnostic]
    assert mismatches([Expected("E", "syntax", path, 3, None)] * 2, [diagnostic])[0]
    assert mismatches([Expected("W", "syntax", path, 3, None)], [diagnostic])[0]
