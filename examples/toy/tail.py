"""The toy tail's registration (`duplexcadence.tails.toy`)."""

from duplexcadence.interpreter.tails import Tail

TAIL = Tail(
    name="toy",
    summary="a small streaming tail with the state handling of the real ones (tests, docs/runtime.md)",
    package="duplexcadence.examples.toy",
    clock="toy.clock",
    upstream=(),
    build_model="duplexcadence.examples.toy.model:build_toy",
    stock_loop="duplexcadence.examples.toy.model:ToyStockStream",
    load_runtime="duplexcadence.examples.toy.cadence:load_runtime",
    subject="duplexcadence.examples.toy.bench:subject",
    serve="duplexcadence.examples.toy.serve:served",
)
