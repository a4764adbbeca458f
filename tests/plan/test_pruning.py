"""Pruning (interpreter/plans/prune.py): the stages no output sees, the regions only they touch, and why.

A corpus of small programs, each with the exact stages pruned (and their reasons), the regions left out
and the unobserved stages kept.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import attrs
import pytest

from duplexcadence.dsl.frontend import load_program
from duplexcadence.interpreter.plans.plan import make_plan
from duplexcadence.interpreter.plans.prune import NO_OUTPUT, prune_unobserved

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
