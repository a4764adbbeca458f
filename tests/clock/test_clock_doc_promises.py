"""Promises of docs/language.md that the tutorial found `dsl check` not keeping (now kept): a write's
advance is checked into an output too, and a family's mistake is reported once."""

from __future__ import annotations

import textwrap

from duplexcadence.dsl.frontend import check_file

HEADER = """\
cadence 1 s
clock frame = 12.5 Hz
clock sample = frame * 8
region codes : i64[1, time] on frame input
"""


def codes(text: str) -> list[tuple[str, int]]:
    result = check_file("prog.clock", {}, text=HEADER + textwrap.dedent(text))
    return [(d.code.name, d.span.line if d.span else 0) for d in result.diagnostics]


def test_a_write_must_advance_the_units_per_firing_even_into_an_output():
    """language.md 5.2: "A write or update must advance exactly the units per firing". `pcm` is on a
    clock 8 times faster than the stage's, so `write pcm +1` is `rate-inconsistent`."""
    found = codes("""\
        region pcm : f32[1, time] on sample output
        stage speak on frame {
            module "head"
            read codes
            write pcm +1
        }
        """)
    assert found == [("rate-inconsistent", 9)]


def test_a_mistake_in_a_family_is_reported_once():
    """language.md 5.6: "A mistake in a family (`update kv +3` on 8 members) is reported once for the
    family." `update kv +3` is; `update kv` without its advance is reported for each member."""
    found = codes("""\
        region kv[layer < 4] : f32[1, time] on frame retain last 2 bind "layers.{layer}.kv"
        stage s on frame {
            module "s"
            read codes
            update kv
        }
        """)
    assert found == [("rate-inconsistent", 9)]
