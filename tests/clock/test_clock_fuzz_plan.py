"""Fuzzing `dsl plan` and `dsl render` over mutated real files (hypothesis), beside test_clock_fuzz.py
whose mutation strategy it reuses (tokens and lines deleted, duplicated and swapped, numbers made
huge, zero or negative, unicode and binary garbage, deep parentheses, truncation), and real files
with a few numbers replaced by small ones (which mostly still check, so they reach the planner).

Every run ends in one of two ways, within a time bound:
- exit 0 with a plan whose JSON is consistent: every view fits its region's capacity, every region
  has its allocation and live allocations never share a byte, every firing maps to exactly one
  captured graph of its stage or to eager; a render is DOT text;
- exit 1 with located diagnostics on stderr (`error[code]` followed by ` --> file:line:col`, or the
  file's path for file-level ones), and nothing on stdout;
never exit 2 (an internal error), never a traceback, and `dsl plan` and `dsl render` agree.

Reduced for CI time: 80 plan examples and 50 render examples; the warm-up limit is lowered to
3 000 instants (`--limit warmup=3000`) so that a mutant with a long warm-up meets it in a fraction
of a second; the explicit tests below use the default limits.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from duplexcadence.dsl import messages
from duplexcadence.dsl.frontend import check_file
from duplexcadence.interpreter.bench import time_budget
from duplexcadence.interpreter.cli import main as cli

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("clock_fuzz_strategies", HERE / "test_clock_fuzz.py")
_fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fuzz)
mutated = _fuzz.mutated
NUMBER = re.compile(r"(?<![A-Za-z_0-9.])[0-9]+(?:\.[0-9]+)?(?![A-Za-z_0-9.])")


@st.composite
def renumbered(draw) -> tuple[Path, str]:
    """A real file with one to three of its numbers replaced by small ones: it usually still checks, so
    the planner sees other rates, retentions, windows and shapes (the plain mutants mostly stop at
    `dsl check`)."""
    seed = draw(st.sampled_from(_fuzz.SEEDS))
    text = seed.read_text(encoding="utf-8")
    for _ in range(draw(st.integers(1, 3))):
        numbers = list(NUMBER.finditer(text))
        if not numbers:
            break
        match = numbers[draw(st.integers(0, len(numbers) - 1))]
        value = draw(st.sampled_from(["1", "2", "3", "4", "5", "7", "8", "16", "25", "100", "0.5", "12.5"]))
        text = text[: match.start()] + value + text[match.end() :]
    return seed, text


MUTANTS = st.one_of(mutated(), renumbered())

TIME_BOUND_S = 20.0  # a hang detector: examples take well under a second on a 2-core runner
PLAN_FUZZ = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
RENDER_FUZZ = settings(PLAN_FUZZ, max_examples=50)
LOCATION = re.compile(r"^\s*--> \S")


class TooSlow(BaseException):
    """Raised by the alarm: a BaseException, so that the CLI's last line of defence does not catch it."""


def run_dsl(*argv: str) -> tuple[int, str, str]:
    """`dsl ARGV` in-process, within the time bound: (exit code, stdout, stderr)."""
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="utf-8")
    stderr = io.StringIO()
    with (
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
        time_budget(TIME_BOUND_S, "the command", error=TooSlow),
    ):
        code = cli.main(list(argv))
        stdout.flush()
    return code, raw.getvalue().decode("utf-8", "replace"), stderr.getvalue()


def assert_clean_exit(code: int, out: str, err: str) -> None:
    assert "Traceback" not in out + err, err
    assert code in (0, 1), f"exit {code}: {err}"
    if code == 1:
        assert out == "", out[:200]
        lines = err.splitlines()
        headers = [i for i, line in enumerate(lines) if line.startswith("error[")]
        assert headers, err
        for i in headers:
            assert i + 1 < len(lines) and LOCATION.match(lines[i + 1]), f"not located: {lines[i]}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder for the mutants, with `lib` beside them so that the good files' `use lib.x` resolves."""
    path = tmp_path_factory.mktemp("plan_fuzz")
    shutil.copytree(HERE / "good" / "lib", path / "lib")  # a copy: `use` follows no link out of the folder
    return path


SMALL_LIMITS = ("--limit", "warmup=3000")
"""The planner's limits lowered for the fuzz (see the module docstring)."""


# --- the plan's invariants, from its JSON ------------------------------------------------------------


