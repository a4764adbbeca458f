"""Hover on a pruned stage or region says it is pruned and why (it has no firings, graphs or bytes)."""

from __future__ import annotations

from duplexcadence.interpreter.lsp.analysis import analyse, hover_text

TEXT = """cadence 1 s
clock tick = 10 Hz
region x : f32[1, time] on tick input
region y : f32[1, time] on tick output
region h : f32[1, time] on tick retain scratch
region dead : f32[1, time] on tick retain scratch
stage main on tick { hook f; read x new; write y +1; write h +1 }
stage side on tick { hook f; read h; write dead +1 }
"""


def test_hover_on_a_pruned_stage_and_region(tmp_path):
    path = tmp_path / "side.clock"
    path.write_text(TEXT)
    analysis = analyse(str(path), TEXT)
    stage = hover_text(analysis, "side")
    assert stage is not None and stage.splitlines()[1] == (
        "- pruned: no output, and no other stage reads what it writes; it never fires (`dsl plan --no-prune` keeps it)"
    )
    region = hover_text(analysis, "dead")
    assert region is not None and region.splitlines()[-1] == (
        "- pruned: touched only by pruned stage 'side'; no bytes (`dsl plan --no-prune` keeps it)"
    )
    assert "fires 10 times per cadence" in (hover_text(analysis, "main") or "")
