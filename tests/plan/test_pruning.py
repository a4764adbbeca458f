"""Pruning (interpreter/plans/prune.py): the stages no output sees, the regions only they touch, and why.

A corpus of small programs, each with the exact stages pruned (and their reasons), the regions left out
and the unobserved stages kept; then what pruning changes in a plan (PersonaPlex's two instances: bytes,
graphs, firings), `dsl plan` text and JSON, and `--no-prune`.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import attrs
import pytest

from duplexcadence.dsl.frontend import load_program
from duplexcadence.interpreter.cli.main import main as dsl
from duplexcadence.interpreter.plans.plan import make_plan, plan_file, to_json
from duplexcadence.interpreter.plans.plan_text import format_plan
from duplexcadence.interpreter.plans.prune import NO_OUTPUT, prune_unobserved

STDLIB = Path(__file__).resolve().parents[2] / "stdlib" / "models"

HEADER = """
cadence 1 s
clock tick = 10 Hz
region x : f32[1, time] on tick input
region y : f32[1, time] on tick output
"""


@attrs.frozen
class Case:
    name: str
    body: str
    pruned: tuple[tuple[str, str], ...] = ()
    regions: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()  # unobserved stages kept (rng)
    note: str | None = None


CASES = (
    Case(
        "every stage feeds the output",
        """
        region h : f32[1, time] on tick retain scratch
        stage a on tick { hook f; read x new; write h +1 }
        stage b on tick { hook f; read h; write y +1 }
        """,
    ),
    Case(
        "a side branch nothing reads, with its own state",
        """
        region h : f32[1, time] on tick retain scratch
        region carry : f32[1, time] on tick retain last 2 start zeros
        region dead : f32[1, time] on tick retain scratch
        stage main on tick { hook f; read x new; write y +1; write h +1 }
        stage side on tick { hook f; read h; update carry +1; write dead +1 }
        """,
        pruned=(("side", "no output, and no other stage reads what it writes"),),
        regions=("carry", "dead"),
    ),
    Case(
        "a chain of unobserved stages (the fixpoint)",
        """
        region h : f32[1, time] on tick retain scratch
        region m : f32[1, time] on tick retain scratch
        region n : f32[1, time] on tick retain scratch
        region dead : f32[1, time] on tick retain scratch
        stage main on tick { hook f; read x new; write y +1; write h +1 }
        stage s1 on tick { hook f; read h; write m +1 }
        stage s2 on tick { hook f; read m; write n +1 }
        stage s3 on tick { hook f; read n; read m; write dead +1 }
        """,
        pruned=(
            ("s1", "no output, and only unobserved stages 's2', 's3' read what it writes"),
            ("s2", "no output, and only unobserved stage 's3' reads what it writes"),
            ("s3", "no output, and no other stage reads what it writes"),
        ),
        regions=("m", "n", "dead"),
    ),
    Case(
        "state a kept stage reads keeps its writer",
        """
        region position : i64[1] start zeros
        region dead : f32[1, time] on tick retain scratch
        stage count on tick { hook f; update position; write dead +1 }
        stage main on tick { hook f; read x new; read position; write y +1 }
        """,
    ),
    Case(
        "a counter another stage only updates keeps its writers (a kept stage reads the update)",
        """
        region position : i64[1] start zeros
        stage main on tick { hook f; read x new; update position; write y +1 }
        stage other on tick { hook f; update position }
        """,
    ),
    Case(
        "a `read prev` is a read",
        """
        region h : f32[1, time] on tick retain last 1 start zeros
        stage main on tick { hook f; read x new; read prev h; write y +1 }
        stage later on tick { hook f; read y; update h +1 }
        """,
    ),
    Case(
        "a stage that writes nothing",
        """
        stage main on tick { hook f; read x new; write y +1 }
        stage watch on tick { hook f; read y }
        """,
        pruned=(("watch", "writes no region"),),
    ),
    Case(
        "an input only pruned stages read",
        """
        region z : f32[1, time] on tick input
        region dead : f32[1, time] on tick retain scratch
        stage main on tick { hook f; read x new; write y +1 }
        stage side on tick { hook f; read z new; write dead +1 }
        """,
        pruned=(("side", "no output, and no other stage reads what it writes"),),
        regions=("z", "dead"),
    ),
    Case(
        "an unobserved stage that draws random numbers is kept while a kept stage draws",
        """
        region noise : f32[1, time] on tick retain scratch
        region h : f32[1, time] on tick retain scratch
        region g : f32[1, time] on tick retain scratch
        stage main on tick { hook f; read x new; write y +1; write h +1; rng }
        stage feed on tick { hook f; read h; write g +1 }
        stage side on tick { hook f; read g; write noise +1; rng }
        """,
        kept=("side",),
    ),
    Case(
        "unobserved stages that draw are pruned when no kept stage draws",
        """
        region noise : f32[1, time] on tick retain scratch
        stage main on tick { hook f; read x new; write y +1 }
        stage side on tick { hook f; read y; write noise +1; rng }
        """,
        pruned=(
            (
                "side",
                "no output, and no other stage reads what it writes; it draws random numbers, and no kept stage does",
            ),
        ),
        regions=("noise",),
    ),
    Case(
        "part of a family",
        """
        region kv[layer < 2] : f32[1, time] on tick retain last 2 start zeros bind "kv.{layer}"
        stage main on tick { hook f; read x new; update kv[0] +1; write y +1 }
        stage side on tick { hook f; update kv[1] +1 }
        """,
        pruned=(("side", "no output, and no other stage reads what it writes"),),
        regions=("kv[1]",),
    ),
)


def _program(tmp_path: Path, body: str, header: str = HEADER):
    path = tmp_path / "case.clock"
    path.write_text(textwrap.dedent(header) + textwrap.dedent(body))
    return load_program(path)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_pruning_corpus(case: Case, tmp_path: Path) -> None:
    program = _program(tmp_path, case.body)
    pruning = prune_unobserved(program)
    assert tuple((stage.name, stage.reason) for stage in pruning.stages) == case.pruned
    assert pruning.unobserved == pruning.stages
    assert tuple(region.name for region in pruning.regions) == case.regions
    assert tuple(stage.name for stage in pruning.kept) == case.kept
    assert pruning.note == case.note
    assert set(pruning.program.stages) == set(program.stages) - {name for name, _ in case.pruned}
    assert set(pruning.program.regions) == set(program.regions) - set(case.regions)
    plan = make_plan(program)  # the pruned program plans: no pass meets a region or stage it lost
    assert set(plan.clocks.stage_order) == set(pruning.program.stages)
    assert set(plan.schedule.regions) == set(pruning.program.regions)
    assert {firing.stage for firing in plan.trace.firings} <= set(pruning.program.stages)


def test_an_rng_stage_kept_for_the_generator_says_why_and_keeps_what_it_reads(tmp_path: Path) -> None:
    case = next(case for case in CASES if case.kept)
    pruning = prune_unobserved(_program(tmp_path, case.body))
    [kept] = pruning.kept
    assert kept.reason == (
        "no output sees it, but it draws random numbers, as kept stage 'main' does: the session's stages "
        "share one generator state, so leaving it out would change their numbers"
    )
    assert "feed" in pruning.program.stages  # what the kept rng stage reads runs too


def test_a_program_without_outputs_prunes_nothing(tmp_path: Path) -> None:
    program = _program(
        tmp_path,
        """
        region carry : f32[1, time] on tick retain last 2 start zeros
        stage side on tick { hook f; read x new; update carry +1 }
        """,
        header="cadence 1 s\nclock tick = 10 Hz\nregion x : f32[1, time] on tick input\n",
    )
    pruning = prune_unobserved(program)
    assert (pruning.unobserved, pruning.stages, pruning.regions, pruning.note) == ((), (), (), NO_OUTPUT)
    assert pruning.program is program


def test_pruning_off_lists_the_unobserved_stages_and_plans_them_all(tmp_path: Path) -> None:
    case = CASES[2]
    program = _program(tmp_path, case.body)
    pruning = prune_unobserved(program, enabled=False)
    assert tuple((s.name, s.reason) for s in pruning.unobserved) == case.pruned
    assert (pruning.stages, pruning.regions, pruning.program) == ((), (), program)
    assert set(make_plan(program, prune=False).clocks.stage_order) == set(program.stages)


def test_pruning_is_a_fixpoint(tmp_path: Path) -> None:
    for case in CASES:
        once = prune_unobserved(_program(tmp_path, case.body))
        twice = prune_unobserved(once.program)
        assert (twice.stages, twice.regions) == ((), ()), case.name


# --- PersonaPlex: the server's two instances, other_mimi unobserved -------------------------------


@pytest.fixture(scope="module")
def personaplex():
    path = STDLIB / "personaplex_mimi_decoder.clock"
    return plan_file(path), plan_file(path, prune=False)


OTHER_STAGES = (
    ("other_upsample", "no output, and only unobserved stage 'other_transformer' reads what it writes"),
    ("other_transformer", "no output, and only unobserved stage 'other_seanet' reads what it writes"),
    ("other_seanet", "no output, and no other stage reads what it writes"),
)


def test_personaplex_prunes_other_mimi(personaplex) -> None:
    pruned, everything = personaplex
    assert tuple((s.name, s.reason) for s in pruned.pruning.stages) == OTHER_STAGES
    assert pruned.clocks.stage_order == ("audio_tokens", "mimi_upsample", "mimi_transformer", "mimi_seanet")
    assert everything.clocks.stage_order == (
        "audio_tokens",
        "mimi_upsample",
        "mimi_transformer",
        "mimi_seanet",
        "other_upsample",
        "other_transformer",
        "other_seanet",
    )
    left_out = {r.name for r in pruned.pruning.regions}
    assert left_out == {name for name in everything.program.regions if name.startswith("other_")}
    assert len(left_out) == 39 and "other_pcm" in left_out
    assert all(set(r.stages) <= {name for name, _ in OTHER_STAGES} for r in pruned.pruning.regions)


def test_personaplex_plan_numbers_with_and_without_pruning(personaplex) -> None:
    pruned, everything = personaplex
    # one instance's state: 8 KV rings of 1000 KiB, 10 carries, 17 counters (each aligned to 512 B)
    assert (pruned.arena.session_bytes, pruned.arena.scratch_bytes) == (8_251_392, 11_776)
    assert (everything.arena.session_bytes, everything.arena.scratch_bytes) == (16_502_784, 19_456)
    assert (pruned.schedule.demand_bytes, everything.schedule.demand_bytes) == (8_258_824, 16_517_520)
    # graphs: audio_tokens 1, each instance's upsample 2, transformer 1, seanet 2
    assert (len(pruned.capture.graphs), len(everything.capture.graphs)) == (6, 11)
    # firings in the warm-up (125 frames) and one steady period (25): 4 stages, or 7
    assert (len(pruned.trace.firings), len(everything.trace.firings)) == (150 * 4, 150 * 7)
    assert pruned.trace.warmup_instants == everything.trace.warmup_instants == 125
    # the kept instance's numbers do not change
    for name, region in pruned.schedule.regions.items():
        assert everything.schedule.regions[name].bytes == region.bytes, name


def test_dsl_plan_text_lists_the_pruned_stages(personaplex) -> None:
    pruned, everything = personaplex
    text = format_plan(pruned)
    section = text[text.index("Pruned") : text.index("Warm-up and steady state")]
    assert section.splitlines() == [
        "Pruned (no output sees their work; --no-prune runs them)",
        "  stage              why",
        "  -----------------  -----------------------------------------------------------------------------",
        "  other_upsample     no output, and only unobserved stage 'other_transformer' reads what it writes",
        "  other_transformer  no output, and only unobserved stage 'other_seanet' reads what it writes",
        "  other_seanet       no output, and no other stage reads what it writes",
        "  39 regions left out (only pruned stages touch them): other_pcm; other_upsample_partial;",
        "    other_embedded; other_kv[0..7]; other_kv_end[0..7]; other_rope_offset[0..7];",
        "    other_transformer_offset; other_latent_out; other_conv_in; other_up8; other_res8; other_up6;",
        "    other_res6; other_up5; other_res5; other_up4; other_res4; other_conv_out",
        "",
    ]
    off = format_plan(everything)
    assert "Pruned" not in off
    assert "Unobserved (no output sees their work; they run: pruning is off)" in off
    assert "  other_seanet       no output, and no other stage reads what it writes" in off
    assert "Pruned" not in format_plan(plan_file(STDLIB / "mimi_decoder.clock"))


def test_dsl_plan_json_has_the_pruning(personaplex) -> None:
    pruned, everything = personaplex
    data = to_json(pruned)["pruning"]
    assert data["enabled"] is True and data["note"] is None and data["kept"] == []
    assert [(s["stage"], s["reason"]) for s in data["stages"]] == list(OTHER_STAGES)
    assert data["unobserved"] == data["stages"]
    assert data["regions"][0] == {
        "region": "other_pcm",
        "stages": ["other_seanet"],
        "input": False,
        "reason": "touched only by pruned stage 'other_seanet'",
    }
    assert data["regions"][2]["reason"] == "touched only by pruned stages 'other_transformer', 'other_upsample'"
    assert "other_kv[0]" not in to_json(pruned)["regions"]
    off = to_json(everything)["pruning"]
    assert off["enabled"] is False and off["stages"] == [] and off["regions"] == []
    assert [s["stage"] for s in off["unobserved"]] == [name for name, _ in OTHER_STAGES]
    assert "other_kv[0]" in to_json(everything)["regions"]


def test_cli_no_prune(capsys) -> None:
    assert dsl(["plan", "models.personaplex_mimi_decoder", "--output-format", "json"]) == 0
    pruned = json.loads(capsys.readouterr().out)
    assert dsl(["plan", "models.personaplex_mimi_decoder", "--output-format", "json", "--no-prune"]) == 0
    everything = json.loads(capsys.readouterr().out)
    assert (pruned["arena"]["session_bytes"], everything["arena"]["session_bytes"]) == (8_251_392, 16_502_784)
    assert (len(pruned["capture"]["graphs"]), len(everything["capture"]["graphs"])) == (6, 11)
