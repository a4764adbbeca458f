"""A program whose counts are decided at run time (a bounded clock, `rows`, a `slide`) is a conversation
engine's: `Runtime.load` refuses it, located, before binding anything."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import duplexcadence as dc  # noqa: E402
from duplexcadence.dsl.diagnostics import ClockError  # noqa: E402

UNIT = """cadence 1 s
clock unit = 1 Hz
clock token = up to 4 per unit
region kv : f32[2, time] on token retain slide 8 to 4
region text : i64[1, time] on token output
stage decode on token {
    hook decode
    update kv +1
    write text +1
}
"""


@pytest.mark.parametrize(
    ("change", "code", "where"),
    [
        ((), "bad-bound", "stage 'decode' is on a bounded clock"),
        ((("clock token = up to 4 per unit", "clock token = 4 Hz"),), "bad-slide", "region 'kv' keeps a slide"),
    ],
)
def test_load_refuses_counts_decided_at_run_time(tmp_path, change, code, where):
    text = UNIT
    for old, new in change:
        text = text.replace(old, new)
    path = tmp_path / "unit.clock"
    path.write_text(text)
    with pytest.raises(ClockError) as error:
        dc.Runtime.load(path, torch.nn.Module(), hooks={"decode": lambda kv: (kv, None)})
    [diagnostic] = error.value.diagnostics
    assert diagnostic.code.name == code and diagnostic.message.startswith(where)
    assert diagnostic.span is not None
