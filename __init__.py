"""DuplexCadence: declare a streaming model's native clocks, derive state sizes and CUDA-graph plans.

The distribution installs one import namespace, ``duplexcadence``:

- ``duplexcadence.dsl``: the ``.clock`` language (parse, check, dependency graph, render, CLI).
- ``duplexcadence.interpreter``: plans derived from a checked program (clocks, shape trace,
  allocation schedule, arena, capture plan) and the runtime that executes them against PyTorch modules.
- ``duplexcadence.examples``: the released model tails bound to their ``.clock`` files.
"""

__version__ = "0.1.0"
