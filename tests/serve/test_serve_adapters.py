"""Every registered tail that declares a serving adapter gives a `ServedTail` of its name whose inputs are the
tail's input regions (names, dtypes, one session's shape at its first tick); building it builds no model."""

from __future__ import annotations

import pytest

import duplexcadence
from duplexcadence.interpreter import tails
from duplexcadence.interpreter.serve import codec
from duplexcadence.interpreter.serve.tail import ServedTail

SERVED = [name for name in tails.available() if tails.get(name).serve is not None]


def test_the_released_tails_and_the_toy_declare_an_adapter():
    assert {"toy", "moshi", "minicpmo45"} <= set(SERVED)


@pytest.mark.parametrize("name", SERVED)
def test_an_adapter_serves_its_tail_s_inputs(name):
    tail = tails.get(name)
    if tail.missing():
        pytest.skip(f"needs {', '.join(tail.missing())}")
    served = tail.serve(device="cpu")
    assert isinstance(served, ServedTail) and served.name == name and served.stock is not None
    program = duplexcadence.load_program(str(tail.clock_path()), {})
    plan = duplexcadence.make_plan(program)
    first = {v.region: tuple(v.shape) for f in plan.trace.by_instant()[0] for v in f.views if v.kind == "feed"}
    inputs = served.inputs(3, 0)
    assert {name: (codec.DTYPE_NAMES[t.dtype], tuple(t.shape)) for name, t in inputs.items()} == {
        region: (program.regions[region].dtype, shape) for region, shape in first.items()
    }
    again = served.inputs(3, 0)
    assert all(a.equal(b) for a, b in zip(inputs.values(), again.values()))  # a session's stream is reproducible
