"""Fuzzing the limits: adversarial `.clock` inputs through `dsl check`, `dsl plan --format json` and
`dsl render`, each input within a time budget, never a traceback or an internal error, every refusal
located.

The inputs are what an adversarial user writes (hypothesis strategies below):
- a scaffold of a real tail (cadence, clocks, an input, a family of state regions, a carry, an
  output, a stage) whose every number is a param drawn from small, large and absurd values (2^31 - 1,
  10^11, 10^15, a 40-digit literal, 10^-16, zero, negative), so that consistent programs with huge
  windows, rings, horizons, contexts, families, rates and shapes reach the planner;
- long names (300 and 5 000 characters), deep nesting (at and past the nesting limit), long chains
  of params, thousands of repeated declarations up to the file size limit, paths with dunder and
  private segments, `use` of names no file can have;
- the mutations of real files of test_clock_fuzz.py, with these shapes among the insertions.

Each input must finish all three commands within PER_INPUT_BUDGET_S (a hang detector for a loaded
2-core runner; an input takes well under a second) with exit 0 or 1, no `Traceback`, no `internal
error`, and when refused, diagnostics that are located (`--> file:line:col`, or the file itself for the
file-level codes). scripts/clock_fuzz_campaign.py runs the same strategies over thousands of inputs
and reports the counts instead of failing at the first.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplexcadence.interpreter.cli import main as cli

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("clock_fuzz_strategies", HERE / "test_clock_fuzz.py")
_fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fuzz)

PER_INPUT_BUDGET_S = 30.0
"""check + plan + render of one input: a hang detector (a loaded 2-core runner is slow and uneven);
scripts/clock_fuzz_campaign.py reports the real distribution."""

FILE_LEVEL_CODES = {"unreadable-file", "param-override", "empty-file", "cannot-plan"}

# --- the strategies ----------------------------------------------------------------------------------

HUGE = [
    "2147483647",
    "4294967296",
    "100000000",
    "100000000000",
    "999999999999999",
    "1000000000000000",
    "10000000000000000",
    "1" + "0" * 39,
    "1" + "0" * 45,
    "0.0000000000000001",
    "0.000000000000001",
]
ODD = ["0", "-1", "-3", "0.5", "1.5", "12.5", "1 s", "80 ms", "1 / 3", "2 ** 3", "1e9", "[1, 2]", "len([])"]
SMALL = ["1", "2", "3", "4", "8", "16", "25", "250", "1920"]
NUMBER = st.one_of(
    st.sampled_from(SMALL),
    st.sampled_from(HUGE),
    st.sampled_from(ODD),
    st.integers(0, 10**7).map(str),
    st.integers(10**7, 10**18).map(str),
)
LONG_NAMES = ["a" * 300, "b" * 5_000, "x" * 255, "y" * 256]
PATHS = [
    "decoder",
    "decoder.model.0",
    "layers.{layer}.cache",
    "layers.{layer}._state.cache",
    "_orig_mod",
    "__class__.__init__.__globals__.torch.os.getpid",
    "__class__.__init__.__globals__.NAME",
    "decoder.__dict__",
    "decoder.__x",
    "{layer}",
    "a..b",
    "",
    "a" * 300,
    ".".join(["m"] * 2_000),
]
RETENTIONS = [
    "last W",
    "ring R",
    "first P + last W",
    "all horizon H",
    "all horizon H s",
    "scratch",
    "last W s",
]
STARTS = ["", "start zeros", "start empty", "start given P", "start given 1"]


@st.composite
def scaffold(draw) -> str:
    """A Mimi-like program whose every size is a param drawn from NUMBER (consistent by construction:
    the advances are the params the rates are made of), so huge values reach the limits and the planner."""
    params = {name: draw(st.sampled_from(SMALL)) for name in ("B", "C", "N", "W", "R", "P", "H", "F", "L", "D")}
    for name in draw(st.lists(st.sampled_from(sorted(params)), max_size=3, unique=True)):
        params[name] = draw(NUMBER)  # a few sizes huge, absurd or odd; the rest plausible
    rate = draw(st.sampled_from(["12.5 Hz", "10 Hz", "1 Hz", "1 Hz / 9973", "1000000 Hz", "1 Hz / 1000000007"]))
    bind = draw(st.sampled_from(["", "", *(f' bind "{p}"' for p in PATHS), *(f' bind private "{p}"' for p in PATHS)]))
    module = draw(st.sampled_from(PATHS[:8]))
    family = draw(st.sampled_from(["", "[layer < F]"]))
    read = draw(st.sampled_from(["read codes", "read codes last L", "read codes new + L", "read codes lookahead L"]))
    latency = draw(st.sampled_from(["", " latency L", " latency D dropped"]))
    lines = [f"param {name} = {value}" for name, value in params.items()]
    lines += [
        draw(st.sampled_from(["cadence 1 s", "cadence 80 ms", "cadence 1000003 s", "cadence 0.001 s"])),
        f"clock frame = {rate}",
        "clock sample = frame * N",
        "region codes : i64[B, time] on frame input" + draw(st.sampled_from(["", " retain last L", " start zeros"])),
        f"region kv{family} : f32[2, B, time, C] on frame retain {draw(st.sampled_from(RETENTIONS))} "
        f"{draw(st.sampled_from(STARTS))}{bind}",
        f"region carry : f32[B, C, time] on sample retain last D {draw(st.sampled_from(STARTS))}",
        f"region fixed : {draw(st.sampled_from(['f32', 'bf16', 'i8']))}[B, C, D]",
        "region pcm : f32[B, time] on sample output",
        "stage decode on frame {",
        f'    module {draw(st.sampled_from(["", "private "]))}"{module}"',
        f"    {read}",
        "    update kv +1",
        "    update carry +N",
        "    update fixed",
        f"    write pcm +N{latency}",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _repeat(line: str, count: int) -> str:
    return (line + "\n") * count


@st.composite
def pathological(draw) -> str:
    """Long names, deep nesting, long chains, repeats: the shapes whose cost grows with the text."""
    count = draw(st.sampled_from([2, 100, 3_000, 15_000]))
    depth = draw(st.sampled_from([50, 99, 100, 101, 3_000]))
    name = draw(st.sampled_from([*LONG_NAMES, "p"]))
    kind = draw(
        st.sampled_from(
            [
                "repeat-param",
                "repeat-region",
                "repeat-stage",
                "repeat-clock",
                "chain",
                "reverse-chain",
                "cycle",
                "nesting",
                "long-name",
                "use-long",
                "families",
                "reads",
                "unknown-names",
                "repeat-use",
                "wide-stages",
                "fast-family",
                "clocks-coprime",
            ]
        )
    )
    head = "cadence 1 s\nclock c = 10 Hz\n"
    if kind == "repeat-param":
        return _repeat("param a = 1", count)
    if kind == "repeat-region":
        return head + _repeat("region r : f32[1, time] on c retain last 2", count)
    if kind == "repeat-stage":
        return head + "region x : f32[1, time] on c input\n" + _repeat('stage s on c { module "m"; read x }', count)
    if kind == "repeat-clock":
        return head + "".join(f"clock k{i} = {i + 1} Hz\n" for i in range(count))
    if kind == "chain":
        return "param p0 = 1\n" + "".join(f"param p{i} = p{i - 1} * 2\n" for i in range(1, count))
    if kind == "reverse-chain":
        return "".join(f"param p{i} = p{i + 1} + 1\n" for i in range(count)) + f"param p{count} = 1\n"
    if kind == "cycle":
        return "".join(f"param p{i} = p{(i + 1) % count} + 1\n" for i in range(count))
    if kind == "nesting":
        return f"param x = {'(' * depth}1{')' * depth}\n" + f"param y = {' + '.join(['1'] * depth)}\n"
    if kind == "long-name":
        return head + f"param {name} = 1\nregion {name} : f32[1, time] on c retain last 2\n"
    if kind == "use-long":
        return f"use {name}\nuse std.{name}\n" + head
    if kind == "families":
        return head + "".join(
            f"region f{i}[i < 1000] : f32[1, time] on c retain last 2\n" for i in range(count % 50 + 2)
        )
    if kind == "reads":
        return (
            head
            + "region x : f32[1, time] on c input\nregion y : f32[1, time] on c retain last 2 start zeros\n"
            + 'stage s on c { module "m"\n'
            + _repeat("    read y last 2", count)
            + "    read x\n}\n"
        )
    if kind == "unknown-names":
        return "".join(f"param p{i} = q{i}\n" for i in range(count))
    if kind == "repeat-use":
        return _repeat("use std.audio", count) + head
    if kind == "fast-family":  # many regions on a fast clock: every traced instant keeps every length
        rate = draw(st.sampled_from(["49 Hz", "249 Hz", "499 Hz", "9999 Hz"]))
        return (
            f"cadence 1 s\nclock c = {rate}\nregion x : f32[1, time] on c input\n"
            f"region kv[i < {count % 1024 + 1}] : f32[1, time] on c retain last 2 start zeros\n"
            'stage s on c {\n    module "s"\n    read x\n    read kv[0]\n}\n'
        )
    if kind == "wide-stages":  # many stages that all read and update one fixed region: every pair ordered
        return (
            head
            + "region f : f32[4]\nregion kv[i < 1000] : f32[1, time] on c retain last 2 start zeros\n"
            + "".join(
                f'stage s{i} on c {{ module "m"; read f; update f; update kv[{i % 1000}] +1 }}\n'
                for i in range(count % 4000)
            )
        )
    primes = [9973, 9967, 9949, 9941, 9931, 9929, 9923, 9907, 9901, 9887, 9883, 9871]
    return "cadence 1 s\n" + "".join(
        f'clock k{i} = 1 Hz / {p}\nstage s{i} on k{i} {{ module "m" }}\n' for i, p in enumerate(primes)
    )


MUTANT_INSERTS = [
    *HUGE,
    *(f"[layer < {h}]" for h in HUGE[:4]),
    "retain ring 2147483647",
    "retain last 100000000000",
    "retain all horizon 1000000000000",
    "read x last 100000000",
    "+2147483647",
    'bind "__class__.__init__.__globals__.NAME"',
    'module "__class__.__init__.__globals__.torch.os.getpid"',
    'bind "_private.x"',
    "use " + "a" * 300,
    *LONG_NAMES[:2],
]


@st.composite
def adversarial_mutant(draw) -> str:
    """A real file with one of MUTANT_INSERTS put before one of its tokens, then mutated as
    test_clock_fuzz.py does."""
    _, text = draw(_fuzz.mutated())
    tokens = [m.start() for m in _fuzz.TOKEN.finditer(text)] or [0]
    at = tokens[draw(st.integers(0, len(tokens) - 1))]
    return text[:at] + draw(st.sampled_from(MUTANT_INSERTS)) + " " + text[at:]


INPUTS = st.one_of(scaffold(), scaffold(), pathological(), adversarial_mutant(), _fuzz.PROGRAMS)


# --- running one input ------------------------------------------------------------------------------


class OverBudget(BaseException):
    """Raised by the alarm: a BaseException, so that the CLI's last line of defence does not catch it."""


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """OverBudget in the main thread after `seconds` (no limit elsewhere)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise OverBudget(f"over the budget of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@attrs.frozen
class Outcome:
    """What the three commands did with one input."""

    codes: tuple[int, ...]
    seconds: tuple[float, ...]  # wall-clock, per command
    problems: tuple[str, ...]  # what breaks a promise: a traceback, an internal error, an unlocated refusal
    cpu_seconds: float = 0.0  # of this process, the three commands together (robust to a loaded machine)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds)


COMMANDS = (
    ("check", "--output-format", "concise"),
    ("plan", "--output-format", "json"),
    ("render", "--output-format", "dot", "--view", "timeline"),
)
CONCISE = re.compile(r"^(?P<where>\S.*?): (?P<severity>error|warning): .* \[(?P<code>[a-z-]+)\]$")
LOCATED = re.compile(r":\d+:\d+$")
FULL_HEADER = re.compile(r"^error\[(?P<code>[a-z-]+)\]")


def run_command(argv: list[str]) -> tuple[int, str, str, float]:
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
    stderr = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(argv)
        stdout.flush()
    return code, raw.getvalue().decode("utf-8", "replace"), stderr.getvalue(), time.perf_counter() - start


def unlocated(command: str, code: int, out: str, err: str) -> list[str]:
    """The refusals of one command that are not located (file:line:col, or a file-level code)."""
    found = []
    if command == "check":
        for line in out.splitlines():
            match = CONCISE.match(line)
            wanted = match and match["severity"] == "error" and match["code"] not in FILE_LEVEL_CODES
            if wanted and not LOCATED.search(match["where"]):
                found.append(line)
    elif command == "plan" and code == 1:
        import json

        for entry in json.loads(out):
            for diagnostic in entry["diagnostics"]:
                if diagnostic["span"] is None and diagnostic["code"] not in FILE_LEVEL_CODES:
                    found.append(f"{diagnostic['code']}: {diagnostic['message']}")
    elif code == 1:
        lines = err.splitlines()
        for i, line in enumerate(lines):
            match = FULL_HEADER.match(line)
            located = i + 1 < len(lines) and re.match(r"^\s*--> .*:\d+:\d+$", lines[i + 1])
            if match and match["code"] not in FILE_LEVEL_CODES and not located:
                found.append(line)
    return found


def run_input(folder: Path, text: str, budget: float = PER_INPUT_BUDGET_S) -> Outcome:
    """`dsl check`, `dsl plan --format json`, `dsl render` of `text` written to `folder/fuzz.clock`."""
    path = folder / "fuzz.clock"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    codes, seconds, problems = [], [], []
    deadline = time.perf_counter() + budget
    cpu_start = time.process_time()
    for command in COMMANDS:
        left = deadline - time.perf_counter()
        try:
            with alarm(max(left, 0.01)):
                code, out, err, took = run_command([*command, str(path)])
        except OverBudget:
            problems.append(f"over budget ({budget:g} s) in dsl {command[0]}")
            codes.append(-1)
            seconds.append(budget)
            break
        codes.append(code)
        seconds.append(took)
        if "Traceback" in out + err:
            problems.append(f"traceback from dsl {command[0]}")
        if "internal error" in err:
            problems.append(f"internal error from dsl {command[0]}: {err.strip().splitlines()[0]}")
        if code not in (0, 1):
            problems.append(f"exit {code} from dsl {command[0]}: {err.strip()[:300]}")
        problems += [f"unlocated from dsl {command[0]}: {line}" for line in unlocated(command[0], code, out, err)]
    return Outcome(tuple(codes), tuple(seconds), tuple(problems), time.process_time() - cpu_start)


# --- the tests ----------------------------------------------------------------------------------------

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("limits_fuzz")


@FUZZ
@given(text=INPUTS)
@pytest.mark.slow
def test_adversarial_inputs_finish_in_budget_without_internal_errors(folder, text) -> None:
    outcome = run_input(folder, text)
    assert not outcome.problems, (outcome.problems, text[:500])


@settings(FUZZ, max_examples=80)
@given(text=scaffold())
@pytest.mark.slow
def test_huge_numbers_in_a_consistent_program_are_limits_not_work(folder, text) -> None:
    outcome = run_input(folder, text)
    assert not outcome.problems, (outcome.problems, text)
    assert outcome.codes[1] == outcome.codes[2], "dsl plan and dsl render disagree"