def assert_plan_consistent(data: dict) -> None:
    """What `dsl plan --output-format json` promises (docs/plan-json.md), checked from the JSON alone."""
    regions = data["regions"]
    firings = data["trace"]["firings"]
    order = data["clocks"]["stage_order"]
    position = {stage: i for i, stage in enumerate(order)}

    for name, region in regions.items():
        assert region["bytes"] == math.prod(region["shape"]) * messages.DTYPES[region["dtype"]], name

    previous = (-1, -1)
    for firing in firings:
        here = (firing["instant"], position[firing["stage"]])
        assert here > previous, "firings out of instant or dataflow order"
        previous = here
        for view in firing["views"]:
            region = regions[view["region"]]
            capacity = region["capacity"]
            if region["live"] is not None:
                low, high = region["live"]
                assert low <= position[firing["stage"]] <= high, (view, region["live"])
            if view["kind"] != "update" and view["double_buffer"] and view["moved"]:
                assert region["double_buffer_bytes"] > 0, view
            if capacity is None or view["length"] is None:
                continue
            end = view["length"] if view["kind"] == "update" else view["start"] + view["length"]
            assert view["start"] >= 0 and end <= capacity, (view, capacity)
            if view["kind"] in ("feed", "write"):
                assert view["transient"] <= capacity, (view, capacity)
            if view["kept"] is not None:
                assert view["kept"] <= capacity, (view, capacity)
    if data["trace"]["periodic"]:
        instants = {f["instant"] for f in firings}
        assert instants == set(range(data["trace"]["warmup_instants"] + data["trace"]["period_instants"]))

    arena = data["arena"]
    allocations = arena["allocations"]
    by_name = {a["name"]: a for a in allocations}
    assert len(by_name) == len(allocations), "an allocation named twice"
    wanted = set(regions) | {f"{n}~double" for n, r in regions.items() if r["double_buffer_bytes"]}
    assert set(by_name) == wanted
    for name, region in regions.items():
        allocation = by_name[name]
        assert allocation["bytes"] == region["bytes"] and allocation["persistent"] == region["persistent"]
        if region["double_buffer_bytes"]:
            assert by_name[f"{name}~double"]["bytes"] == region["double_buffer_bytes"]
    for allocation in allocations:
        assert allocation["offset"] % arena["alignment"] == 0, allocation
        block = arena["session_bytes"] if allocation["persistent"] else arena["scratch_bytes"]
        assert allocation["offset"] + allocation["bytes"] <= block, allocation
    for i, a in enumerate(allocations):
        for b in allocations[i + 1 :]:
            if a["persistent"] != b["persistent"] or not a["bytes"] or not b["bytes"]:
                continue
            together = (
                a["live"] is None
                or b["live"] is None
                or (a["live"][0] <= b["live"][1] and b["live"][0] <= a["live"][1])
            )
            disjoint = a["offset"] + a["bytes"] <= b["offset"] or b["offset"] + b["bytes"] <= a["offset"]
            assert not together or disjoint, (a, b)

    pruning = data["pruning"]
    assert not {s["stage"] for s in pruning["stages"]} & set(order), "a pruned stage planned"
    assert not {r["region"] for r in pruning["regions"]} & set(regions), "a pruned region planned"

    capture = data["capture"]
    graphs = {g["key"]: g for g in capture["graphs"]}
    assert sorted(graphs) == list(range(len(capture["graphs"])))
    replays = capture["warmup"] + capture["steady"]
    assert len(replays) == len(firings), "a firing without a graph-or-eager decision"
    for (instant, stage, key), firing in zip(replays, firings):
        assert (instant, stage) == (firing["instant"], firing["stage"])
        if key is not None:
            graph = graphs[key]
            assert graph["captured"] and graph["stage"] == stage and firing["count"] in graph["firings"], graph
    assert capture["eager_firings"] == sum(key is None for _, _, key in replays)
    if capture["max_graphs"] is not None:
        assert sum(g["captured"] for g in graphs.values()) <= capture["max_graphs"]

    samples = data["samples"]
    assert set(samples["outputs"]) | set(samples["skipped"]) <= set(regions)
    for name, output in samples["outputs"].items():
        assert output["total"] == output["emitted"] + output["flushed"], name
        assert output["boundaries"] == max(output["firings"] - 1, 0) and output["dropped"] == (
            output["loss_per_firing"] * output["boundaries"]
        ), name
        assert output["short"] == output["offline"] - output["total"], name
        assert output["unaccounted"] == output["short"] - output["dropped"], name


