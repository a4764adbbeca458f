"""`dsl render`: golden DOT for every stdlib model in every view, `dot` acceptance, determinism, the
timeline's content, and the command line (formats, the missing-`dot` message, exit codes).

The golden files pin the exact DOT text. After an intended change of a drawing, of a stdlib model or
of the plan, regenerate them and review the diff:

    UPDATE_GOLDEN=1 python -m pytest tests/render
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import graphviz
import pytest

from duplexcadence.interpreter.cli.main import main
from duplexcadence.interpreter.plans.plan import plan_file
from duplexcadence.interpreter.views.output import DotMissing
from duplexcadence.interpreter.views.registry import VIEWS
from duplexcadence.interpreter.views.render import render_file, render_plan
from duplexcadence.interpreter.views.style import wrap
from duplexcadence.interpreter.views.timeline import build_timeline
from duplexcadence.interpreter.views.unit import build_unit
from duplexcadence.interpreter.views.view import View

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted((ROOT / "stdlib" / "models").glob("*.clock"))
MODEL_NAMES = [path.stem for path in MODELS]
GOLDEN = Path(__file__).parent / "golden"
MIMI = ROOT / "stdlib" / "models" / "mimi_decoder.clock"
STEP_AUDIO2 = ROOT / "stdlib" / "models" / "step_audio2_token2wav.clock"
QWEN = ROOT / "stdlib" / "models" / "qwen3_omni_code2wav.clock"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's `dot` is not installed")


@pytest.fixture(scope="module")
def plans():
    return {path.stem: plan_file(path) for path in MODELS}


def golden_path(model: str, view: str) -> Path:
    return GOLDEN / f"{model}-{view}.dot"


# --- golden DOT ---------------------------------------------------------------------------------


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_dot_matches_golden(plans, model, view):
    source = render_plan(plans[model], view).source
    golden = golden_path(model, view)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(source, encoding="utf-8")
    assert golden.exists(), f"no golden file {golden.name}: run UPDATE_GOLDEN=1 python -m pytest tests/render"
    assert source == golden.read_text(encoding="utf-8"), (
        f"{model} {view} changed; if intended: UPDATE_GOLDEN=1 python -m pytest tests/render"
    )


def test_no_stale_golden_files():
    expected = {golden_path(model, view).name for model in MODEL_NAMES for view in VIEWS}
    assert {path.name for path in GOLDEN.glob("*.dot")} == expected


def test_every_model_has_its_diagrams_in_docs():
    diagrams = ROOT / "docs" / "diagrams"
    missing = [f"{m}-{v}.svg" for m in MODEL_NAMES for v in VIEWS if not (diagrams / f"{m}-{v}.svg").exists()]
    assert not missing, f"render them (docs/render.md says how): {missing}"


@needs_dot
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_dot_accepts_every_view(plans, model, view):
    source = render_plan(plans[model], view).source
    result = subprocess.run(["dot", "-Tsvg"], input=source.encode("utf-8"), capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr.decode().strip() == "", "dot warned: " + result.stderr.decode()
    assert b"<svg" in result.stdout


# --- determinism --------------------------------------------------------------------------------


def test_two_renders_are_byte_identical():
    for view in VIEWS:
        first = render_plan(plan_file(MIMI), view).source
        second = render_plan(plan_file(MIMI), view).source
        assert first == second


@pytest.mark.slow
def test_same_dot_under_another_hash_seed(plans):
    """String hashing is salted per process: a render that leaned on hash() or set order would differ."""
    script = (
        "import json, sys\n"
        "from duplexcadence.interpreter.views.render import render_plan\n"
        "from duplexcadence.interpreter.plans.plan import plan_file\n"
        "from duplexcadence.interpreter.views.registry import VIEWS\n"
        "print(json.dumps({p + '|' + v: render_plan(plan_file(p), v).source\n"
        "                  for p in sys.argv[1:] for v in VIEWS}))\n"
    )
    here = {f"{path}|{view}": render_plan(plans[path.stem], view).source for path in MODELS for view in VIEWS}
    for seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        result = subprocess.run(
            [sys.executable, "-c", script, *map(str, MODELS)], capture_output=True, env=env, timeout=120, check=True
        )
        assert json.loads(result.stdout) == here


# --- what the timeline shows --------------------------------------------------------------------


def test_mimi_timeline_collapses_the_ring_warmup(plans):
    timeline = build_timeline(plans["mimi_decoder"])
    assert [(c.first, c.last, c.phase) for c in timeline.columns] == [
        (0, 0, "warmup"),
        (1, 1, "warmup"),
        (2, 2, "warmup"),
        (3, 124, "warmup"),
        (125, 149, "steady"),
    ]
    kv = [lane for lane in timeline.lanes if lane.members[0] == "kv[0]"]
    assert len(kv) == 1 and len(kv[0].members) == 8, "the 8 kv rings behave alike: one lane"
    assert [cell.after for cell in kv[0].cells] == [min(2 * (i + 1), 250) for i in range(150)]
    assert all(cell.size == 250 for cell in kv[0].cells)
    up8 = next(lane for lane in timeline.lanes if lane.members == ("up8",))
    assert up8.cells[0].after == 8, "a ring's fill is capped at its size (16 units arrive per frame)"
    for stage, cells in timeline.stage_cells.items():
        assert len({cell.graph for cell in cells}) == 1 and all(cell.captured for cell in cells), stage


def test_mimi_timeline_text(plans):
    source = render_plan(plans["mimi_decoder"], "timeline").source
    assert "frames 3–124" in source and "frames 125–149" in source
    assert "fill 8..250/250 (+2 each)" in source
    assert "WARM-UP · 125 frames" in source and "STEADY PERIOD · 25 frames, 2 s" in source
    assert "240 ms – 9.92 s" in source


def test_step_audio2_timeline_shows_graphs_and_trims(plans):
    timeline = build_timeline(plans["step_audio2_token2wav"])
    assert [(c.first, c.last, c.phase) for c in timeline.columns] == [
        (0, 0, "warmup"),
        (1, 1, "warmup"),
        (2, 2, "steady"),
    ]
    assert [c.graph for c in timeline.stage_cells["flow"]] == [0, 3, 6]
    assert [c.graph for c in timeline.stage_cells["hift_front"]] == [1, 4, 4], "the steady HiFT graph is reused"
    assert [c.graph for c in timeline.stage_cells["hift_back"]] == [2, 5, 5]
    attention = next(lane for lane in timeline.lanes if lane.members == ("estimator_att",))
    assert [(c.before, c.peak, c.after, c.trimmed) for c in attention.cells] == [
        (150, 200, 200, False),
        (200, 250, 250, False),
        (250, 300, 250, True),
    ]
    source = render_plan(plans["step_audio2_token2wav"], "timeline").source
    assert "250 +50 → 300 ✂250" in source


def test_qwen_timeline_marks_double_buffers(plans):
    timeline = build_timeline(plans["qwen3_omni_code2wav"])
    codes = next(lane for lane in timeline.lanes if lane.members == ("codes",))
    assert [c.double_buffer for c in codes.cells] == [False, True, True, True]
    assert [c.after for c in codes.cells] == [12, 25, 25, 25]
    assert [c.trimmed for c in codes.cells] == [False, False, True, True]


def test_qwen_stock_timeline_marks_the_samples_lost_at_each_boundary(plans):
    timeline = build_timeline(plans["qwen3_omni_code2wav"])
    wav = next(lane for lane in timeline.lanes if lane.members == ("wav",))
    assert [c.dropped for c in wav.cells] == [0, 555, 555, 555]
    source = render_plan(plans["qwen3_omni_code2wav"], "timeline").source
    assert source.count("✕ 555 lost at the boundary") == 4  # three ticks and the legend
    assert "the stream is<BR/>32745 samples short of one offline call over 60 s" in source
    streaming = build_timeline(plans["qwen3_omni_code2wav_streaming"])
    assert not any(c.dropped for lane in streaming.lanes for c in lane.cells)
    assert "lost at the boundary" not in render_plan(plans["qwen3_omni_code2wav_streaming"], "timeline").source


def test_eager_firings_are_marked():
    plan = plan_file(STEP_AUDIO2, max_graphs=3)  # the three steady graphs are kept first
    timeline = build_timeline(plan)
    assert [c.captured for c in timeline.stage_cells["flow"]] == [False, False, True]
    source = render_plan(plan, "timeline").source
    assert "<I>eager</I>" in source and 'STYLE="dashed"' in source
    assert "over the graph budget: eager" in source


def test_ticks_extend_and_cut_the_timeline(plans):
    longer = build_timeline(plans["mimi_decoder"], ticks=400)
    assert longer.instants == 400
    assert longer.columns[-1].phase == "repeat" and longer.columns[-1].last == 399
    shorter = build_timeline(plans["mimi_decoder"], ticks=60)
    assert {c.phase for c in shorter.columns} == {"warmup"} and shorter.columns[-1].last == 59
    assert "(first 60 shown)" in render_plan(plans["mimi_decoder"], "timeline", ticks=60).source
    with pytest.raises(ValueError):
        render_plan(plans["mimi_decoder"], "timeline", ticks=0)


def test_timeline_without_a_steady_state(tmp_path):
    """A region that keeps everything never repeats: the trace ends at its horizon (100 frames)."""
    path = tmp_path / "growing.clock"
    path.write_text(
        "cadence 1 s\nclock frame = 12.5 Hz\nclock sample = frame * 1920\n"
        "region codes : i64[1, 8, time] on frame input\n"
        "region history : f32[1, 4, time] on frame retain all horizon 100 start empty\n"
        "region pcm : f32[1, time] on sample output\n"
        "stage decode on frame { hook decode; read codes; update history +1; write pcm +1920 }\n"
    )
    plan = plan_file(path)
    assert not plan.trace.periodic
    timeline = build_timeline(plan)
    assert timeline.instants == 3 * plan.clocks.instants_per_hyperperiod
    assert {c.phase for c in timeline.columns} == {"growing"}
    assert len(timeline.columns) <= 5, "one graph per frame still collapses: g3..gN"
    assert "NO STEADY STATE" in render_plan(plan, "timeline").source


PRUNED_CLOCK = """
cadence 1 s
clock frame = 10 Hz
region x : f32[1, time] on frame input
region h : f32[1, time] on frame retain scratch
region y : f32[1, time] on frame output
region carry : f32[1, time] on frame retain last 2 start zeros
region mid : f32[1, time] on frame retain scratch
region dead : f32[1, time] on frame retain scratch
stage main on frame { hook main; read x new; write y +1; write h +1 }
stage side on frame { hook side; read h; update carry +1; write mid +1 }
stage sink on frame { hook sink; read mid; write dead +1 }
"""


@pytest.mark.parametrize("prune", [True, False])
def test_pruned_stages_are_drawn_greyed_with_why(tmp_path, prune):
    path = tmp_path / "side.clock"
    path.write_text(PRUNED_CLOCK)
    plan = plan_file(path, prune=prune)
    timeline = render_plan(plan, "timeline").source
    graph = render_plan(plan, "graph").source
    side = "pruned: no output, and only unobserved stage 'sink' reads what it writes"
    sink = "pruned: no output, and no other stage reads what it writes"
    if not prune:
        assert "pruned" not in timeline + graph
        assert "stage_side" in graph and "stage_sink" in graph
        return
    assert set(build_timeline(plan).stage_cells) == {"main"}
    for text in (side, sink):
        assert escape_text(text) in timeline.replace("<BR/>", " "), text
        assert escape_text(text) in graph.replace("<BR/>", " "), text
    assert "a pruned stage: no output sees its work" in timeline
    assert timeline.count('BGCOLOR="#fafafa" BORDER="1" COLOR="#8a8a8a" STYLE="dashed"') == 3  # two lanes, one legend
    assert "left out: carry" in graph and "left out: dead" in graph
    edges = [line.strip() for line in graph.splitlines() if " -> " in line and "invis" not in line]
    assert any(edge.startswith("region_h -> pruned_side") and "dashed" in edge for edge in edges)
    assert any(edge.startswith("pruned_side -> pruned_sink") and "label=mid" in edge for edge in edges)
    assert "stage_side" not in graph and "region_carry" not in graph


def escape_text(text: str) -> str:
    return text.replace("'", "&#x27;")


# --- the other views ----------------------------------------------------------------------------


def test_graph_view_folds_each_stages_own_state_into_one_table(plans):
    source = render_plan(plans["mimi_decoder"], "graph").source
    assert "state of seanet · 10 regions · 45.5 KiB" in source
    assert "state of transformer · 25 regions · 7.8 MiB" in source
    assert "kv[0..7] ×8" in source and "update +2 ×8" in source
    edges = [line.split("[")[0].strip() for line in source.splitlines() if " -> " in line and "invis" not in line]
    assert [edge for edge in edges if "stage_seanet" in edge] == [
        "stage_seanet -> state_seanet",
        "region_latent_out -> stage_seanet",
        "stage_seanet -> region_pcm",
    ], "one edge to the ten rings seanet alone updates"
    for clock in ("frame", "latent", "seanet8", "seanet48", "seanet240", "sample"):
        assert f"</FONT> {clock}</TD>" in source, f"the clock legend lists {clock}"
    step_audio2 = render_plan(plans["step_audio2_token2wav"], "graph").source
    assert "read last 28 (3 lookahead)" in step_audio2
    assert "region_spectrum" in step_audio2, "state one stage updates and another reads stays in the flow"


@needs_dot
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_every_drawing_fits_a_page_width(plans, model, view):
    """At most 1200 pt wide (a docs page at 100 %): legends wrap, the dataflow runs top to bottom."""
    svg = subprocess.run(
        ["dot", "-Tsvg"], input=render_plan(plans[model], view).source.encode("utf-8"), capture_output=True, timeout=60
    ).stdout.decode("utf-8")
    width = float(re.search(r'<svg width="([0-9.]+)pt"', svg).group(1))
    assert width <= 1200, f"{model} {view} is {width:g} pt wide"


def test_arena_view_shows_stock_beside_demand_and_double_buffers(plans):
    source = render_plan(plans["step_audio2_token2wav"], "arena").source
    assert "312.5 MiB" in source and "500.0 MiB" in source and "37.5%" in source  # carried attention cache
    assert "380.0 MiB (stock 2.0 GiB, 81.0% less)" in source  # the CFM working buffer, shared scratch
    assert "codes (double buffer)" in render_plan(plans["qwen3_omni_code2wav"], "arena").source


def test_unknown_view():
    with pytest.raises(ValueError, match="unknown view"):
        render_plan(plan_file(QWEN), "nope")


# --- files and the command line -----------------------------------------------------------------


def test_render_file_writes_dot_without_the_dot_program(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "mimi.dot"
    render_file(MIMI, {}, "graph", out)
    assert out.read_text(encoding="utf-8") == golden_path("mimi_decoder", "graph").read_text(encoding="utf-8")
    with pytest.raises(DotMissing, match="apt-get install graphviz"):
        render_file(MIMI, {}, "graph", tmp_path / "mimi.svg")


def test_cli_format_dot_needs_no_dot_program(tmp_path, monkeypatch, capsysbinary):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["render", str(MIMI), "--output-format", "dot"]) == 0
    assert capsysbinary.readouterr().out.decode("utf-8") == golden_path("mimi_decoder", "timeline").read_text(
        encoding="utf-8"
    )
    out = tmp_path / "arena.gv"
    assert main(["render", str(QWEN), "--view", "arena", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == golden_path("qwen3_omni_code2wav", "arena").read_text(encoding="utf-8")


def test_cli_says_how_to_install_dot(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "mimi.svg"
    assert main(["render", str(MIMI), "-o", str(out)]) == 2
    error = capsys.readouterr().err
    assert "apt-get install graphviz" in error and "brew install graphviz" in error and "--output-format dot" in error
    assert "Traceback" not in error and not out.exists()


@needs_dot
def test_cli_writes_svg(tmp_path, capsys):
    out = tmp_path / "qwen.svg"
    assert main(["render", str(QWEN), "--view", "graph", "-o", str(out)]) == 0
    assert out.read_bytes().lstrip().startswith(b"<?xml") and b"<svg" in out.read_bytes()


@pytest.mark.parametrize(
    "arguments, code, says",
    [
        (["--param", "nonsense"], 2, "nonsense"),
        (["--param", "no_such_param=3"], 1, "no_such_param"),
        (["-o", "out.txt"], 2, "cannot tell the format"),
        (["-o", "out.svg", "--output-format", "png"], 2, "--output-format is png"),
    ],
)
def test_cli_exit_codes(arguments, code, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["render", str(QWEN), *arguments]) == code
    assert says in capsys.readouterr().err


def test_cli_bad_file_reports_diagnostics(tmp_path, capsys):
    bad = tmp_path / "bad.clock"
    bad.write_text("cadence 1 s\nclock frame = 12.5 Hz\nregion x : f32[1, time] on nowhere retain last 2\n")
    assert main(["render", str(bad), "--output-format", "dot"]) == 1
    error = capsys.readouterr().err
    assert "nowhere" in error and "bad.clock:3" in error
    assert main(["render", str(tmp_path / "missing.clock")]) == 1


@pytest.mark.parametrize("arguments", [["--view", "nope"], ["--ticks", "0"], ["--output-format", "jpg"]])
def test_cli_usage_errors_exit_2(arguments, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["render", str(QWEN), *arguments])
    assert stopped.value.code == 2


def test_cli_params_reach_the_plan(capsysbinary):
    assert main(["render", str(STEP_AUDIO2), "--param", "steps=5", "--view", "graph", "--output-format", "dot"]) == 0
    assert "steps=5" in capsysbinary.readouterr().out.decode("utf-8")


# --- the registry: a view is one module and one line in VIEWS -----------------------------------


def test_list_views_prints_the_registry(capsys):
    assert main(["render", "--list-views"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(VIEWS)
    for line, view in zip(lines, VIEWS.values()):
        assert line.endswith("  " + view.summary)


def test_render_md_lists_the_registered_views(capsys):
    """docs/render.md shows `dsl render --list-views` as it prints."""
    assert main(["render", "--list-views"]) == 0
    listing = capsys.readouterr().out
    assert "```text\n" + listing + "```" in (ROOT / "docs" / "render.md").read_text(encoding="utf-8")


def test_a_registered_view_is_a_choice_everywhere(monkeypatch, capsysbinary):
    def draw(plan, options):
        graph = graphviz.Digraph("regions")
        for name in sorted(plan.program.regions):
            graph.node(name)
        return graph

    monkeypatch.setitem(VIEWS, "regions", View("regions", "one node per region", draw))
    assert main(["render", "--list-views"]) == 0
    assert capsysbinary.readouterr().out.decode("utf-8").splitlines()[-1] == "regions   one node per region"
    assert main(["render", str(QWEN), "--view", "regions", "--output-format", "dot"]) == 0
    assert "codes" in capsysbinary.readouterr().out.decode("utf-8")
    assert render_plan(plan_file(QWEN), "regions").name == "regions"


def test_render_without_a_file_says_what_to_give(capsys):
    assert main(["render"]) == 2
    assert capsys.readouterr().err == (
        "dsl render: error: name the .clock FILE to draw\n  help: dsl render --list-views lists the views\n"
    )


def test_legend_text_wraps_after_separators():
    text = "keys[0..7] update 1×16×0×64, values[0..7] update 1×16×0×64, frame_50hz update 1×1536×0"
    assert wrap(text, 40).split("<BR/>") == [
        "keys[0..7] update 1×16×0×64,",
        "values[0..7] update 1×16×0×64,",
        "frame_50hz update 1×1536×0",
    ]
    assert wrap("1 firing, warm-up only · over the graph budget: eager", 32).split("<BR/>") == [
        "1 firing, warm-up only ·",
        "over the graph budget: eager",
    ]
    assert wrap("a <b> & c", 80) == "a &lt;b&gt; &amp; c"


def test_unit_view_draws_a_conversations_unit_up_to_each_bound(plans):
    unit = build_unit(plans["minicpmo45_duplex"])
    assert unit.stages == ("listen", "llm_step", "tts_prefill", "tts_step", "flow", "hift_front", "hift_back")
    assert unit.batched == {"listen", "llm_step", "tts_step"}
    assert [(f.stage, f.slot, f.burst, f.graph is None) for f in unit.firings] == [
        ("listen", 0, None, False),
        ("llm_step", 1, 21, False),
        ("tts_prefill", 22, None, True),  # `update tts_kv up to 19`: shapes decided at run time, eager
        ("tts_step", 23, 25, False),
        ("flow", 48, None, False),
        ("hift_front", 49, None, False),
        ("hift_back", 50, None, False),
    ]
    assert unit.slots == 51 and unit.first_instant == 2
    mimi = build_unit(plans["mimi_decoder"])
    assert len(mimi.firings) == 3 * 13 and mimi.slots == 39  # 12.5 frames a second: 13 in the first steady second