def write_mutant(folder: Path, text: str) -> Path:
    path = folder / "mutant.clock"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


@PLAN_FUZZ
@given(
    case=MUTANTS,
    max_graphs=st.sampled_from([None, 0, 1, 3]),
    sessions=st.sampled_from([1, 2]),
    budget=st.sampled_from([None, None, 4096]),
)
@pytest.mark.slow
def test_dsl_plan_json_is_consistent_or_a_located_diagnostic(folder, case, max_graphs, sessions, budget) -> None:
    _, text = case
    path = write_mutant(folder, text)
    argv = ["plan", "--output-format", "json", str(path), "--sessions", str(sessions), *SMALL_LIMITS]
    if max_graphs is not None:
        argv += ["--max-graphs", str(max_graphs)]
    if budget is not None:
        argv += ["--max-arena-bytes", str(budget)]
    code, out, err = run_dsl(*argv)
    event(f"dsl plan exit {code}")  # pytest --hypothesis-show-statistics: how many mutants reach a plan
    assert "Traceback" not in out + err, err
    assert code in (0, 1) and err == "", f"exit {code}: {err}"
    if code == 1:  # with --output-format json the diagnostics are JSON on stdout, one entry for the file
        [entry] = json.loads(out)
        assert entry["path"] == str(path) and any(d["severity"] == "error" for d in entry["diagnostics"]), entry
    if not check_file(path, limits={"warmup": 3000, "firings": 20000}).ok:
        assert code == 1, "a plan for a file that does not check"
    if code == 0:
        data = json.loads(out)
        assert_plan_consistent(data)
        if budget is not None:
            assert data["arena"]["session_bytes"] * sessions + data["arena"]["scratch_bytes"] <= budget


@RENDER_FUZZ
@given(case=MUTANTS, view=st.sampled_from(["timeline", "graph", "arena"]), ticks=st.sampled_from([None, 1, 7, 400]))
@pytest.mark.slow
def test_dsl_render_dot_is_a_graph_or_a_located_diagnostic(folder, case, view, ticks) -> None:
    _, text = case
    path = write_mutant(folder, text)
    argv = ["render", str(path), "--view", view, "--output-format", "dot", *SMALL_LIMITS]
    if ticks is not None:
        argv += ["--ticks", str(ticks)]
    code, out, err = run_dsl(*argv)
    plan_code, _, _ = run_dsl("plan", str(path), *SMALL_LIMITS)
    event(f"dsl render exit {code}")
    assert_clean_exit(code, out, err)
    if code == 0:
        assert out.startswith("digraph ") and out.rstrip().endswith("}"), out[:200]
    assert plan_code == code, "dsl plan and dsl render disagree about the file"


# --- what the fuzz found, pinned ---------------------------------------------------------------------

ONE_STAGE = """cadence 1 s
clock c = 10 Hz
region x : f32[1, time] on c input
region y : f32[1, time] on c output
stage s on c {
    module "s"
    read x
    write y +1
}
"""


EDGE_PROGRAMS = {
    "library of clocks": ("clock c = 10 Hz\nparam p = 3\n", 1, "declares no stage: there is nothing to plan"),
    "empty file": ("", 1, "declares no stage"),
    "unused input": (ONE_STAGE.replace("    read x\n", ""), 0, ""),
    "unused scratch": (ONE_STAGE + "region t : f32[1, time] on c retain scratch\n", 0, ""),
    "ten million firings": (
        ONE_STAGE.replace("cadence 1 s", "cadence 1000003 s"),
        1,
        "the planner would trace 20000060 firings (20000060 in two hyperperiods of 1000003 s), over the limit of 20000",
    ),
}


@pytest.mark.parametrize("name", sorted(EDGE_PROGRAMS))
def test_plan_and_render_edge_programs(tmp_path, name) -> None:
    """Each was an internal error or a hang of `dsl plan` and `dsl render` before the fix."""
    text, code, says = EDGE_PROGRAMS[name]
    path = tmp_path / "edge.clock"
    path.write_text(text)
    for argv in (["plan", str(path)], ["render", str(path)]):
        found, out, err = run_dsl(*argv)
        assert_clean_exit(found, out, err)
        assert found == code and says in err, (argv, err)
    found, out, err = run_dsl("plan", "--output-format", "json", str(path))
    assert (found, err) == (code, "")
    if found == 0:
        assert_plan_consistent(json.loads(out))
    else:
        assert says in json.loads(out)[0]["diagnostics"][0]["message"]
